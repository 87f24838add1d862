"""What a worker process of rl.agent runs (integration/tunix/user_agent.py): the user's agent loaded
there, one episode per call, taken and rewarded through the run's episode hand-out API
(rl/episode_handouts.py) as a process of rl.agent=http is. Kept apart from the trainer's modules so
that a worker imports only this, httpx, the `openai` client and the agent's own imports (the
trainer's would bring JAX and the server into every worker: seconds of start-up and hundreds of MB
each); the workers are forked from a fork server that imported PRELOAD once."""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Callable

from maxtext.utils import environment_agent, openenv_agent, trl_rollout, user_code

KEY = "rl.agent"
PRELOAD = (
  "httpx",
  "openai",
  "websockets",
  "maxtext.utils.agent_runner",
)  # what the agent workers' fork server imports once


def episode_runner(
  path: str,
  name: str,
  api_key: str | None = None,
  openenv: openenv_agent.OpenEnv | None = None,
  rollout_args: dict | None = None,
) -> Callable[[dict, float], None]:
  """The WorkerPool `load` of an agent worker: rl.agent's file loaded; the handler (take, timeout_s)
  runs the episode an /episodes/next body names (`take`: session, base_url, model, example) with an
  openai.AsyncOpenAI client of its base URL (no retries: a retried request would be recorded twice;
  plain HTTP to the trainer's server, so no TLS context is made for it) and posts the function's
  reward, a float or None, to the session's /reward route, as a process of rl.agent=http does, both
  with the server's `api_key` where it has one. A function that returns anything else raises
  TypeError (and posts nothing). NAME may also be a TRL environment_factory, run as
  utils/environment_agent.py runs it, or a TRL rollout_func, run as utils/trl_rollout.py runs it (its
  trainer.args `rollout_args`), whose fields are posted with a null reward for the reward functions.
  With `openenv` (rl.agent=openenv) the episode is the environment server's, as utils/openenv_agent.py
  plays it."""
  import httpx
  import openai

  def post(take: dict, body: dict, timeout_s: float) -> None:
    url = f"{take['base_url'].removesuffix('/v1')}/reward"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    posted = httpx.post(url, json=body, headers=headers, timeout=timeout_s)
    if posted.status_code != 200:
      raise RuntimeError(f"POST {url}: {posted.status_code} {posted.text}")

  if openenv is not None:
    fn = openenv_agent.episode(openenv)
  else:
    fn = getattr(user_code.load_file(path, KEY), name)
    if trl_rollout.is_rollout_func(fn):
      play = trl_rollout.episode(fn, name, rollout_args or {})

      def rollout(take: dict, timeout_s: float) -> None:
        fields = play(take["base_url"], take["model"], api_key, timeout_s, take["example"])
        post(take, {"reward": None, "fields": fields}, timeout_s)

      return rollout
    if not inspect.iscoroutinefunction(fn):  # a TRL environment_factory, or a dict of them (load checked it)
      fn = environment_agent.episode(fn)

  def run(take: dict, timeout_s: float) -> None:
    async def episode():
      http = openai.DefaultAsyncHttpxClient(verify=False)
      async with openai.AsyncOpenAI(
        base_url=take["base_url"], api_key=api_key or "session", max_retries=0, timeout=timeout_s, http_client=http
      ) as client:
        return await fn(client, take["model"], take["example"])

    reward = asyncio.run(episode())
    if reward is not None and (
      isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward))
    ):
      raise TypeError(f"{name} returned {reward!r}; expected a finite float reward or None")
    post(take, {"reward": None if reward is None else float(reward)}, timeout_s)

  return run
