"""OpenEnv harness sessions trained by rl.agent=openenv with environment.id: this file runs as a script in
the interpreter environment.python names (a venv with OpenEnv installed: its pins clash with the
trainer's) and uses only the standard library, OpenEnv and what OpenEnv installs (httpx, openai), imported
where used, so the trainer imports it (`seed`) without OpenEnv. utils/openenv_sessions.py starts it, in one
of two modes:

    python openenv_bridge.py check ID ARGS
    python openenv_bridge.py episodes ID ARGS BASE CONCURRENCY TIMEOUT_S MAX_TURNS

ID is FILE.py:NAME, NAME an OpenEnv `ResourceSessionFactory` (openenv.core.harness: `create(task, seed,
episode_id) -> ResourceSession`), or a class or function that makes one from ARGS (a JSON object of its
keyword arguments). `check` loads it and prints one JSON line describing it; a file that does not load, a
NAME it lacks, a maker that raises or makes something without `create` exits with 2 and one line on
stderr saying so.

`episodes` takes the run's episodes from its hand-out API at BASE with utils/bridges/bridge_common.py's loop (up
to CONCURRENCY at once, each bounded by TIMEOUT_S). Each is played, in a thread of its own, as OpenEnv's
trainer-side rollout plays one (its `build_harness_rollout_func`):
- `factory.create(task=the example's fields, seed=seed(those fields), episode_id=the session's id)`: the
  samples of a prompt's group get one seed;
- OpenEnv's white-box harness, `MCPHarnessAdapter().run_white_box(model_step, session,
  HarnessRunLimits(max_turns=MAX_TURNS))`: the session's initial_messages are the conversation's start, its
  list_tools the policy's functions, each tool call a call_tool whose result is the tool turn, until a
  reply calls no tool, a result is done or MAX_TURNS replies; `model_step` is OpenEnv's own
  `build_model_step(OpenAIClient(...))` on the episode's session (its sampling the run's). A reply the
  session's response budget refuses, after the first, ends the loop as a reply with no text and no calls;
- `session.verify(transcript, final_state)` (final_state as build_harness_rollout_func gives it), then
  `session.close()`;
- the reward is OpenEnv's: the reward of the last tool result that carries one (its metadata's or its
  data's "reward"), else verify's env_reward; where both are given they must agree. A rollout with neither
  is unscored (OpenEnv: never 0.0), so it fails, as does one that raises or runs past TIMEOUT_S (posted as
  {"error": ...}: the run counts failed episodes and leaves them out of their group's baseline).
The run's API key, where it has one, is $MAXTEXT_AGENT_API_KEY.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import math
import os
import sys
import threading
import traceback

try:  # run as a script, this folder heads sys.path; imported by the trainer, it is a package's module
  from . import bridge_common
except ImportError:
  import bridge_common  # type: ignore[no-redef]

# what a reply may take at most: the session's response budget bounds it (OpenAIClient's default is 256)
MAX_TOKENS = 1 << 20
BUDGET_SPENT = "maximum context length is spent"  # the server's 400 for a session whose budget is used up
FORM = (
  "FILE.py:NAME, NAME an OpenEnv ResourceSessionFactory (create(task, seed, episode_id) -> ResourceSession) "
  "or a class or function making one from environment.args"
)


def seed(row: dict) -> int:
  """The seed of an example: the same for every sample of a prompt's group (utils/openenv_agent.py's reset
  seed too)."""
  digest = hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).digest()
  return int.from_bytes(digest[:4], "big")


def load(spec: str, args: str):
  """The session factory `spec` names, made with `args`; SystemExit(2) with one line where it cannot be."""
  path, _, name = spec.rpartition(":")
  where = f"environment.id={spec}"
  kwargs = bridge_common.keyword_args(args, "the factory's")
  if importlib.util.find_spec("openenv") is None:
    bridge_common.refuse(f"environment.python={sys.executable}: OpenEnv is not installed there")
  sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # the file's own imports, as a script has them
  try:
    module_spec = importlib.util.spec_from_file_location("openenv_sessions_user", path)
    module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
    module_spec.loader.exec_module(module)  # type: ignore[union-attr]
  except Exception as e:  # noqa: BLE001 (the user's code: whatever it raises is its refusal)
    traceback.print_exc()
    bridge_common.refuse(f"{where}: {path} does not load: {bridge_common.failure(e)}")
  made = getattr(module, name, None)
  if made is None:
    bridge_common.refuse(f"{where}: {path} defines no {name}; expected {FORM}")
  if not callable(getattr(made, "create", None)) or inspect.isclass(made):
    if not callable(made):
      bridge_common.refuse(f"{where}: {name} is a {type(made).__name__}; expected {FORM}")
    try:
      made = made(**kwargs)
    except Exception as e:  # noqa: BLE001
      traceback.print_exc()
      bridge_common.refuse(f"{where}: {bridge_common.call_shown(name, kwargs)} failed: {bridge_common.failure(e)}")
  elif kwargs:
    bridge_common.refuse(f"environment.args={args}: {name} is a factory already made, which takes no arguments")
  if not callable(getattr(made, "create", None)):
    bridge_common.refuse(f"{where}: {name} made a {type(made).__name__}, which has no create(); expected {FORM}")
  return made


def check(spec: str, args: str) -> None:
  factory = load(spec, args)
  from openenv.core.harness import ResourceSessionFactory

  typed = isinstance(factory, ResourceSessionFactory)
  print(json.dumps({"class": type(factory).__name__, "resource_session_factory": typed}))


def env_reward(rollout, verify) -> float | None:
  """The episode's reward as OpenEnv's build_harness_rollout_func resolves it (see the module's
  docstring); ValueError where the tool results' and verify's disagree."""
  traced = None
  for entry in reversed(rollout.tool_trace):
    result = entry.result
    traced = result.metadata.get("reward")
    if traced is None and isinstance(result.data, dict):
      traced = result.data.get("reward")
    if traced is not None:
      traced = float(traced)
      break
  verified = None if verify.env_reward is None else float(verify.env_reward)
  if traced is not None and verified is not None and not math.isclose(traced, verified, rel_tol=1e-9, abs_tol=1e-6):
    raise ValueError(f"verify's env_reward {verified} is not the reward the rollout's last tool result gave ({traced})")
  return traced if traced is not None else verified


def final_state(rollout) -> dict:
  """What verify gets as final_state, as build_harness_rollout_func gives it."""
  return {
    "done": rollout.done,
    "metrics": dict(rollout.metrics),
    "events": [dataclasses.asdict(e) for e in rollout.events],
    "tool_trace": [dataclasses.asdict(t) for t in rollout.tool_trace],
  }


def play(factory, take: dict, key: str | None, max_turns: int) -> dict:
  """One episode (see the module's docstring): the body to post to the session's /reward route."""
  import openai
  from openenv.core.harness import HarnessRunLimits, MCPHarnessAdapter, ModelStepResult
  from openenv.core.harness.collect import build_model_step
  from openenv.core.llm_client import LLMResponse, OpenAIClient

  task = {k: v for k, v in take["example"].items() if k != "messages"}
  session = factory.create(task=task, seed=seed(task), episode_id=take["session"])
  try:
    client = OpenAIClient(take["base_url"], None, take["model"], api_key=key or "session", max_tokens=MAX_TOKENS)
    step = build_model_step(client)
    replies = [0]

    def model_step(messages, tools, sampling):
      try:
        result = step(messages, tools, sampling)
      except openai.BadRequestError as e:
        if BUDGET_SPENT in str(e) and replies[0]:
          return ModelStepResult(response=LLMResponse(content=""))  # the budget ends the episode
        raise
      replies[0] += 1
      return result

    rollout = MCPHarnessAdapter().run_white_box(model_step, session, HarnessRunLimits(max_turns=max_turns))
    verify = session.verify(transcript=rollout.messages, final_state=final_state(rollout))
  finally:
    session.close()
  reward = env_reward(rollout, verify)
  if reward is None:
    return {"error": "unscored: no tool result carried a reward and verify gave no env_reward"}
  if not math.isfinite(reward):
    return {"error": f"the environment's reward is {reward}; expected a finite float"}
  return {"reward": reward}


async def episodes(spec: str, args: str, base: str, concurrency: int, timeout_s: float, max_turns: int) -> None:
  factory = load(spec, args)
  key = bridge_common.api_key()
  loop = asyncio.get_running_loop()

  def play_in_thread(take: dict) -> asyncio.Future:
    """play() in a thread of its own (a harness and its sessions are synchronous; one that hangs is left
    behind when the episode's time is up)."""
    future = loop.create_future()

    def settle(body: dict | None, error: BaseException | None) -> None:
      if not future.done():
        future.set_exception(error) if error is not None else future.set_result(body)

    def target() -> None:
      try:
        body, error = play(factory, take, key, max_turns), None
      except Exception as e:  # noqa: BLE001 (the environment's code: its episode fails)
        body, error = None, e
      loop.call_soon_threadsafe(settle, body, error)

    threading.Thread(target=target, name=f"episode-{take['session'][:8]}", daemon=True).start()
    return future

  await bridge_common.take_episodes(base, concurrency, timeout_s, play_in_thread)


def main(argv: list[str]) -> None:
  mode, spec, args, *rest = argv
  if mode == "check":
    check(spec, args)
  else:
    base, concurrency, timeout_s, max_turns = rest
    asyncio.run(episodes(spec, args, base, int(concurrency), float(timeout_s), int(max_turns)))


if __name__ == "__main__":
  main(sys.argv[1:])
