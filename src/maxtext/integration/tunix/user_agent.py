"""A user's agent (rl.agent=PATH.py:NAME, or http) trained by agentic GRPO through the policy's
OpenAI-compatible endpoint.

The learner serves the policy under training (inference/openai_server.py on the batched engine's
continuous batcher, at rl.agent_host:rl.agent_port, by default 127.0.0.1 and a free port) while it
trains. Each episode, one sample of a GRPO group, is an AgentEpisode run by Tunix's rollout
orchestrator in place of trajectories.TrajectoryEngine:
1. a session is opened that samples as the run's training rollouts do (temperature, top-p, top-k,
   the episode's keys, max_response_length tokens after the first prompt), whatever its requests ask;
2. the episode is handed out (rl/episode_handouts.py): with http to the process of the user's that
   asks for one; with FILE:FN it is claimed for a worker process (utils/worker_pool.py: killed past
   rl.agent_timeout_s, nothing it does reaches the trainer), where `await NAME(client, model,
   example)` runs with an openai.AsyncOpenAI client whose base URL is the session's, the served
   model's id and the example's fields (utils/agent_runner.py). Either posts the reward to the
   session's /reward route;
3. the session's calls become the trained conversation (rl.session_stitching.stitch), and the
   function's (or posted) float its reward (None: the run's reward functions judge its last reply).
An episode fails where the function raises, returns something other than a number or None, runs past
rl.agent_timeout_s or makes no call (with http: its process posts an error or no reward within
rl.agent_timeout_s of taking it, or it is never taken), and where its group cannot be laid out with it
(rl/group_scoring.py: a first prompt over max_prompt_length, say): it stays in its group as a failed
rl.episode.Episode, trains on nothing and leaves the group's baseline to the others, counts in
agent/failed_episodes, and the run stops with the first failure's traceback once more than
rl.agent_max_failures have failed (`Episodes.count`).
Weights update between steps while episodes run (agentic._EpisodesDoNotHoldSyncs: the batcher pauses
between decode chunks and tags each token with the version that sampled it); the orchestrator's
back-pressure bounds staleness by rl.off_policy_steps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import importlib.util
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from maxtext.configs import checks
from maxtext.configs.sections import AgentSection, EnvironmentSection
from maxtext.inference.openai_server import OpenAIServer
from maxtext.inference.sessions import SessionSampling
from maxtext.input_pipeline.text_as_data import TextAsData
from maxtext.rl import session_stitching
from maxtext.rl.episode import Calls, Episode
from maxtext.rl.episode_handouts import EpisodeFailed, EpisodeHandouts, Posted
from maxtext.rl.prompt_feed import ROUND, SLOT
from maxtext.utils import (
  agent_runner,
  env_server,
  environment_agent,
  errors,
  openenv_agent,
  openenv_sessions,
  trl_rollout,
  user_code,
  verifiers_env,
  worker_pool,
)

log = logging.getLogger(__name__)

KEY = agent_runner.KEY
LIMIT = "rl.agent_timeout_s={:g}"
FORM = (
  "expected `async def NAME(client, model, example)` returning a float reward or None, "
  + environment_agent.FORM
  + ", "
  + trl_rollout.FORM
)


@dataclasses.dataclass(frozen=True)
class UserAgent:
  """rl.agent's file and function, checked (load), or an OpenEnv environment (openenv: a server's episodes
  played in the run's workers, or harness sessions, `sessions`, played by their bridge process), or a
  verifiers environment (verifiers: its bridge process takes the episodes over HTTP, as http's processes
  do), or neither (http: processes of the user's take the episodes over HTTP), its limits and where the
  policy is served; `server`: the environment server the run started (environment.command), which close()
  kills."""

  path: str  # "" with http and openenv
  name: str
  timeout_s: float
  max_failures: int
  host: str
  port: int
  wait_s: float  # http: how long episodes may wait with no process asking for one
  api_key: str | None = None  # the key every route of the server requires (None: none)
  sessionless: bool = False  # the server also serves its routes without a session
  openenv: openenv_agent.OpenEnv | None = None
  server: env_server.EnvServer | None = dataclasses.field(default=None, compare=False)
  verifiers: verifiers_env.VerifiersEnv | None = None
  sessions: openenv_sessions.OpenEnvSessions | None = None  # rl.agent=openenv with environment.id
  rollout_args: dict | None = dataclasses.field(default=None, compare=False)  # a TRL rollout_func's trainer.args

  @property
  def over_http(self) -> bool:
    return not self.path and self.openenv is None

  @property
  def bridged(self) -> verifiers_env.VerifiersEnv | openenv_sessions.OpenEnvSessions | None:
    """The environment whose bridge process (in environment.python) takes the episodes, if any."""
    return self.verifiers or self.sessions

  @property
  def spec(self) -> str:
    if self.openenv is not None or self.sessions is not None:
      return "openenv"
    if self.verifiers is not None:
      return "verifiers"
    return "http" if self.over_http else f"{self.path}:{self.name}"

  def close(self) -> None:
    """Kills the environment server the run started, if any; removes a verifiers dataset's file."""
    if self.server is not None:
      self.server.close()
    if self.verifiers is not None:
      self.verifiers.close()

  def workers(self) -> worker_pool.WorkerPool:
    """The worker processes that run the agent's function, each episode in one (not with http)."""
    return worker_pool.WorkerPool(
      functools.partial(
        agent_runner.episode_runner, self.path, self.name, self.api_key, self.openenv, self.rollout_args
      ),
      self.timeout_s,
      LIMIT.format(self.timeout_s),
      preload=agent_runner.PRELOAD,  # workers forked with the client imported: milliseconds, not seconds
    )

  def worker_bytes(self) -> float:
    """The memory one worker holds with the agent's file loaded, measured on one started for it (its
    resident memory: what it shares with the fork server too, which episodes' own allocations
    outgrow); 0 with http, whose processes are the user's."""
    if self.over_http:
      return 0.0
    pool = self.workers()
    try:
      return worker_pool.resident_bytes(pool.warm())
    finally:
      pool.close()


def load(
  section: AgentSection, environment: EnvironmentSection | None = None, rollout_args: dict | None = None
) -> UserAgent:
  """rl.agent checked here, before the model loads: the openai package is installed, the file runs,
  defines NAME, an async function taking (client, model, example) or a TRL environment class
  (utils/environment_agent.check: reset, and tool methods with schemas); with openenv, `environment`'s
  server (started here from environment.command, waiting rl.agent_wait_s for it) answers as an OpenEnv
  server whose action a reply can fill (openenv_agent.describe); with verifiers, `environment`'s
  environment loads in environment.python and its dataset is written (verifiers_env.prepare); an
  InputError naming the key otherwise. http needs no file. NAME may also be a TRL rollout_func
  (utils/trl_rollout.py), whose trainer.args are `rollout_args`."""
  limits = (
    section.agent_timeout_s,
    section.agent_max_failures,
    section.agent_host,
    section.agent_port,
    section.agent_wait_s,
    checks.api_key(section.agent_api_key, checks.AGENT_KEY_ENV),
    section.agent_sessionless,
  )
  if section.agent == "http":
    return UserAgent("", "", *limits)
  if section.agent == "openenv":
    assert environment is not None, "rl.agent=openenv needs the environment section"
    return _openenv(environment, limits, section.agent_wait_s)
  if section.agent == "verifiers":
    assert environment is not None, "rl.agent=verifiers needs the environment section"
    env = verifiers_env.prepare(environment, section.agent_wait_s)
    return dataclasses.replace(UserAgent("", "verifiers", *limits), verifiers=env)
  path, _, name = section.agent.rpartition(":")
  if importlib.util.find_spec("openai") is None:
    raise errors.InputError(f"{KEY}={section.agent}: the openai package, whose client the agent gets, is not installed")
  module = user_code.load_file(path, KEY)
  fn = getattr(module, name, None)
  where = f"{KEY}={section.agent}"
  if fn is None:
    raise errors.InputError(f"{where}: {path} defines no {name}; {FORM}")
  if inspect.isclass(fn) or (isinstance(fn, dict) and fn and all(inspect.isclass(c) for c in fn.values())):
    try:  # a TRL environment_factory, or TRL's dict of them
      for cls in fn.values() if isinstance(fn, dict) else [fn]:
        environment_agent.check(cls, where)
    except ValueError as e:
      raise errors.InputError(str(e)) from None
    return UserAgent(path, name, *limits)
  if trl_rollout.is_rollout_func(fn):
    return dataclasses.replace(UserAgent(path, name, *limits), rollout_args=rollout_args)
  if not inspect.iscoroutinefunction(fn):
    raise errors.InputError(f"{where}: {name} is not an async function; {FORM}")
  try:
    inspect.signature(fn).bind(None, None, None)
  except TypeError as e:
    raise errors.InputError(
      f"{where}: {name}{inspect.signature(fn)} cannot take (client, model, example); {FORM}"
    ) from e
  return UserAgent(path, name, *limits)


def _openenv(environment: EnvironmentSection, limits: tuple, wait_s: float) -> UserAgent:
  """rl.agent=openenv: its server (started from environment.command where set) checked; with
  environment.id, its harness sessions' factory made (the server's URL its base_url, where one is named)."""
  server = env_server.EnvServer(environment.command, wait_s) if environment.command else None
  url = server.url if server is not None else environment.url
  if environment.id:
    try:
      sessions = openenv_sessions.prepare(environment, wait_s, url or None)
    except errors.InputError:
      if server is not None:
        server.close()
      raise
    return dataclasses.replace(UserAgent("", "openenv", *limits), sessions=sessions, server=server)
  try:
    env = openenv_agent.describe(url, environment.action_field, environment.observation_field, environment.max_turns)
  except ValueError as e:
    if server is not None:
      server.close()
    raise errors.InputError(f"{KEY}=openenv: {e}") from None
  log.info("rl.agent=openenv: %s, each reply its action's %s field", url, env.action_field)
  return dataclasses.replace(UserAgent("", "openenv", *limits), openenv=env, server=server)


class Failures:
  """The run's failed episodes: counted, the first logged with its traceback, and past `limit` a
  RolloutError-worthy stop (`add` raises AgentFailed)."""

  def __init__(self, agent: UserAgent):
    self._agent = agent
    self._lock = threading.Lock()
    self.count = 0
    self.first: str | None = None

  def add(self, why: str) -> None:
    with self._lock:
      self.count += 1
      if self.first is None:
        self.first = why
        log.warning(
          "%s=%s: an episode failed (more are counted in agent/failed_episodes): %s", KEY, self._agent.spec, why
        )
      if self.count > self._agent.max_failures:
        raise AgentFailed(
          f"{KEY}={self._agent.spec}: {self.count} episodes failed, more than rl.agent_max_failures="
          f"{self._agent.max_failures}; the first (its traceback is logged above): {self.first.splitlines()[0]}"
        )


class AgentFailed(errors.InputError):
  """More of the user's episodes failed than rl.agent_max_failures allows."""


@dataclasses.dataclass
class Episodes:
  """What every AgentEpisode of a run shares: the server and its base URL, the agent's worker pool
  and the threads that wait on it (one per episode in flight), the served model id, the turns that
  open a conversation (the run's system prompt and the data template's example turns), how sessions
  sample, the response budget, the failures, the sampler's weights version and how to stop the
  rollouts."""

  server: OpenAIServer
  base_url: str
  agent: UserAgent
  model: str
  opening: list[dict[str, str]]  # the turns before the user turn: system prompt, example turns
  sampling: Callable[[Any], SessionSampling]  # how an episode's session samples (from its environment)
  budget: int
  prompt_budget: int  # max_prompt_length: the first prompt's tokens at most
  failures: Failures
  version: Callable[[], int]  # the sampler's weights version now (an episode without calls is of it)
  stop: Callable[[Exception], None]  # ends the rollouts and training with this error
  concurrency: int  # episodes in flight at most (rl.max_concurrency): the threads waiting on workers
  pool: worker_pool.WorkerPool | None = dataclasses.field(init=False, default=None)  # the agent's function
  bridge: env_server.Child | None = dataclasses.field(init=False, default=None)  # verifiers' or sessions' player
  threads: concurrent.futures.ThreadPoolExecutor | None = dataclasses.field(init=False, default=None)
  handouts: EpisodeHandouts | None = dataclasses.field(init=False, default=None)  # every episode is handed out
  closed: bool = dataclasses.field(init=False, default=False)  # training is over: failures no longer count
  measured: bool = dataclasses.field(init=False, default=False)  # a first prompt's length was logged

  def __post_init__(self):
    over_http = self.agent.over_http
    self.handouts = EpisodeHandouts(
      self.server,
      self.model,
      self.agent.wait_s,
      on_no_taker=(lambda e: self.stop(AgentFailed(self._no_taker(e)))) if over_http else None,
      where=f"{self.base_url.removesuffix('/v1')}/episodes/next",
      limit=f"rl.agent_wait_s={self.agent.wait_s:g}",
    )
    if self.agent.bridged is not None:
      root = self.base_url.removesuffix("/v1")
      self.bridge = self.agent.bridged.start(root, self.concurrency, self.agent.timeout_s, self.agent.api_key)
    if over_http:
      return
    self.pool = self.agent.workers()
    self.threads = concurrent.futures.ThreadPoolExecutor(self.concurrency, thread_name_prefix="agent-episode")

  def _no_taker(self, e: Exception) -> str:
    """Why no process took the episodes: with a bridge (verifiers, OpenEnv sessions), the end of its output."""
    if self.bridge is None or self.agent.bridged is None:
      return str(e)
    return f"{e}; the environment's process ({self.agent.bridged.python}) wrote:\n{self.bridge.output()}"

  def first_prompt(self, tokens: int) -> None:
    """Logs, once, what the agent's first prompt needs, its system turn and tools' descriptions
    included (no setting can know it): measured from the run's first episode that made a call; a
    warning naming the max_prompt_length to set where it is over it (such episodes fail)."""
    if self.measured:
      return
    self.measured = True
    if tokens > self.prompt_budget:
      log.warning(
        "rl.agent's first prompt has %d tokens (its system turn and tools included), more than max_prompt_length=%d: "
        "such episodes fail; set max_prompt_length=%d or more",
        tokens,
        self.prompt_budget,
        tokens,
      )
    else:
      log.info(
        "rl.agent's first prompt has %d tokens (its system turn and tools included) of max_prompt_length=%d",
        tokens,
        self.prompt_budget,
      )

  async def run(self, session: str, example: dict) -> Posted:
    """One episode on `session`, handed out (rl/episode_handouts.py): to the process that takes it
    over HTTP, or claimed for a worker of the agent's function, which posts its reward as such a
    process does (where it raises, runs past its limit or dies, the episode fails with why); what
    it posted (its reward, None where the reward functions judge, and their fields). EpisodeFailed,
    or a CancelledError once training is over."""
    assert self.handouts is not None
    limit = LIMIT.format(self.agent.timeout_s)
    future = self.handouts.hand_out(session, example, self.agent.timeout_s, limit)
    if self.pool is not None and (take := self.handouts.claim(session, self.base_url.removesuffix("/v1"))):
      assert self.threads is not None
      try:
        self.threads.submit(self._work, take)
      except RuntimeError:  # closed meanwhile: training is over
        future.cancel()
    return await asyncio.wrap_future(future)

  def _work(self, take: dict) -> None:
    """A worker runs the claimed episode `take`; where it gives no reward, its episode fails with why."""
    assert self.pool is not None and self.handouts is not None
    try:
      self.pool.call(take, self.agent.timeout_s)
    except worker_pool.CallRaised as raised:
      self.handouts.fail(take["session"], f"{raised.type_name}: {raised.message}\n{raised.trace}")
    except worker_pool.CallFailed as failed:
      self.handouts.fail(take["session"], str(failed))

  def count(self, failure: str) -> None:
    """Counts a failed episode (not once training is over: then its failure is not the agent's); past
    rl.agent_max_failures the rollouts stop with AgentFailed, which is raised."""
    if self.closed:
      return
    try:
      self.failures.add(failure)
    except AgentFailed as past_budget:
      self.stop(past_budget)
      raise

  def close(self) -> None:
    """Ends the episodes still in flight when training is over (their workers killed, their handouts
    cancelled); their failures are not the agent's and do not count."""
    self.closed = True
    if self.handouts is not None:
      self.handouts.close()
    if self.threads is not None:
      self.threads.shutdown(wait=False, cancel_futures=True)
    if self.pool is not None:
      self.pool.close()
    if self.bridge is not None:
      self.bridge.close()


# Fields of a prompt record that are the feed's and the learner's, not the example's.
_INTERNAL = ("prompts", "user_content", "policy_version", SLOT, ROUND)


def example_of(task: dict, opening: list[dict[str, str]]) -> dict[str, Any]:
  """The example's fields as plain Python values (one prompt's: a batch-of-one array is its item),
  the learner's bookkeeping left out; `prompt`: the user turn as the run's data template writes it;
  `messages`: the conversation's start as the run's own agent writes it, the `opening` turns (system
  prompt, the data template's example turns) and that user turn."""
  out: dict[str, Any] = {}
  for k, v in [*task.items(), ("prompt", task.get("prompts"))]:
    if k.startswith("_") or k in _INTERNAL or v is None:
      continue
    if isinstance(v, np.ndarray):
      v = v.tolist()
      v = v[0] if isinstance(v, list) and len(v) == 1 else v
    elif isinstance(v, np.generic):
      v = v.item()
    if isinstance(v, bytes):
      v = v.decode("utf-8", "replace")
    out[k] = v
  out.setdefault("messages", [*map(dict, opening), {"role": "user", "content": out.get("prompt", "")}])
  return out


class AgentEpisode:
  """One episode of the user's agent for Tunix's rollout orchestrator (its `engine_cls`, built as
  engine_cls(agent, env, **engine_kwargs); `agent` is unused, `env` carries the example and group):
  `collect("Token")` returns its rl.episode.Episode, failed or not, with the agent's reward (None: the
  reward functions judge) and its calls' counts. A failed episode without calls has as its prompt the
  example's messages as the model's chat template renders them (as a first call's would be)."""

  def __init__(self, agent, env, *, episodes: Episodes, **_):
    del agent
    self.env = env
    self._episodes = episodes

  async def collect(self, mode: str = "Token") -> Episode:
    if mode != "Token":
      raise ValueError(f"AgentEpisode.collect: mode {mode!r}; expected Token")
    e = self._episodes
    task = self.env.task
    session_id = e.server.open_session(e.sampling(self.env))
    failure, posted = None, Posted(None)
    loop = asyncio.get_running_loop()
    example = example_of(task, e.opening)
    try:
      posted = await e.run(session_id, example)
    except EpisodeFailed as failed:
      failure = str(failed)
    finally:
      calls = e.server.close_session(session_id).calls
      await loop.run_in_executor(None, self.env.close)
    if failure is None and not calls:
      failure = f"{e.agent.name or 'its process'} made no call to its client"
    stitched = session_stitching.stitch(calls, e.budget) if calls else None
    if stitched is not None:
      e.first_prompt(len(stitched.prompt))
    episode = self._episode(stitched, calls, example, posted)
    if failure is not None:
      episode = episode.failing(failure)
      e.count(failure)
    return episode

  def _episode(self, stitched: session_stitching.Stitched | None, calls, example: dict, posted: Posted) -> Episode:
    """The episode's record; its conversation is the last trained call's messages and reply (a
    completions call's: the example's messages and the last reply's text); its example the prompt's
    with the posted fields (each a batch of one, as the prompt's are)."""
    e = self._episodes
    if stitched is None:  # no call: the example's messages as a first call would be rendered
      data = TextAsData(e.server.tokenizer)
      prompt = np.asarray(data.encode(e.server.chat.render_whole(data.protect(example["messages"]))), np.int32)
      empty = np.zeros(0, np.int32)
      stitched = session_stitching.Stitched(prompt, empty, empty, np.zeros(0, np.float32), empty, None, (), Calls())
      conversation = list(example["messages"])
    elif (last := calls[stitched.chain[-1]]).messages is not None:
      conversation = [*last.messages, {"role": "assistant", "content": last.reply}]
    else:
      reply = stitched.tokens[stitched.masks == 1][-self._last_reply_length(stitched) :]
      text = e.server.tokenizer.decode(reply.tolist(), skip_special_tokens=True)
      conversation = [*example["messages"], {"role": "assistant", "content": text}]
    return Episode(
      prompt_ids=stitched.prompt,
      completion_ids=stitched.tokens,
      completion_mask=stitched.masks,
      logprobs=stitched.logprobs,
      versions=stitched.versions,
      version=stitched.version if stitched.version is not None else e.version(),
      conversation=conversation,
      example={**self.env.task, **{k: [v] for k, v in posted.fields.items() if k not in _INTERNAL}},
      group_id=self.env.extra_kwargs.get("group_id"),
      reward=posted.reward,
      calls=stitched.counts,
    )

  @staticmethod
  def _last_reply_length(stitched: session_stitching.Stitched) -> int:
    """The trained tokens of the conversation's last sampled run (its last reply)."""
    run = 0
    for m in stitched.masks[::-1]:
      if m == 1:
        run += 1
      elif run:
        break
    return run
