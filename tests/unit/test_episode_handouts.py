"""Episodes handed to a process over HTTP (rl.agent=http, rl/episode_handouts.py): the process takes
one, talks to its session with the real `openai` client and posts the reward; errors, time limits,
unknown sessions and the end of training, on a server whose batcher answers with a scripted reply."""

import concurrent.futures
import logging
import time

import httpx
import openai
import pytest

from maxtext.inference.openai_server import OpenAIServer
from maxtext.inference.step_keys import StepKeys
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.rl.episode_handouts import EpisodeFailed, EpisodeHandouts, Posted
from tests.unit.test_openai_server import _ScriptedBatcher

EXAMPLE = {"question": "What is 2 + 3?", "answer": "5", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}


@pytest.fixture
def handouts(qwen3_tokenizer):
  server = OpenAIServer(
    _ScriptedBatcher(qwen3_tokenizer, "5"), qwen3_tokenizer, ConfigChatParser(qwen3_tokenizer, ""), "m", StepKeys(0)
  )
  handouts = EpisodeHandouts(server, "m")
  url = server.start("127.0.0.1", 0)
  yield server, handouts, url.removesuffix("/v1")
  handouts.close()
  server.stop()


def _take(base: str, wait_s: float = 5.0) -> httpx.Response:
  return httpx.post(f"{base}/episodes/next", json={"wait_s": wait_s}, timeout=30)


def test_a_process_takes_an_episode_talks_to_its_session_and_posts_the_reward(handouts):
  server, episodes, base = handouts
  session = server.open_session()
  reward = episodes.hand_out(session, EXAMPLE, 30.0, "rl.agent_timeout_s=30")
  taken = _take(base).json()
  assert taken["session"] == session and taken["model"] == "m" and taken["example"] == EXAMPLE
  assert taken["base_url"] == f"{base}/sessions/{session}/v1"
  client = openai.OpenAI(base_url=taken["base_url"], api_key="x", max_retries=0)
  reply = client.chat.completions.create(model=taken["model"], messages=taken["example"]["messages"])
  assert reply.choices[0].message.content == "5"
  (call,) = server.session(session).calls  # the call is the session's
  assert call.finish_reason == "stop"
  assert not reward.done()
  posted = httpx.post(f"{base}/sessions/{session}/reward", json={"reward": 0.75}, timeout=30)
  assert posted.status_code == 200 and reward.result(timeout=5) == Posted(0.75)
  again = httpx.post(f"{base}/sessions/{session}/reward", json={"reward": 1.0}, timeout=30)
  assert again.status_code == 410 and "has ended" in again.json()["error"]["message"]
  unknown = httpx.post(f"{base}/sessions/nosuch/reward", json={"reward": 1.0}, timeout=30)
  assert unknown.status_code == 404 and "not an episode taken" in unknown.json()["error"]["message"]


def test_fields_posted_with_the_reward_are_the_reward_functions_and_must_be_an_object(handouts):
  server, episodes, base = handouts
  session = server.open_session()
  posted = episodes.hand_out(session, EXAMPLE, 30.0, "limit")
  assert _take(base).json()["session"] == session
  url = f"{base}/sessions/{session}/reward"
  refused = httpx.post(url, json={"reward": None, "fields": [0.5]}, timeout=30)
  assert refused.status_code == 400 and "fields" in refused.json()["error"]["message"]
  body = {"reward": None, "fields": {"env_reward": 0.5, "task": "t"}}
  assert httpx.post(url, json=body, timeout=30).status_code == 200
  assert posted.result(timeout=5) == Posted(None, {"env_reward": 0.5, "task": "t"})


def test_no_reward_lets_the_reward_functions_judge_and_episodes_go_in_arrival_order(handouts):
  server, episodes, base = handouts
  first, second = server.open_session(), server.open_session()
  futures = [episodes.hand_out(s, {"n": i}, 30.0, "limit") for i, s in enumerate((first, second))]
  assert [_take(base).json()["example"]["n"] for _ in range(2)] == [0, 1]
  assert httpx.post(f"{base}/sessions/{second}/reward", json={}, timeout=30).status_code == 200
  assert httpx.post(f"{base}/sessions/{first}/reward", json={"reward": None}, timeout=30).status_code == 200
  assert [f.result(timeout=5) for f in futures] == [Posted(None)] * 2


def test_an_error_posted_or_no_reward_in_time_fails_the_episode(handouts):
  server, episodes, base = handouts
  failing, silent = server.open_session(), server.open_session()
  failed = episodes.hand_out(failing, {}, 30.0, "rl.agent_timeout_s=30")
  timed_out = episodes.hand_out(silent, {}, 0.5, "rl.agent_timeout_s=0.5")
  time.sleep(1.0)  # waiting to be taken does not count against the time limit
  assert not timed_out.done()
  _take(base), _take(base)
  httpx.post(f"{base}/sessions/{failing}/reward", json={"error": "the sandbox crashed"}, timeout=30)
  with pytest.raises(EpisodeFailed, match="its process posted an error: the sandbox crashed"):
    failed.result(timeout=5)
  with pytest.raises(EpisodeFailed, match=r"no reward posted within rl.agent_timeout_s=0.5 s of taking the episode"):
    timed_out.result(timeout=5)
  late = httpx.post(f"{base}/sessions/{silent}/reward", json={"reward": 1.0}, timeout=30)
  assert late.status_code == 410 and late.json()["error"]["type"] == "GoneError"


def test_bad_rewards_are_refused_and_nothing_waiting_answers_204(handouts):
  server, episodes, base = handouts
  started = time.monotonic()
  assert _take(base, wait_s=0.3).status_code == 204 and time.monotonic() - started >= 0.3
  assert _take(base, wait_s=61).status_code == 400  # at most 60 s
  session = server.open_session()
  reward = episodes.hand_out(session, {}, 30.0, "limit")
  _take(base)
  for bad in ('{"reward": "high"}', '{"reward": NaN}', "{not json"):
    answer = httpx.post(
      f"{base}/sessions/{session}/reward", content=bad, headers={"content-type": "application/json"}, timeout=30
    )
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "BadRequestError", bad
  assert not reward.done()  # still open: a good post ends it
  assert httpx.post(f"{base}/sessions/{session}/reward", json={"reward": 2}, timeout=30).status_code == 200
  assert reward.result(timeout=5) == Posted(2.0)


def test_when_training_ends_episodes_are_cancelled_and_waiting_processes_told(handouts):
  server, episodes, base = handouts
  session = server.open_session()
  in_flight = episodes.hand_out(session, {}, 30.0, "limit")
  _take(base)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    asking = pool.submit(_take, base, 5.0)  # a process waiting for an episode when training ends
    time.sleep(0.3)
    episodes.close()
    gone = asking.result(timeout=30)
  assert gone.status_code == 410 and gone.json()["error"]["message"] == "training has ended: no more episodes"
  assert in_flight.cancelled()
  assert httpx.post(f"{base}/sessions/{session}/reward", json={"reward": 1}, timeout=30).status_code == 410
  assert episodes.hand_out(server.open_session(), {}, 30.0, "limit").cancelled()


def test_a_reward_for_an_episode_cancelled_while_taken_is_410_and_its_timer_raises_nothing(handouts):
  """The episode's task was cancelled (its future with it) after a process took it: the late reward is
  a 410 with an error body, and its time limit passing later raises in no thread."""
  server, episodes, base = handouts
  session = server.open_session()
  reward = episodes.hand_out(session, {}, 0.5, "rl.agent_timeout_s=0.5")
  _take(base)
  assert reward.cancel()
  late = httpx.post(f"{base}/sessions/{session}/reward", json={"reward": 1.0}, timeout=30)
  assert late.status_code == 410 and "has ended" in late.json()["error"]["message"]
  other = server.open_session()
  episodes.hand_out(other, {}, 0.3, "rl.agent_timeout_s=0.3")
  _take(base)
  episodes.hand_out(server.open_session(), {}, 30.0, "limit").cancel()
  time.sleep(0.6)  # the timer of `other` fires on an unended episode; nothing to see but no thread error


def test_episodes_no_process_takes_stop_the_run_after_the_wait(qwen3_tokenizer, caplog):
  caplog.set_level(logging.WARNING)
  server = OpenAIServer(
    _ScriptedBatcher(qwen3_tokenizer, "5"), qwen3_tokenizer, ConfigChatParser(qwen3_tokenizer, ""), "m", StepKeys(0)
  )
  stopped: list[Exception] = []
  episodes = EpisodeHandouts(
    server, "m", 1.5, stopped.append, where="http://h:1/episodes/next", limit="rl.agent_wait_s=1.5", log_every_s=0.5
  )
  try:
    episodes.hand_out(server.open_session(), {}, 30.0, "limit")
    deadline = time.monotonic() + 10
    while not stopped and time.monotonic() < deadline:
      time.sleep(0.1)
    [why] = stopped
    assert str(why) == (
      "rl.agent=http: 1 episodes waited and no process asked for one at POST http://h:1/episodes/next within "
      "rl.agent_wait_s=1.5 s; start your agent processes against that URL, or raise it"
    )
    waits = [r.getMessage() for r in caplog.records if "wait for agent processes" in r.getMessage()]
    assert waits and waits[0].startswith("rl.agent=http: 1 episodes wait for agent processes at POST http://h:1/")
  finally:
    episodes.close()


AGENT = """
async def solve(client, model, example):
  reply = await client.chat.completions.create(model=model, messages=example["messages"])
  text = reply.choices[0].message.content
  return float(text.strip() == example["answer"]) if example["answer"] != "bad" else "five"
"""


def test_a_claimed_episode_is_run_by_the_agent_runner_which_posts_its_reward_over_http(handouts, tmp_path):
  """rl.agent=FILE:FN's path: the run claims an episode for its worker (the body /episodes/next gives,
  never handed to a process asking after), and utils/agent_runner.py's handler runs the function on
  the session with the openai client and posts the reward to the same route an http process does."""
  from maxtext.utils import agent_runner

  server, episodes, base = handouts
  (tmp_path / "agent.py").write_text(AGENT)
  run = agent_runner.episode_runner(str(tmp_path / "agent.py"), "solve")
  session = server.open_session()
  reward = episodes.hand_out(session, EXAMPLE, 30.0, "rl.agent_timeout_s=30")
  take = episodes.claim(session, base)
  assert take == {
    "session": session,
    "base_url": f"{base}/sessions/{session}/v1",
    "model": "m",
    "example": EXAMPLE,
  }
  assert _take(base, wait_s=0.2).status_code == 204  # claimed: no process asking gets it
  run(take, 30.0)
  assert reward.result(timeout=5) == Posted(1.0) and len(server.session(session).calls) == 1
  episodes.fail(session, "too late")  # it has ended: nothing changes
  assert reward.result() == Posted(1.0)


def test_a_claimed_episode_fails_with_why_where_its_worker_gives_no_reward(handouts, tmp_path):
  from maxtext.utils import agent_runner

  server, episodes, base = handouts
  (tmp_path / "agent.py").write_text(AGENT)
  run = agent_runner.episode_runner(str(tmp_path / "agent.py"), "solve")
  session = server.open_session()
  reward = episodes.hand_out(session, {**EXAMPLE, "answer": "bad"}, 30.0, "rl.agent_timeout_s=30")
  take = episodes.claim(session, base)
  with pytest.raises(TypeError, match="solve returned 'five'; expected a finite float reward or None"):
    run(take, 30.0)
  assert not reward.done()  # nothing was posted: the run fails it with the worker's reason
  episodes.fail(session, "TypeError: solve returned 'five'")
  with pytest.raises(EpisodeFailed, match="TypeError: solve returned 'five'"):
    reward.result(timeout=5)
  gone = httpx.post(f"{base}/sessions/{session}/reward", json={"reward": 1.0}, timeout=30)
  assert gone.status_code == 410
  episodes.close()
  assert episodes.claim(server.open_session(), base) is None  # nothing waits once training is over


FAULTY = """
import os, signal, time

async def solve(client, model, example):
  how = example["answer"]
  if how == "raise":
    raise ValueError("planned")
  if how == "die":
    os.kill(os.getpid(), signal.SIGKILL)
  if how == "hang":
    time.sleep(600)
  reply = await client.chat.completions.create(model=model, messages=example["messages"])
  return float(reply.choices[0].message.content.strip() == "5")
"""


def test_the_run_s_workers_take_episodes_through_the_handouts_and_a_worker_s_fault_fails_only_its_own(
  qwen3_tokenizer, tmp_path
):
  """user_agent.Episodes with rl.agent=FILE:FN: four episodes at once in real worker processes; the
  one whose function returns posts its reward, the one that raises fails with its traceback, the one
  killed by SIGKILL and the one past rl.agent_timeout_s fail with why; none holds the others."""
  import asyncio

  from maxtext.integration.tunix import user_agent

  server = OpenAIServer(
    _ScriptedBatcher(qwen3_tokenizer, "5"), qwen3_tokenizer, ConfigChatParser(qwen3_tokenizer, ""), "m", StepKeys(0)
  )
  base = server.start("127.0.0.1", 0).removesuffix("/v1")  # Episodes adds the hand-out routes
  (tmp_path / "agent.py").write_text(FAULTY)
  agent = user_agent.UserAgent(str(tmp_path / "agent.py"), "solve", 8.0, 16, "127.0.0.1", 0, 600.0)
  stopped = []
  episodes = user_agent.Episodes(
    server,
    f"{base}/v1",
    agent,
    "m",
    [],
    lambda env: None,
    64,
    256,
    user_agent.Failures(agent),
    lambda: 0,
    stopped.append,
    4,
  )

  async def one(how):
    session = server.open_session()
    try:
      return await episodes.run(session, {**EXAMPLE, "answer": how})
    except EpisodeFailed as e:
      return str(e)

  async def all_four():
    return await asyncio.gather(*(one(how) for how in ("5", "raise", "die", "hang")))

  try:
    start = time.monotonic()
    ok, raised, died, hung = asyncio.run(all_four())
    took = time.monotonic() - start
  finally:
    episodes.close()
    server.stop()
  assert ok == Posted(1.0)
  assert raised.startswith("ValueError: planned") and "Traceback" in raised
  assert "exit" in died.lower() or "signal" in died.lower(), died
  assert "rl.agent_timeout_s=8" in hung, hung
  assert took < 30 and not stopped  # the hung worker was killed at its limit; nothing stopped the run
