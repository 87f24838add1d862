"""What a worker process of rl.agent runs (integration/tunix/user_agent.py): the user's agent loaded
there, one episode per call. Kept apart from the trainer's modules so that a worker imports only
this, the `openai` client and the agent's own imports (the trainer's would bring JAX and the server
into every worker: seconds of start-up and hundreds of MB each); the workers are forked from a fork
server that imported PRELOAD once."""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import Callable

from maxtext.utils import user_code

KEY = "rl.agent"
PRELOAD = ("openai", "maxtext.utils.agent_runner")  # what the agent workers' fork server imports once


def episode_runner(path: str, name: str) -> Callable[[str, str, dict, float], float | None]:
  """The WorkerPool `load` of an agent worker: rl.agent's file loaded; the handler (base_url, model,
  example, timeout_s) runs one episode with an openai.AsyncOpenAI client of that base URL (no
  retries: a retried request would be recorded twice; plain HTTP to the trainer's server, so no TLS
  context is made for it) and returns its reward as a float, or None."""
  import openai

  fn = getattr(user_code.load_file(path, KEY), name)

  def run(base_url: str, model: str, example: dict, timeout_s: float) -> float | None:
    async def episode():
      http = openai.DefaultAsyncHttpxClient(verify=False)
      async with openai.AsyncOpenAI(
        base_url=base_url, api_key="session", max_retries=0, timeout=timeout_s, http_client=http
      ) as client:
        return await fn(client, model, example)

    reward = asyncio.run(episode())
    if reward is None:
      return None
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
      raise TypeError(f"{name} returned {reward!r}; expected a finite float reward or None")
    return float(reward)

  return run
