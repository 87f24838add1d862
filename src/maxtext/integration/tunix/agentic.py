"""Hands the cluster to Tunix's agentic GRPO learner (rl.use_agentic_rollout=true), whose training
loop is ours.

The agentic learner runs up to rl.max_concurrency single-prompt rollouts at once, overlaps them with
training and accepts samples at most rl.off_policy_steps policy versions old. Its prompts are the
user turn only (the agent adds the system turn and our ConfigChatParser renders the conversation).
The agent is our trajectories.ConversationAgent; with rl.tools it parses tool calls from
<tool_call>{json}</tool_call> and runs in a ToolEnvironment of at most rl.max_turns model turns.

From Tunix (google-tunix 0.1.7) the learner keeps its configuration, loss, reward manager,
advantage estimator, trajectory logger, its event loop, and its RolloutOrchestrator, built here
with our TrajectoryEngine. Its train() is ours (`train`, top to bottom: the prompt feed, the
producer, the trainer's loop, the weight sync), and so is its group scoring (`_score`: the examples
and metrics Tunix's builds, the model-free part in maxtext.rl.group_scoring); what they add to
Tunix's (why: docs/decisions.md, "Agentic learner"):
- full-length completions are kept, and later turns are sampled from the conversation's exact token
  stream (trajectories.TrajectoryEngine);
- rewards judge all assistant turns of a conversation joined (Tunix passes only the first);
- on a shared trainer/sampler mesh the anchor policy (the weights the old log-probs are computed
  with) is refreshed before each group is scored;
- the user turn is the example's templated user content, with tools too (Tunix's ToolAgent reads
  only a `question` field, the raw question, and drops the data template's user turn);
- a chat parser is always given; numpy message content is coerced
  to text by the parser;
- with the batched engine the old policy's log-probs are the sampler's (use_rollout_logps: the
  behaviour policy of an off-policy sample, whatever weights the trainer holds now); Tunix then
  recomputes them with the trainer for every group only to log the sampler/trainer agreement, a
  forward pass that is here run only with rl.sampler_is=token, which trains on it: otherwise the
  loss reports the agreement every step from its own forward pass (losses.mismatch_from_old); the
  vanilla engine returns no log-probs, so there the
  trainer computes them (an engine that returns none where they are expected fails the run);
- before_step runs between global steps, and the trainer logs its idle fraction and the staleness
  of what it trains on;
- across several processes (multi-controller JAX, where every process must launch the same global
  programs in the same order), each process samples its share of every batch
  (maxtext.rl.prompt_feed.ProcessShare) on its own devices, and the groups are scored on the
  training thread: each process's groups are gathered to every process, which scores them all in
  process order (reference and trainer log-probs run on the trainer's global mesh) as one process
  scores its own; the sampler's weights are synced after every step. Draws are named by (group,
  round, sample, turn) (step_keys.StepKeys.for_request), so the processes draw what one process
  would;
- dynamic sampling (rl.dynamic_sampling, one process) per prompt slot: the rule, its reserve prompts
  and metrics are maxtext.rl.dynamic_sampling.Slots, shared with the standard learner; here each
  prompt is tagged with its slot and round, a group without signal is dropped and its replacement
  fed, and the prompts outlast the data while slots are undecided (maxtext.rl.prompt_feed);
- a failed rollout fails the run: its error is raised from train(), and the prompt feed is closed
  whenever training ends (else the producer's threads block process exit).

The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

import grain
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.rl import function_registry
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl import utils as rl_utils
from tunix.rl.agentic import agentic_grpo_learner
from tunix.rl.agentic import utils as agentic_utils
from tunix.rl.agentic.pipeline import rollout_orchestrator

from maxtext.configs.sections import AgenticSection, AlgorithmSection, SamplingSection, ToolsSection, TrainSection
from maxtext.inference.openai_server import OpenAIServer
from maxtext.inference.sessions import SessionSampling
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.input_pipeline.rewards import RewardSet, others_mean_where
from maxtext.input_pipeline.rewards import summaries as reward_summaries
from maxtext.integration.tunix import cluster, losses, rollout, step_metrics, tool_format
from maxtext.integration.tunix import user_agent as user_agent_lib
from maxtext.integration.tunix.algorithm import grpo_config
from maxtext.integration.tunix.trajectories import (
  TrajectoryEngine,
  agent_kwargs,
  joined_assistant_turns,
  without_examples,
)
from maxtext.integration.tunix.wiring import LearnerWiring
from maxtext.rl import dynamic_sampling, group_scoring
from maxtext.rl.episode import Episode, EpisodeLog
from maxtext.rl.prompt_feed import ROUND, SLOT, ProcessShare, PromptFeed, scalar
from maxtext.utils import distributed

log = logging.getLogger(__name__)


def user_turn_batches(batches: grain.MapDataset) -> grain.MapDataset:
  """Training batches whose `prompts` are the user turns (the agent renders the conversation)."""
  return batches.map(lambda b: {**b, "prompts": b["user_content"]})


class RolloutError(RuntimeError):
  """A rollout (model call) of the agentic producer failed."""


class AgenticGRPOLearner(LearnerWiring, agentic_grpo_learner.GRPOLearner):
  """Tunix's agentic GRPO learner (its configuration, loss and reward manager) with our training
  loop (`train`) and group scoring (`_score`), collecting trajectories with TrajectoryEngine and logging the
  staleness of what it trains on: staleness/mean and staleness/max, the policy-version lag of the
  consumed samples (bounded by rl.off_policy_steps; with the batched engine a sample's version is
  that of its oldest token), and trainer/idle_fraction, the share of each step the trainer waited
  for samples. A failed rollout raises RolloutError from train(); a reward function's InputError is
  raised from train() as it is."""

  _feed: PromptFeed  # these two are made by train()
  _groups: queue.Queue  # finished groups for the trainer; None ends them
  _rollout_error: Exception | None = None
  _checked_step = -1

  def __init__(
    self,
    *args,
    batch_size: int,
    before_step: Callable[[int], None] | None = None,
    dynamic_sampling_rounds: int = 1,
    reserve: Callable[[int], dict] | None = None,
    rewards: RewardSet,
    user_agent: user_agent_lib.UserAgent | None = None,
    model_name: str = "",
    episode_log: EpisodeLog | None = None,
    **kwargs,
  ):
    """batch_size: prompts per step over all processes; before_step(steps_done) runs between global
    steps (it may raise to stop training);
    dynamic_sampling_rounds > 1: dynamic sampling per slot (maxtext.rl.dynamic_sampling.Slots), with
    reserve(i), the i-th reserve batch; rewards: the run's reward functions and weights (its reward
    manager's); user_agent: rl.agent's, whose episodes replace the run's own agent's (served as
    model_name, integration/tunix/user_agent.py); episode_log: the run's episode log (None: this
    process writes none)."""
    super().__init__(*args, reward_fns=[rewards], **kwargs)  # Tunix builds our manager (reward_manager.py)
    if self.chat_parser is None:
      raise ValueError("the agentic learner renders conversations with its chat parser; none was given")
    self._share = ProcessShare(jax.process_index(), jax.process_count(), batch_size)
    self._dynamic = (
      dynamic_sampling.Slots(dynamic_sampling_rounds, reserve, batch_size) if dynamic_sampling_rounds > 1 else None
    )
    # weight syncs wait for the rollouts under way; a user agent's episodes do not hold them back
    self._sync_lock = _EpisodesDoNotHoldSyncs() if user_agent is not None else agentic_utils.RolloutSyncLock()
    self._wire(before_step)
    if losses.mismatch_from_old(self.algo_config):
      self._log_loss_mismatch()
    self._conversation_lock = threading.Lock()
    self._conversation_totals: dict[int, collections.Counter] = {}
    self._drop_unread_anchor()
    self._user_agent, self._model_name = user_agent, model_name
    self._episodes: user_agent_lib.Episodes | None = None
    self._episode_log = episode_log
    self._layout_failures = 0

  # The training loop (training thread)

  def train(self, train_dataset, eval_dataset=None, skip_jit=False):
    """Trains on train_dataset's batches of batch_size prompts, from the step rl_cluster.global_steps
    (a resumed run skips that many batches), as Tunix's train does without its evaluation (ours runs
    in before_step; eval_dataset is not used):
    1. the feed is prefilled with rl.off_policy_steps + 1 batches, and the producer (`_produce`, on
       Tunix's event loop) samples them, num_generations conversations per prompt;
    2. the trainer takes train_micro_batch_size groups at a time (`_micro_batches`: before_step at
       each global step, the idle, staleness and batch checks) and updates the actor on them;
    3. after a global step's batch (batch_size groups, each trained once), the sampler gets the new
       weights under the rollout sync lock (policy_version += 1) where it does not share them (else
       global_steps += 1), and the feed the next batch.
    The loop ends with the groups (the data, max_steps or a failed rollout); the feed is closed
    whenever it ends, so no producer thread waits on it past training."""
    del eval_dataset
    config = self.rl_cluster.cluster_config.training_config
    data = iter(train_dataset)
    first = next(itertools.islice(data, self.rl_cluster.global_steps, None), None)
    if first is None:
      self.rl_cluster.close()
      return
    batch_size = len(next(iter(first.values())))
    micro = config.train_micro_batch_size or config.mini_batch_size or batch_size
    data = itertools.chain([first], data)
    self._feed = PromptFeed(self._share, self._dynamic, first_step=self.rl_cluster.global_steps)
    self._groups = queue.Queue()
    if self._user_agent is not None:
      self._episodes = self._serve(self._user_agent)
    try:
      for _ in range(self.algo_config.off_policy_steps + 1):
        if not self._feed_next(data, batch_size):
          break
      producer = asyncio.run_coroutine_threadsafe(self._produce(), self.loop)
      self._train_on(self._micro_batches(micro), data, batch_size, batch_size // micro, skip_jit)
    finally:
      self._feed.close()
      if self._episodes is not None:
        self._episodes.close()
        self._episodes.server.stop()
    if isinstance(self._rollout_error, user_agent_lib.AgentFailed):
      raise self._rollout_error  # the user's agent failed past its budget: one line, as other user code
    if self._rollout_error is not None:
      raise RolloutError(f"an agentic rollout failed: {self._rollout_error}") from self._rollout_error
    producer.result()  # the producer's own error (a reward function's InputError) is raised as it is
    self._anchor = None  # the host copy of the weights groups were scored with: unused after training
    self.rl_cluster.close()

  def _train_on(self, micro_batches, data, batch_size: int, per_step: int, skip_jit: bool) -> None:
    """Updates the actor on each micro-batch, train_micro_batch_size groups, as one trainer step
    (Tunix splits a micro-batch into steps of that size: here it is one); a global step ends after
    per_step of them, and the loop at max_steps."""
    max_steps = self.rl_cluster.cluster_config.training_config.max_steps
    done, started = 0, time.time()
    for examples in micro_batches:
      if max_steps and self.rl_cluster.global_steps >= max_steps:
        self._feed.end()
        break
      merged = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *examples)
      self.rl_cluster.update_actor([merged], None, skip_jit)
      done += 1
      if done == per_step:
        elapsed = time.time() - started
        self._log({"perf/global_step_time": (elapsed, np.mean)}, self.rl_cluster.global_steps)
        self._next_global_step(data, batch_size)
        self._log({})  # RLCluster logs a step's metrics when a call finds global_steps moved on: now
        done, started = 0, time.time()

  def _next_global_step(self, data, batch_size: int) -> None:
    """The sampler gets the trained weights where it does not share them (RLCluster.sync_weights
    counts the step), under the rollout sync lock; then the feed gets the next batch."""
    if not self.should_sync_weights:
      self.rl_cluster.global_steps += 1
      self._feed_next(data, batch_size)
      return
    self._sync_lock.acquire_weight_sync()
    try:
      self.rl_cluster.sync_weights()
      self._drop_unread_anchor()
      self.policy_version += 1
      self._feed_next(data, batch_size)
    finally:
      self._sync_lock.release_weight_sync()

  def _feed_next(self, data, batch_size: int) -> bool:
    """Hands the next batch to the feed, or ends it (no batch left, max_steps reached, or a batch
    short of batch_size); whether a batch was handed."""
    batch = next(data, None)
    max_steps = self.rl_cluster.cluster_config.training_config.max_steps
    if batch is None or (max_steps and self.rl_cluster.global_steps >= max_steps):
      self._feed.end()
      return False
    size = len(next(iter(batch.values())))
    if size != batch_size:
      log.warning("a batch of %d prompts, not %d: the rest of the data is skipped", size, batch_size)
      self._feed.end()
      return False
    self._feed.put(batch)
    return True

  def _micro_batches(self, micro: int):
    """The trainer's micro-batches, lists of the TrainExamples of `micro` groups: one process takes
    the groups the producer scored; across processes each takes its share of them as sampled and
    every process's are scored here (_scored). Per global step it runs before_step, and logs the
    trainer's idle fraction (the wait for a step's micro-batches, scoring across processes included)
    and the staleness of what it trains on; every micro-batch's group layout is checked. Ends when
    the producer ends (or a failed rollout stops it)."""
    groups = iter(self._groups.get, None)
    idle = step_metrics.IdleClock()
    while True:
      idle.wait_starts()
      taken = list(itertools.islice(groups, micro // self._share.count))
      if not taken:
        break
      batch = self._scored(taken) if self._share.count > 1 else [ex for group in taken for ex in group]
      new_step = self.rl_cluster.actor_trainer.train_steps != self._checked_step
      if new_step:  # the step's window opens with the wait for its first batch
        self._log_idle(idle.close(at=idle.wait_start), at_its_step=True)
        idle.open(self.rl_cluster.global_steps, at=idle.wait_start)
      idle.wait_ends()
      if new_step:
        self._checked_step = self.rl_cluster.actor_trainer.train_steps
        self._step_starts(self._checked_step)
      self._check_batch(np.concatenate([ex.prompt_ids for ex in batch]))
      versions = [np.asarray(ex.policy_version).reshape(-1) for ex in batch if ex.policy_version is not None]
      if versions:
        self._log(
          step_metrics.staleness(self._current_version(), np.concatenate(versions)), self.rl_cluster.global_steps
        )
      yield batch
    self._log_idle(idle.close(at=idle.wait_start), at_its_step=True)

  def _current_version(self) -> int:
    """The version lags are measured from: the engine's weights version when it tags tokens, else
    Tunix's policy version."""
    version = self._engine.version
    return self.policy_version if version is None else version

  def _serve(self, agent: user_agent_lib.UserAgent) -> user_agent_lib.Episodes:
    """The policy served at rl.agent_host:rl.agent_port from the batched engine's batcher, and what the
    user's episodes share: sessions sample as the training rollouts do, each turn's key named by
    (group, round, sample, turn) as the run's own agent's."""
    engine = self._engine
    batcher, keys = getattr(engine, "batcher", None), engine.keys
    if batcher is None or keys is None:
      raise ValueError(f"rl.agent is served from the batched engine's batcher; {type(engine).__name__} has none")
    server = OpenAIServer(
      batcher,
      self.chat_parser.tokenizer,
      self.chat_parser,
      self._model_name,
      keys,
      tool_format.for_tokenizer(self.chat_parser.tokenizer),
      api_key=agent.api_key,
      sessionless=agent.sessionless,
      # the run's own episodes never meet a 429: their workers do not retry (a retry is recorded twice)
      max_queued=max(256, 16 * self.algo_config.max_concurrency),
    )
    base_url = server.start(agent.host, agent.port, ("rl.agent_host", "rl.agent_port"))
    if agent.over_http and agent.verifiers is None:
      log.info(
        "Serving the policy for rl.agent=http at %s: take episodes at POST %s/episodes/next, post rewards at "
        "POST %s/sessions/ID/reward",
        base_url,
        base_url.removesuffix("/v1"),
        base_url.removesuffix("/v1"),
      )
    else:
      log.info("Serving the policy for rl.agent=%s at %s (a session per episode)", agent.spec, base_url)
    config = self.rl_cluster.get_rollout_config(rl_cluster_lib.Mode.TRAIN)

    def sampling(env) -> SessionSampling:
      group, pair = env.extra_kwargs["group_id"], env.extra_kwargs["pair_index"]
      rnd = scalar(env.task.get(ROUND, 0))
      return SessionSampling(
        temperature=config.temperature,
        top_p=config.top_p or 1.0,
        top_k=config.top_k,
        key=lambda turn: keys.for_request(group, rnd, pair, turn),
        budget=self.algo_config.max_response_length,
      )

    return user_agent_lib.Episodes(
      server=server,
      base_url=base_url,
      agent=agent,
      model=self._model_name,
      opening=self._opening(),
      sampling=sampling,
      budget=self.algo_config.max_response_length,
      prompt_budget=config.max_prompt_length,
      failures=user_agent_lib.Failures(agent),
      version=self._current_version,
      stop=self._stop_rollouts,
      concurrency=self.algo_config.max_concurrency,
    )

  def _opening(self) -> list[dict[str, str]]:
    """The turns before the user turn as the run's own agent opens its conversations (without the
    tools' descriptions, which a request's `tools` add): the system prompt's turn, where there is one,
    and the data template's example turns."""
    parser = self.chat_parser
    system = [{"role": "system", "content": parser.system_prompt}] if parser.system_prompt else []
    return [*system, *({"role": t["role"], "content": t["content"]} for t in parser.example_turns)]

  # The producer (Tunix's event loop and its executor's threads)

  async def _produce(self) -> None:
    """Samples the feed's prompts, num_generations conversations each (rl.max_concurrency at once,
    by Tunix's RolloutOrchestrator with our TrajectoryEngine), and queues each finished group for
    the trainer: one process scores it first (_score, with dynamic sampling
    nothing where it is dropped); across processes it goes as sampled, for the training thread.
    The end of the groups is queued whatever ends it."""
    generations = self.algo_config.num_generations
    if self._episodes is not None:
      engine_cls: type = user_agent_lib.AgentEpisode
      engine_kwargs: dict = dict(episodes=self._episodes)
    else:
      engine_cls = TrajectoryEngine
      engine_kwargs = dict(
        model_call=self._model_turn,
        tokenizer=self.tokenizer,
        chat_parser=self.chat_parser,
        timeout=self.algo_config.episode_timeout,
        max_response_length=self.algo_config.max_response_length,
        overlong_filter=self.algo_config.overlong_filter,
        filter_statuses=self.algo_config.filter_statuses,
      )
    orchestrator = rollout_orchestrator.RolloutOrchestrator(
      engine_cls=engine_cls,
      engine_kwargs=engine_kwargs,
      max_concurrency=self.algo_config.max_concurrency,
      rollout_sync_lock=self._sync_lock,
    )
    sampling = asyncio.create_task(
      orchestrator.run_producers_from_stream(
        pairs_stream=self._conversations(self._feed.prompts(self.loop)),
        group_size=generations,
        group_key_fn=lambda i, env, traj: env.extra_kwargs["group_id"],
        collect_mode="Token",
      )
    )
    await asyncio.sleep(0)  # the orchestrator starts its queue before its groups are read
    try:
      async with contextlib.aclosing(orchestrator.yield_batches(batch_size=generations)) as finished:
        async for group in finished:
          queued = group if self._share.count > 1 else self._trained(group, self._score(group))
          if queued:
            self._groups.put(queued)
    finally:
      self._groups.put(None)
      sampling.cancel()
      # Its end is retrieved (an error of it came through yield_batches), so asyncio logs nothing.
      sampling.add_done_callback(lambda task: task.cancelled() or task.exception())

  async def _conversations(self, prompts):
    """(agent, environment) pairs, num_generations per prompt, made in the executor (an environment
    may take a while to start); a prompt's slot is its group id."""
    loop = asyncio.get_running_loop()
    async for prompt in prompts:
      slot = scalar(prompt[SLOT])
      pairs = await asyncio.gather(
        *[
          loop.run_in_executor(None, self._conversation, copy.deepcopy(prompt), slot, i)
          for i in range(self.algo_config.num_generations)
        ]
      )
      for pair in pairs:
        yield pair

  def _conversation(self, prompt: dict, group_id: int, pair_index: int):
    """One (agent, environment) pair, as Tunix's learner makes it from its agent and env classes."""
    agent = self.agent_class(**{"system_prompt": self.algo_config.system_prompt, **self.agent_kwargs})
    env = self.env_class(prompt, **{"group_id": group_id, "pair_index": pair_index, **self.env_kwargs})
    return agent, env

  def _model_turn(self, chat_lists, env=None, max_generation_steps=None, prompt_ids=None):
    """One model turn of a conversation: the first renders `chat_lists` with the chat parser, a later
    one continues the conversation's token stream `prompt_ids` (TrajectoryEngine). The engine is
    called with the turn's own key (_turn_key) in its rollout config, and the tokens' weights versions
    come back in its output (rollout.versions_of): nothing passes through per-thread state. A failure
    is kept for train() to raise and stops the feed and the trainer's wait.

    Tunix's learner goes through RLCluster.generate, which takes no seed and drops the versions
    from the output; what else it does is not needed here: the chat template (the parser renders),
    micro-batching (one prompt), the rollout mesh context (the vanilla engine enters its mesh, the
    batched engine's batcher thread places its own work; no logical axis rules are set), CPU
    offloading (not enabled) and perf tracing (not configured)."""
    try:
      if env is not None:
        env.task["policy_version"] = self.policy_version
      if prompt_ids is None:
        prompt = self.chat_parser.parse(messages=chat_lists, add_generation_prompt=True, is_first_msg=True)
      else:
        prompt = prompt_ids
      out = self._engine.generate([prompt], self._turn_config(env, max_generation_steps))
      if self.algo_config.use_rollout_logps and out.logprobs is None:
        raise ValueError(
          f"the old policy's log-probs are the sampler's here, but the rollout engine "
          f"{type(self.rl_cluster.rollout).__name__} returned none (Tunix would train against "
          "zeros); the batched engine returns them"
        )
    except Exception as e:
      self._stop_rollouts(e)
      raise
    versions = rollout.versions_of(out)
    if env is not None and versions and len(versions[0]):
      # The sample's version is that of its oldest token over all turns (Tunix tags the latest call).
      env.task["policy_version"] = env.task[_OLDEST_VERSION] = min(
        int(versions[0].min()), env.task.get(_OLDEST_VERSION, int(versions[0].min()))
      )
    return out

  def _stop_rollouts(self, e: Exception) -> None:
    """Keeps the first rollout failure for train() to raise, and stops the feed and the trainer's wait."""
    if self._rollout_error is None:
      self._rollout_error = e
    self._feed.close()
    self._groups.put(None)

  @property
  def _engine(self) -> rollout.Engine:
    return self.rl_cluster.rollout

  def _turn_config(self, env, max_generation_steps: int | None):
    """The training rollout config for a conversation's next turn: its generation budget, and as its
    seed the turn's key when it draws (not greedy) and the config names none."""
    config = self.rl_cluster.get_rollout_config(rl_cluster_lib.Mode.TRAIN)
    if max_generation_steps is not None:
      config = dataclasses.replace(config, max_tokens_to_generate=max_generation_steps)
    key = self._turn_key(env)
    if key is not None and config.seed is None and config.temperature:
      config = dataclasses.replace(config, seed=key)
    return config

  def _turn_key(self, env) -> jax.Array | None:
    """The sampling key of a conversation's next turn, named by its (group, dynamic sampling round,
    sample, turn) (StepKeys.for_request): the same whichever threads' calls come first; None for an
    engine without keys or a call outside a conversation."""
    keys = self._engine.keys
    if env is None or keys is None:
      return None
    turn = env.task.get(_TURNS, 0)
    env.task[_TURNS] = turn + 1
    rnd = scalar(env.task.get(ROUND, 0))
    return keys.for_request(env.extra_kwargs["group_id"], rnd, env.extra_kwargs["pair_index"], turn)

  # Scoring (the producer in one process, the training thread across processes)

  def _score(self, group: list) -> list:
    """A group's TrainExamples, as Tunix's GRPO scoring builds them (one example of the whole group,
    its metrics at the group's step), after what ours adds: the anchor on a shared mesh, the group
    laid out under one prompt (group_scoring.layout; the episodes it fails are counted), the tool and
    turn metrics, example turns left out and every assistant turn in the rewarded completion (Tunix
    rewards the first), and each episode's line in the episode log. The model-free work is
    maxtext.rl.group_scoring's; here the rewards (the reward manager), advantages (Tunix's
    estimator), the trainer's log-probs (_trainer_logps, where _trainer_recomputes) and the
    reference's (with rl.grpo_beta != 0)."""
    step = self._share.step_of(group[0].group_id)
    # On a shared mesh the samples came from the live weights: they are the anchor.
    if self._trainer_recomputes() and not self.should_sync_weights:
      self._anchor = rl_utils.put_params_on_memory_kind(nnx.state(self.rl_cluster.actor_trainer.model), "pinned_host")
    shapes = self._shapes()
    sampled: list[Episode] = [item.traj for item in group]
    episodes = group_scoring.layout(sampled, shapes)
    for before, after in zip(sampled, episodes):
      if after.failed and not before.failed:
        self._count_failure(after.failure or "")
    self._log_conversations([without_examples(e.conversation) for e in episodes], step)
    padded = group_scoring.pad(episodes, shapes, self.algo_config.use_rollout_logps)
    prompt_ids, completion_ids = jnp.asarray(padded.prompt_ids), jnp.asarray(padded.completion_ids)
    trainer_logps = self._trainer_logps(prompt_ids, completion_ids) if self._trainer_recomputes() else None
    ref_logps = self._reference_logps(prompt_ids, completion_ids) if self.algo_config.beta != 0.0 else None
    self._log(padded.prompt_metrics(), step)
    rewards = self._rewards(episodes, step)
    self._log_episodes(episodes, rewards, step)
    estimator = function_registry.get_advantage_estimator(self.algo_config.advantage_estimator)
    advantages = estimator(rewards=rewards, num_generations=self.algo_config.num_generations)
    scored = group_scoring.score(episodes, padded, advantages, trainer_logps, self._scoring_options())
    self._log(scored.metrics, step)
    example = agentic_grpo_learner.TrainExample(
      prompt_ids=prompt_ids,
      prompt_mask=prompt_ids != shapes.pad_id,
      completion_ids=completion_ids,
      completion_mask=scored.completion_mask,
      ref_per_token_logps=ref_logps,
      advantages=advantages,
      old_per_token_logps=scored.old_logps,
      policy_version=np.array([e.version for e in episodes], dtype=np.int32),
      sampler_is_weights=scored.sampler_is_weights,
    )
    return [example]

  def _count_failure(self, why: str) -> None:
    """An episode its group's layout failed: counted with the user agent's failures (which may stop
    the run: AgentFailed), else logged the first time."""
    if self._episodes is not None:
      self._episodes.count(why)
    elif not self._layout_failures:
      log.warning("an episode trains nothing (more are counted in agent/failed_episodes): %s", why)
    self._layout_failures += 1

  def _rewards(self, episodes: list[Episode], step: int) -> np.ndarray:
    """The group's rewards: the reward manager judges each episode's completion (every assistant
    turn's text joined; a user agent's last reply) given the prompt's other fields and the
    environments' own rewards and the fields a user agent posted as keyword arguments, as Tunix's
    scoring calls it (its log_metrics are
    logged at `step`), or where a user agent returned one its own. A failed episode's reward is its
    group's others' mean, so it does not move their baseline (an unscored sample's rule)."""
    completions = [_completion(e) for e in episodes]
    named = {k for e in episodes for k in e.example}  # a field posted for some episodes only is None for the rest
    inputs = rl_utils.merge_micro_batches([{**dict.fromkeys(named, [None]), **e.example} for e in episodes])
    kwargs = {k: v for k, v in inputs.items() if k != "prompts"}
    kwargs["trajectory_rewards"] = [e.trajectory_reward for e in episodes]
    own = [e.reward for e in episodes]
    if self._user_agent is not None and all(r is not None for r in own):
      values = np.asarray(own, np.float32)  # the agent's rewards alone: no reward function is called
      self._log(reward_summaries(values, values[:, None]), step)  # one reward each, as one function's
    else:
      rewards = self.reward_manager(
        prompts=inputs["prompts"], completions=completions, mode=str(rl_cluster_lib.Mode.TRAIN), **kwargs
      )
      self._log(rewards["log_metrics"], step)
      values = np.asarray(rewards["rewards"], np.float32)
      values = np.asarray([v if r is None else r for v, r in zip(values, own)], np.float32)
    failed = np.array([e.failed for e in episodes])
    return others_mean_where(values, failed, self.algo_config.num_generations).astype(np.float32)

  def _log_episodes(self, episodes: list[Episode], rewards: np.ndarray, step: int) -> None:
    """agent/*: the group's failed episodes (every producer's; sums over the step), and for a user
    agent the calls left out of the trained conversation (mismatched prefixes, branches, retries) and
    tokens cut past max_response_length (sums), the calls an episode trained and the rewards trained
    on (means); and each episode's line in the episode log."""
    values: dict[str, tuple[float, Callable]] = {
      "agent/failed_episodes": (float(sum(e.failed for e in episodes)), np.sum)
    }
    calls = [e.calls for e in episodes if e.calls is not None]
    if calls:
      values.update(
        {
          "agent/mismatched_calls": (float(sum(c.mismatched for c in calls)), np.sum),
          "agent/branched_calls": (float(sum(c.branches for c in calls)), np.sum),
          "agent/retried_calls": (float(sum(c.retries for c in calls)), np.sum),
          "agent/cut_tokens": (float(sum(c.cut for c in calls)), np.sum),
          "agent/calls_per_episode": (float(np.mean([c.calls for c in calls])), np.mean),
          "agent/reward": (float(rewards.mean()), np.mean),
        }
      )
    self._log(values, step)
    if self._episode_log is not None:
      self._episode_log.write(episodes, rewards.tolist(), step)

  def _shapes(self) -> group_scoring.Shapes:
    engine = self.rl_cluster.rollout
    return group_scoring.Shapes(
      max_prompt_length=self.rl_cluster.get_rollout_config(rl_cluster_lib.Mode.TRAIN).max_prompt_length,
      max_response_length=self.algo_config.max_response_length,
      pad_id=engine.pad_id(),
      eos_id=engine.eos_id(),
    )

  def _scoring_options(self) -> group_scoring.Options:
    return group_scoring.Options(
      sampler_is=self.algo_config.sampler_is == "token",
      sampler_is_threshold=self.algo_config.sampler_is_threshold,
      mask_degenerate=self.algo_config.degenerate_group_masking,
    )

  def _scored(self, groups: list) -> list:
    """Every process's groups of this micro-batch, in process order, scored one group at a time."""
    every = [group for part in distributed.gather_objects(groups) for group in part]
    return [ex for group in every for ex in self._trained(group, self._score(group))]

  def _trained(self, group: list, examples: list) -> list:
    """What of a scored group trains: all of it, or with dynamic sampling nothing where its rewards
    are all equal and its slot has rounds left (a reserve prompt takes its place). Logs
    frac_reward_zero_std over the trained groups and dynamic_sampling/* (the rule and its metrics:
    maxtext.rl.dynamic_sampling.Slots)."""
    zero, _ = self._zero_signal(np.concatenate([np.asarray(e.advantages).reshape(-1) for e in examples]))
    slot = group[0].group_id
    step = self._share.step_of(slot)
    if self._dynamic is not None:
      rnd = scalar(group[0].traj.example[ROUND])
      replacement = self._dynamic.decide(slot, rnd, bool(zero))
      self._log({k: (v, step_metrics.last) for k, v in self._dynamic.metrics(step).items()}, step)
      if replacement is not None:
        assert self._feed is not None
        self._feed.replace(slot, rnd + 1, replacement)
        return []
    self._log_zero_signal_so_far(zero, step)
    return examples

  def _trainer_recomputes(self) -> bool:
    """Whether the trainer recomputes a group's log-probs: where they are the old policy's (vanilla
    engine) or sampler_is=token trains on them. Otherwise the loss reports the sampler/trainer
    mismatch from the sampler's log-probs (losses.mismatch_from_old)."""
    return not losses.mismatch_from_old(self.algo_config)

  def _drop_unread_anchor(self) -> None:
    """Drops the host copy of the weights RLCluster keeps (when it is built and at each sync) where
    the trainer recomputes no log-probs (_trainer_recomputes), so never reads it."""
    if not self._trainer_recomputes():
      self._anchor = None

  def _trainer_logps(self, prompt_ids: jax.Array, completion_ids: jax.Array) -> jax.Array:
    """The completions' log-probs under the anchor weights (those of the last sync, or on a shared
    mesh those the samples came from) at the training rollouts' temperature, where Tunix calls
    RLCluster.get_actor_per_token_logps, on the trainer's mesh as the reference's
    (cluster.global_token_logps); Tunix takes them from the model's whole float32 logits [B, T, vocab]."""
    rl_cluster = self.rl_cluster
    temperature = rl_cluster.get_rollout_config(mode=rl_cluster_lib.Mode.TRAIN).temperature
    state = rl_utils.put_params_on_memory_kind(self._anchor, jax.devices()[0].default_memory().kind)
    model = nnx.merge(nnx.graphdef(rl_cluster.actor_trainer.model), state)
    shapes = self._shapes()
    return cluster.global_token_logps(
      model,
      rl_cluster.r2m[rl_cluster_lib.Role.ACTOR],
      prompt_ids,
      completion_ids,
      shapes.pad_id,
      shapes.eos_id,
      temperature,
    )

  def _reference_logps(self, prompt_ids: jax.Array, completion_ids: jax.Array) -> jax.Array:
    """The reference's log-probs of the completions, through the cluster (cluster.Cluster)."""
    shapes = self._shapes()
    return self.rl_cluster.get_ref_per_token_logps(
      prompt_tokens=prompt_ids,
      completion_tokens=completion_ids,
      pad_id=shapes.pad_id,
      eos_id=shapes.eos_id,
      micro_batch_size=self.rl_cluster.cluster_config.training_config.compute_logps_micro_batch_size,
    )

  def _log_zero_signal_so_far(self, zero: int, step: int) -> None:
    """frac_reward_zero_std over the step's trained groups so far (running totals, as _log_conversations)."""
    with self._conversation_lock:
      totals = self._conversation_totals.setdefault(step, collections.Counter())
      totals.update({"zero_signal_groups": zero, "groups": 1})
      fraction = totals["zero_signal_groups"] / totals["groups"]
    self._log_zero_signal(fraction, step_metrics.last, step)

  def _log_conversations(self, conversations: list[list[dict]], step: int) -> None:
    """Logs the step's tool and turn metrics from running totals, and step_metrics.rollout_metrics: a
    step's metrics are logged in several parts when groups of different steps finish interleaved,
    and a later part replaces an earlier one, so each part carries the totals so far (the last value
    of a part is kept)."""
    with self._conversation_lock:
      totals = self._conversation_totals.setdefault(step, collections.Counter())
      totals.update(step_metrics.conversation_counts(conversations))
      counts = {k: (v, step_metrics.last) for k, v in step_metrics.conversation_metrics(totals).items()}
      self._log({**counts, **step_metrics.rollout_metrics(self.rl_cluster)}, step)


_OLDEST_VERSION = "oldest_token_policy_version"


class _EpisodesDoNotHoldSyncs(agentic_utils.RolloutSyncLock):
  """The rollout sync lock of rl.agent's runs. Tunix's orchestrator holds a rollout lock over each
  whole episode, and a weight sync waits for every episode under way: a user's agent may take
  minutes. Here episodes take no lock, and a sync pauses the batcher between decode chunks instead
  (BatchedRolloutEngine.update_params): requests in flight wait for it and go on with the new
  weights, their tokens tagged with the new version."""

  def acquire_rollout(self):
    pass

  def release_rollout(self):
    pass


_TURNS = "model_turns_started"


def _completion(episode: Episode) -> str:
  """What the reward functions judge of an episode: a user agent's last reply, else every assistant
  turn's text joined (the first assistant message of joined_assistant_turns), example turns left out;
  "" without one."""
  conversation = without_examples(episode.conversation)
  if episode.calls is None:
    conversation = joined_assistant_turns(conversation)
  replies = [m["content"] for m in conversation if m["role"] == "assistant"]
  return "" if not replies else str(replies[-1] if episode.calls is not None else replies[0])


def build_learner(
  train: TrainSection,
  rl: AlgorithmSection,
  sampling: SamplingSection,
  agentic: AgenticSection,
  tools: ToolsSection,
  cluster,
  rewards: RewardSet,
  parser: ConfigChatParser,
  tool_map=None,
  before_step: Callable[[int], None] | None = None,
  reserve: Callable[[int], dict] | None = None,
  user_agent: user_agent_lib.UserAgent | None = None,
  model_name: str = "",
  episode_log: EpisodeLog | None = None,
) -> AgenticGRPOLearner:
  """reserve(i): the i-th reserve batch of user turns (needed with rl.dynamic_sampling); user_agent:
  rl.agent's (load), served as model_name; episode_log: the run's episode log (None: none)."""
  return AgenticGRPOLearner(
    user_agent=user_agent,
    episode_log=episode_log,
    model_name=model_name,
    batch_size=train.batch_size,
    dynamic_sampling_rounds=dynamic_sampling.max_rounds(rl),
    reserve=reserve,
    before_step=before_step,
    rl_cluster=cluster,
    algo_config=grpo_config(rl, sampling, agentic, parser.system_prompt),
    rewards=rewards,
    chat_parser=parser,
    **agent_kwargs(tools, tool_map, parser.example_turns),
  )
