"""Hands the cluster to Tunix's agentic GRPO learner (rl.use_agentic_rollout=true).

The agentic learner runs up to rl.max_concurrency single-prompt rollouts at once, overlaps them with
training and accepts samples at most rl.off_policy_steps policy versions old. Its prompts are the
user turn only (the agent adds the system turn and our ConfigChatParser renders the conversation).
The agent is our trajectories.ConversationAgent; with rl.tools it parses tool calls from
<tool_call>{json}</tool_call> and runs in a ToolEnvironment of at most rl.max_turns model turns.
What this adds to google-tunix 0.1.7's learner (why: docs/decisions.md, "Agentic learner"):
- full-length completions are kept, and later turns are sampled from the conversation's exact token
  stream (trajectories.TrajectoryEngine);
- rewards judge all assistant turns of a conversation joined (Tunix passes only the first);
- on a shared trainer/sampler mesh the anchor policy (the weights the old log-probs are computed
  with) is refreshed before each batch is scored;
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
- across several processes (multi-controller JAX, where every process must launch the same global
  programs in the same order), each process samples its share of every batch (ProcessShare) on its
  own devices, and the groups are scored on the training thread: each process's groups are gathered
  to every process, which scores them all in process order (reference and trainer log-probs run on
  the trainer's global mesh) as one process scores its own; the sampler's weights are synced after
  every step. Draws are named by (group, round, sample, turn) (step_keys.StepKeys.for_request), so
  the processes draw what one process would;
- dynamic sampling (rl.dynamic_sampling, one process) per prompt slot: the rule, its reserve prompts
  and metrics are maxtext.rl.dynamic_sampling.Slots, shared with the standard learner; here each
  prompt is tagged with its slot and round, a group without signal is dropped and its replacement
  queued, and the prompt stream outlasts the data while slots are undecided (_PromptStream);
- a failed rollout fails the run: its error is raised in the training loop, and the producer's
  queues are closed whenever training ends (else its threads block process exit).

The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import queue
import threading
from collections.abc import Callable

import grain
import jax
import numpy as np
from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl import utils as rl_utils
from tunix.rl.agentic import agentic_grpo_learner
from tunix.rl.agentic.pipeline import rollout_orchestrator

from maxtext.configs.sections import AgenticSection, AlgorithmSection, SamplingSection, ToolsSection, TrainSection
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.integration.tunix import losses, rollout, step_metrics
from maxtext.integration.tunix.algorithm import grpo_config
from maxtext.integration.tunix.trajectories import (
  TrajectoryEngine,
  agent_kwargs,
  joined_assistant_turns,
  without_examples,
)
from maxtext.integration.tunix.wiring import LearnerWiring
from maxtext.rl import dynamic_sampling
from maxtext.utils import distributed, errors
from maxtext.utils import mesh as mesh_lib


def user_turn_batches(batches: grain.MapDataset) -> grain.MapDataset:
  """Training batches whose `prompts` are the user turns (the agent renders the conversation)."""
  return batches.map(lambda b: {**b, "prompts": b["user_content"]})


@dataclasses.dataclass(frozen=True)
class ProcessShare:
  """Process `index` of `count` samples rows [index * size, (index + 1) * size) of every batch of
  batch_size prompts (size = batch_size / count). A prompt's slot, step * batch_size + row, names
  its group (its step, its sampling keys) as one process would."""

  index: int
  count: int
  batch_size: int

  @property
  def size(self) -> int:
    return self.batch_size // self.count

  def rows(self, batch: dict) -> dict:
    start = self.index * self.size
    return {k: v[start : start + self.size] for k, v in batch.items()}

  def slots(self, step: int) -> list[int]:
    start = step * self.batch_size + self.index * self.size
    return list(range(start, start + self.size))


# Fields the producer adds to each prompt: its slot (see ProcessShare) and its dynamic sampling round.
SLOT, ROUND = "group_slot", "sampling_round"


def _scalar(value) -> int:
  return int(np.asarray(value).reshape(-1)[0])


class RolloutError(RuntimeError):
  """A rollout (model call) of the agentic producer failed."""


class AgenticGRPOLearner(LearnerWiring, agentic_grpo_learner.GRPOLearner):
  """Tunix's agentic GRPO learner collecting trajectories with TrajectoryEngine and logging
  the staleness of what it trains on: staleness/mean and staleness/max, the policy-version lag
  of the consumed samples (bounded by rl.off_policy_steps; with the batched engine a sample's
  version is that of its oldest token), and trainer/idle_fraction, the share of each step the
  trainer waited for samples. A failed rollout raises RolloutError from train(); a reward function's
  InputError is raised from train() as it is."""

  _prompt_queue = None
  _train_queue = None
  _rollout_error: Exception | None = None
  _input_error: errors.InputError | None = None
  _checked_step = -1

  def __init__(
    self,
    *args,
    batch_size: int,
    before_step: Callable[[int], None] | None = None,
    dynamic_sampling_rounds: int = 1,
    reserve: Callable[[int], dict] | None = None,
    **kwargs,
  ):
    """batch_size: prompts per step over all processes; before_step(steps_done) runs between global
    steps (it may raise to stop training);
    dynamic_sampling_rounds > 1: dynamic sampling per slot (maxtext.rl.dynamic_sampling.Slots), with
    reserve(i), the i-th reserve batch."""
    super().__init__(*args, **kwargs)
    if self.chat_parser is None:
      raise ValueError("the agentic learner renders conversations with its chat parser; none was given")
    self._share = ProcessShare(jax.process_index(), jax.process_count(), batch_size)
    self._next_step = 0  # the step of the next batch the producer takes
    self._dynamic = (
      dynamic_sampling.Slots(dynamic_sampling_rounds, reserve, batch_size) if dynamic_sampling_rounds > 1 else None
    )
    self._closing = False
    self._wire(before_step)
    if losses.mismatch_from_old(self.algo_config):
      self._log_loss_mismatch()
    self.rl_cluster.get_actor_per_token_logps = self._trainer_logps
    self._conversation_lock = threading.Lock()
    self._conversation_totals: dict[int, collections.Counter] = {}

  def train(self, *args, **kwargs):
    self._next_step = self.rl_cluster.global_steps
    try:
      super().train(*args, **kwargs)
    finally:
      self._close_queues()

  def _close_queues(self) -> None:
    self._closing = True
    for q in (self._prompt_queue, self._train_queue):
      if q is not None:
        q.put(None)

  def _model_call(self, chat_lists, env=None, max_generation_steps=None, prompt_ids=None):
    """One model turn of a conversation: the first renders `chat_lists` with the chat parser, a later
    one continues the conversation's token stream `prompt_ids` (TrajectoryEngine). The engine is
    called with the turn's own key (_turn_key) in its rollout config, and the tokens' weights versions
    come back in its output (rollout.versions_of): nothing passes through per-thread state.

    Tunix's _model_call goes through RLCluster.generate, which takes no seed and drops the versions
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
      if self._rollout_error is None:
        self._rollout_error = e
      self._close_queues()
      raise
    versions = rollout.versions_of(out)
    if env is not None and versions and len(versions[0]):
      # The sample's version is that of its oldest token over all turns (Tunix tags the latest call).
      env.task["policy_version"] = env.task[_OLDEST_VERSION] = min(
        int(versions[0].min()), env.task.get(_OLDEST_VERSION, int(versions[0].min()))
      )
    return out

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
    rnd = _scalar(env.task.get(ROUND, 0))
    return keys.for_request(env.extra_kwargs["group_id"], rnd, env.extra_kwargs["pair_index"], turn)

  def _AsyncQueueIterator(self, q, loop):  # noqa: N802 (Tunix's name for the producer's prompt stream)
    return _PromptStream(q, loop, self)

  def _create_micro_batch_iterator(self, full_batch_iterator, micro_batch_size):
    """The producer's prompts: this process's share of each batch, each tagged with its slot and
    round (a dynamic sampling replacement comes tagged)."""

    def tagged(batches):
      for batch in batches:
        if SLOT not in batch:
          batch = self._share.rows(batch)
          slots = self._share.slots(self._next_step)
          self._next_step += 1
          batch = {**batch, SLOT: np.asarray(slots), ROUND: np.zeros(len(slots), np.int64)}
          if self._dynamic is not None:
            self._dynamic.started(len(slots))
        yield batch

    return super()._create_micro_batch_iterator(tagged(full_batch_iterator), micro_batch_size)

  def _create_agent_env_pair(self, single_example, group_id, pair_index):
    del group_id  # Tunix counts the prompts this producer started; the slot names the group
    return super()._create_agent_env_pair(single_example, _scalar(single_example[SLOT]), pair_index)

  def _batch_to_train_example(self, batch_results, mode):
    """A group's TrainExamples; across processes the producer queues the group unscored (_scored)."""
    if mode != rl_cluster_lib.Mode.TRAIN:
      return super()._batch_to_train_example(batch_results, mode)
    if self._share.count > 1:
      return [batch_results]
    try:
      return self._trained(batch_results, super()._batch_to_train_example(batch_results, mode))
    except errors.InputError as e:
      # Tunix's producer logs the traceback of anything but a RuntimeError it stops on; the consumer
      # raises the error itself once the producer has stopped (_data_consumer_batch_generator).
      self._input_error = e
      raise RuntimeError(str(e)) from e

  def _scored(self, groups: list) -> list:
    """Every process's groups of this micro-batch, in process order, scored one group at a time."""
    score = super()._batch_to_train_example
    every = [group for part in distributed.gather_objects(groups) for group in part]
    return [ex for group in every for ex in self._trained(group, score(group, rl_cluster_lib.Mode.TRAIN))]

  def _trained(self, group: list, examples: list) -> list:
    """What of a scored group trains: all of it, or with dynamic sampling nothing where its rewards
    are all equal and its slot has rounds left (a reserve prompt takes its place). Logs
    frac_reward_zero_std over the trained groups and dynamic_sampling/* (the rule and its metrics:
    maxtext.rl.dynamic_sampling.Slots)."""
    zero, _ = self._zero_signal(np.concatenate([np.asarray(e.advantages).reshape(-1) for e in examples]))
    slot = group[0].group_id
    step = slot // self._share.batch_size
    if self._dynamic is not None:
      rnd = _scalar(group[0].traj["original_input"][ROUND])
      replacement = self._dynamic.decide(slot, rnd, bool(zero))
      self._log({k: (v, step_metrics.last) for k, v in self._dynamic.metrics(step).items()}, step)
      if replacement is not None:
        assert self._prompt_queue is not None
        self._prompt_queue.put({**replacement, SLOT: np.asarray([slot]), ROUND: np.asarray([rnd + 1])})
        return []
    self._log_zero_signal_so_far(zero, step)
    return examples

  def _current_version(self) -> int:
    """The version lags are measured from: the engine's weights version when it tags tokens, else
    Tunix's policy version."""
    version = self._engine.version
    return self.policy_version if version is None else version

  def _put_prompts_to_queue(self, prompt_queue, batch):
    self._prompt_queue = prompt_queue
    super()._put_prompts_to_queue(prompt_queue, batch)

  def _build_orchestrator(self) -> rollout_orchestrator.RolloutOrchestrator:
    orchestrator = super()._build_orchestrator()
    orchestrator.engine_cls = TrajectoryEngine
    return orchestrator

  def _trainer_recomputes(self) -> bool:
    """Whether the trainer recomputes a group's log-probs: where they are the old policy's (vanilla
    engine) or sampler_is=token trains on them. Otherwise the loss reports the sampler/trainer
    mismatch from the sampler's log-probs (losses.mismatch_from_old)."""
    return not losses.mismatch_from_old(self.algo_config)

  def _trainer_logps(self, prompt_tokens, completion_tokens, pad_id, eos_id, micro_batch_size=None, temperature=None):
    """RLCluster.get_actor_per_token_logps's contract (the log-probs of the completions under the
    weights of the last sync, at the sampling temperature unless given), or None unless
    _trainer_recomputes (Tunix's _process_results, the only caller, asks for every group with no
    switch). The final hidden states go through the output layer a vocabulary slice at a time
    (scoring.py), where Tunix takes the log-probs from the model's whole float32 logits [B, T, vocab];
    micro_batch_size is not needed for that and is ignored. Every process holds the whole batch: the
    inputs become global arrays on the trainer's mesh, as the reference's do (cluster.py)."""
    if not self._trainer_recomputes():
      return None
    cluster = self.rl_cluster
    if temperature is None:
      temperature = cluster.get_rollout_config(mode=rl_cluster_lib.Mode.TRAIN).temperature
    mesh = cluster.r2m[rl_cluster_lib.Role.ACTOR]
    state = rl_utils.put_params_on_memory_kind(self._anchor, jax.devices()[0].default_memory().kind)
    model = nnx.merge(nnx.graphdef(cluster.actor_trainer.model), state)
    with mesh:
      prompts, completions = mesh_lib.global_batch((prompt_tokens, completion_tokens), mesh)
      return rollout.per_token_logps(model, prompts, completions, pad_id, eos_id, temperature)

  def _process_results(self, trajectories, mode=rl_cluster_lib.Mode.TRAIN, expected_step=None):
    # On a shared mesh the samples came from the live weights: they are the anchor.
    if self._trainer_recomputes() and not self.should_sync_weights:
      self._anchor = rl_utils.put_params_on_memory_kind(nnx.state(self.rl_cluster.actor_trainer.model), "pinned_host")
    conversations = [without_examples(item.traj.get("conversation_text") or []) for item in trajectories]
    if mode == rl_cluster_lib.Mode.TRAIN:
      self._log_conversations(conversations, expected_step)
    for item, conversation in zip(trajectories, conversations):
      item.traj = {**item.traj, "conversation_text": joined_assistant_turns(conversation)}
    return super()._process_results(trajectories, mode, expected_step)

  def _log_zero_signal_so_far(self, zero: int, step: int) -> None:
    """frac_reward_zero_std over the step's trained groups so far (running totals, as _log_conversations)."""
    with self._conversation_lock:
      totals = self._conversation_totals.setdefault(step, collections.Counter())
      totals.update({"zero_signal_groups": zero, "groups": 1})
      fraction = totals["zero_signal_groups"] / totals["groups"]
    self._log_zero_signal(fraction, step_metrics.last, step)

  def _log_conversations(self, conversations: list[list[dict]], step: int) -> None:
    """Logs the step's tool and turn metrics from running totals, and step_metrics.rollout_metrics: Tunix
    logs a step's metrics in several parts when groups of different steps finish interleaved, and a
    later part replaces an earlier one, so each part carries the totals so far (the last value of a
    part is kept)."""
    with self._conversation_lock:
      totals = self._conversation_totals.setdefault(step, collections.Counter())
      totals.update(step_metrics.conversation_counts(conversations))
      counts = {k: (v, step_metrics.last) for k, v in step_metrics.conversation_metrics(totals).items()}
      self._log({**counts, **step_metrics.rollout_metrics(self.rl_cluster)}, step)

  def _data_consumer_batch_generator(self, queue, batch_size):
    self._train_queue = queue
    if self._share.count > 1:
      own = super()._data_consumer_batch_generator(queue, batch_size // self._share.count)
      batches = (self._scored(groups) for groups in own)
    else:
      batches = super()._data_consumer_batch_generator(queue, batch_size)
    idle = step_metrics.IdleClock()
    while True:
      idle.wait_starts()
      batch = next(batches, None)
      if batch is None:
        break
      new_step = self.rl_cluster.actor_trainer.train_steps != self._checked_step
      if new_step:  # the step's window opens with the wait for its first batch
        self._log_idle(idle.close(at=idle.wait_start), at_its_step=True)
        idle.open(self.rl_cluster.global_steps, at=idle.wait_start)
      idle.wait_ends()
      if new_step:
        self._checked_step = self.rl_cluster.actor_trainer.train_steps
        self._step_starts(self._checked_step)
      self._check_batch(np.concatenate([ex.prompt_ids for ex in batch]))
      versions = [
        np.asarray(ex.policy_version).reshape(-1) for ex in batch if getattr(ex, "policy_version", None) is not None
      ]
      if versions:
        lags = self._current_version() - np.concatenate(versions)
        self._log(
          {"staleness/mean": (float(lags.mean()), np.mean), "staleness/max": (float(lags.max()), np.max)},
          self.rl_cluster.global_steps,
        )
      yield batch
    self._log_idle(idle.close(at=idle.wait_start), at_its_step=True)
    if self._rollout_error is not None:
      raise RolloutError(f"an agentic rollout failed: {self._rollout_error}") from self._rollout_error
    if self._input_error is not None:
      raise self._input_error


class _PromptStream(agentic_grpo_learner.GRPOLearner._AsyncQueueIterator):
  """The producer's prompts. With dynamic sampling the end of the data does not end it while slots
  are undecided: their replacements come after it."""

  def __init__(self, q, loop, learner: AgenticGRPOLearner):
    super().__init__(q, loop)
    self._learner = learner

  async def __anext__(self):
    dynamic = self._learner._dynamic
    if dynamic is None:
      return await super().__anext__()
    while True:
      try:
        item = await self.loop.run_in_executor(None, functools.partial(self.q.get, timeout=0.2))
      except queue.Empty:
        item = _NOTHING
      if item is None:
        self._ended = True
      elif item is not _NOTHING:
        return item
      if self._ended and (self._learner._closing or dynamic.unresolved <= 0):
        raise StopAsyncIteration

  _ended = False


_NOTHING = object()


_OLDEST_VERSION = "oldest_token_policy_version"
_TURNS = "model_turns_started"


def build_learner(
  train: TrainSection,
  rl: AlgorithmSection,
  sampling: SamplingSection,
  agentic: AgenticSection,
  tools: ToolsSection,
  cluster,
  reward_fns,
  parser: ConfigChatParser,
  tool_map=None,
  before_step: Callable[[int], None] | None = None,
  reserve: Callable[[int], dict] | None = None,
) -> AgenticGRPOLearner:
  """reserve(i): the i-th reserve batch of user turns (needed with rl.dynamic_sampling)."""
  return AgenticGRPOLearner(
    batch_size=train.batch_size,
    dynamic_sampling_rounds=dynamic_sampling.max_rounds(rl),
    reserve=reserve,
    before_step=before_step,
    rl_cluster=cluster,
    algo_config=grpo_config(rl, sampling, agentic, parser.system_prompt),
    reward_fns=list(reward_fns),
    chat_parser=parser,
    **agent_kwargs(tools, tool_map, parser.example_turns),
  )
