"""The hand-out loop of the run's environment bridges (bridges/verifiers_bridge.py, bridges/openenv_bridge.py),
which run as scripts in an environment's own venv (their folder, which holds only them, heads sys.path
there): it uses only the standard library and httpx, which verifiers and OpenEnv install.

`take_episodes` takes the run's episodes from its hand-out API at BASE (POST /episodes/next, as a process of
rl.agent=http does), up to CONCURRENCY at once, until it answers 410; each is `await play(take)` bounded by
TIMEOUT_S, whose body ({"reward": ...} or {"error": ...}) is posted to the session's /reward route. An
episode that raises or runs out of time posts {"error": ...}: a failed episode, which the run counts. The
run's API key, where it has one, is $MAXTEXT_AGENT_API_KEY.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from collections.abc import Awaitable, Callable

KEY_ENV = "MAXTEXT_AGENT_API_KEY"


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
