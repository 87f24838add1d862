"""The servers' API key: with one set, every route but GET /health answers 401 without it (models,
chat, completions, tokenize, detokenize, sessions, episode hand-outs and rewards), the real `openai`
client with it is served; a training server serves sessions only unless asked; the run's own agent
workers send the key; a training server beyond this machine needs one, from its key or the
environment, and the key is never written to config.yml."""

import httpx
import openai
import pytest

from maxtext.configs import config_yml
from maxtext.rl.episode_handouts import EpisodeHandouts
from maxtext.utils import agent_runner
from maxtext.utils.errors import ConfigError
from tests.conftest import make_config
from tests.unit.test_openai_server import scripted_server

KEY = "s3cret-key"
ASK = {"model": "m", "messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 2}


@pytest.fixture
def guarded(qwen3_tokenizer):
  server = scripted_server(qwen3_tokenizer, api_key=KEY, sessionless=False)
  handouts = EpisodeHandouts(server, "m")
  base = server.start("127.0.0.1", 0).removesuffix("/v1")
  yield server, handouts, base
  handouts.close()
  server.stop()


def _routes(base: str, session: str) -> list[tuple[str, str, dict | None]]:
  s = f"{base}/sessions/{session}"
  return [
    ("GET", f"{s}/v1/models", None),
    ("POST", f"{s}/v1/chat/completions", ASK),
    ("POST", f"{s}/v1/completions", {"model": "m", "prompt": "2+3=", "max_tokens": 2}),
    ("POST", f"{s}/tokenize", {"prompt": "2+3"}),
    ("POST", f"{s}/detokenize", {"tokens": [17]}),
    ("POST", f"{base}/episodes/next", {"wait_s": 0}),
    ("POST", f"{s}/reward", {"reward": 1.0}),
    ("POST", f"{base}/v1/chat/completions", ASK),
  ]


def test_every_route_but_health_needs_the_key(guarded):
  server, _, base = guarded
  session = server.open_session()
  for method, url, body in _routes(base, session):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
      r = httpx.request(method, url, json=body, headers=headers, timeout=30)
      assert r.status_code == 401, (url, headers, r.text)
      assert r.json()["error"]["type"] == "AuthenticationError"
  assert httpx.get(f"{base}/health", timeout=30).json() == {"status": "ok"}


def test_with_the_key_sessions_are_served_and_the_session_less_routes_are_off(guarded):
  server, handouts, base = guarded
  session = server.open_session()
  client = openai.OpenAI(base_url=f"{base}/sessions/{session}/v1", api_key=KEY, max_retries=0)
  assert client.chat.completions.create(**ASK).choices[0].message.content == "5"
  assert [m.id for m in client.models.list()] == ["m"]
  plain = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
  with pytest.raises(openai.NotFoundError, match="serves sessions only"):
    plain.chat.completions.create(**ASK)
  with_key = {"Authorization": f"Bearer {KEY}"}
  assert httpx.post(f"{base}/episodes/next", json={"wait_s": 0}, headers=with_key, timeout=30).status_code == 204


def test_the_run_s_own_agent_worker_sends_the_key(guarded, tmp_path):
  server, handouts, base = guarded
  (tmp_path / "agent.py").write_text(
    "async def solve(client, model, example):\n"
    "  reply = await client.chat.completions.create(model=model, messages=example['messages'])\n"
    "  return float(reply.choices[0].message.content == '5')\n"
  )
  session = server.open_session()
  reward = handouts.hand_out(session, {"messages": ASK["messages"]}, 30.0, "rl.agent_timeout_s=30")
  take = handouts.claim(session, base)
  agent_runner.episode_runner(str(tmp_path / "agent.py"), "solve", KEY)(take, 30.0)
  assert reward.result(timeout=5).reward == 1.0
  without = handouts.hand_out(other := server.open_session(), {"messages": ASK["messages"]}, 30.0, "limit")
  with pytest.raises(openai.AuthenticationError):
    agent_runner.episode_runner(str(tmp_path / "agent.py"), "solve")(handouts.claim(other, base), 30.0)
  assert not without.done()


def test_a_training_server_beyond_this_machine_needs_a_key_which_config_yml_never_holds(monkeypatch):
  agent = ["rl.use_agentic_rollout=true", "rl.agent=http", "rl.agent_host=0.0.0.0"]
  monkeypatch.delenv("MAXTEXT_AGENT_API_KEY", raising=False)
  with pytest.raises(ConfigError, match="rl.agent_host='0.0.0.0' without rl.agent_api_key"):
    make_config(*agent).check()
  cfg = make_config(*agent, f"rl.agent_api_key={KEY}").check()
  written = config_yml.written_values(cfg)
  assert written["rl.agent_api_key"] == "" and KEY not in repr(written)
  monkeypatch.setenv("MAXTEXT_AGENT_API_KEY", KEY)
  make_config(*agent).check()  # the environment's key
