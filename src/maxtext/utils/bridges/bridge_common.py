"""What the run's environment bridges (bridges/verifiers_bridge.py, bridges/openenv_bridge.py) share. They
run as scripts in an environment's own venv (their folder, which holds only them, heads sys.path there), so
this uses only the standard library and httpx, which verifiers and OpenEnv install.

A bridge refuses an environment it cannot train with `refuse`: one line on stderr and exit status
REFUSED, which the trainer (env_server.run_bridge) reports as the refusal. `keyword_args` reads ARGS, a
JSON object of keyword arguments, refusing anything else.

`take_episodes` takes the run's episodes from its hand-out API at BASE (POST /episodes/next, as a process of
rl.agent=http does), up to CONCURRENCY at once, until it answers 410; each is `await play(take)` bounded by
TIMEOUT_S, whose body ({"reward": ...} or {"error": ...}) is posted to the session's /reward route. An
episode that raises or runs out of time posts {"error": ...}: a failed episode, which the run counts. The
run's API key, where it has one, is $MAXTEXT_AGENT_API_KEY.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import NoReturn

KEY_ENV = "MAXTEXT_AGENT_API_KEY"
REFUSED = 2  # the exit status of an environment the run cannot train


def refuse(line: str) -> NoReturn:
  print(line, file=sys.stderr, flush=True)
  raise SystemExit(REFUSED)


def keyword_args(args: str, whose: str) -> dict:
  """ARGS (environment.args), a JSON object of `whose` keyword arguments; refused otherwise."""
  try:
    kwargs = json.loads(args)
  except json.JSONDecodeError as e:
    refuse(f"environment.args={args}: not JSON ({e})")
  if not isinstance(kwargs, dict):
    refuse(f"environment.args={args}: expected a JSON object of {whose} keyword arguments")
  return kwargs


def call_shown(name: str, kwargs: dict) -> str:
  """name(k=v, ...), as a refusal names a call that failed."""
  return f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def failure(e: BaseException) -> str:
  """An exception as a refusal names it: its type and its message's first line."""
  return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def api_key() -> str | None:
  return os.environ.get(KEY_ENV) or None


async def take_episodes(base: str, concurrency: int, timeout_s: float, play: Callable[[dict], Awaitable[dict]]) -> None:
  import httpx

  key = api_key()
  headers = {"Authorization": f"Bearer {key}"} if key else {}
  slots = asyncio.Semaphore(concurrency)
  running: set[asyncio.Task] = set()

  async def run(http: httpx.AsyncClient, take: dict) -> None:
    try:
      body = await asyncio.wait_for(play(take), timeout_s)
    except TimeoutError:
      body = {"error": f"the rollout ran past {timeout_s:g} s (rl.agent_timeout_s)"}
    except Exception as e:  # noqa: BLE001 (the environment's code: its episode fails)
      body = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    finally:
      slots.release()
    try:
      await http.post(f"{base}/sessions/{take['session']}/reward", json=body, headers=headers, timeout=30)
    except httpx.HTTPError:
      pass  # the run is gone, or the episode ended already: nothing to keep

  async with httpx.AsyncClient() as http:
    while True:
      await slots.acquire()
      try:
        taken = await http.post(f"{base}/episodes/next", json={"wait_s": 10}, headers=headers, timeout=40)
      except httpx.HTTPError:
        slots.release()
        await asyncio.sleep(1.0)
        continue
      if taken.status_code != 200:
        slots.release()
        if taken.status_code == 410:  # training is over
          break
        if taken.status_code != 204:
          print(f"POST {base}/episodes/next: {taken.status_code} {taken.text}", file=sys.stderr, flush=True)
          await asyncio.sleep(1.0)
        continue
      task = asyncio.create_task(run(http, taken.json()))
      running.add(task)
      task.add_done_callback(running.discard)
    for task in list(running):
      task.cancel()
