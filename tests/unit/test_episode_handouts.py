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
from maxtext.rl.episode_handouts import EpisodeFailed, EpisodeHandouts
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
  assert posted.status_code == 200 and reward.result(timeout=5) == 0.75
  again = httpx.post(f"{base}/sessions/{session}/reward", json={"reward": 1.0}, timeout=30)
  assert again.status_code == 410 and "has ended" in again.json()["error"]["message"]
  unknown = httpx.post(f"{base}/sessions/nosuch/reward", json={"reward": 1.0}, timeout=30)
  assert unknown.status_code == 404 and "not an episode taken" in unknown.json()["error"]["message"]


def test_no_reward_lets_the_reward_functions_judge_and_episodes_go_in_arrival_order(handouts):
  server, episodes, base = handouts
  first, second = server.open_session(), server.open_session()
  futures = [episodes.hand_out(s, {"n": i}, 30.0, "limit") for i, s in enumerate((first, second))]
  assert [_take(base).json()["example"]["n"] for _ in range(2)] == [0, 1]
  assert httpx.post(f"{base}/sessions/{second}/reward", json={}, timeout=30).status_code == 200
  assert httpx.post(f"{base}/sessions/{first}/reward", json={"reward": None}, timeout=30).status_code == 200
  assert [f.result(timeout=5) for f in futures] == [None, None]


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
  assert reward.result(timeout=5) == 2.0


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
