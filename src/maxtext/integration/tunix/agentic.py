"""Hands the cluster to Tunix's agentic GRPO learner (rl.use_agentic_rollout=true).

The agentic learner runs up to rl.max_concurrency single-prompt rollouts at once, overlaps them with
training and accepts samples at most rl.off_policy_steps policy versions old. Its prompts are the
user turn only (the agent adds the system turn and our ConfigChatParser renders the conversation).
With rl.tools the agent is Tunix's ToolAgent (tool calls parsed from <tool_call>{json}</tool_call>)
in a ToolEnvironment of at most rl.max_turns model turns.
Workarounds for google-tunix 0.1.7 used here:
- full-length completions are kept, and later turns are sampled from the conversation's exact token
  stream (TrajectoryEngine);
- rewards judge all assistant turns of a conversation joined (Tunix passes only the first);
- on a shared trainer/sampler mesh the anchor policy (the weights the old log-probs are computed
  with) is refreshed before each batch is scored; Tunix refreshes it only in weight syncs, which a
  shared mesh never runs, so every PPO ratio was taken against the initial weights;
- with tools, the user turn is the example's templated user content (ToolAgent reads only a
  `question` field, the raw question, and drops the data template's user turn): UserTurnToolAgent;
- a chat parser is always given (the learner crashes without one); numpy message content is coerced
  to text by the parser;
- with the batched engine the old policy's log-probs are the sampler's (use_rollout_logps: the
  behaviour policy of an off-policy sample, whatever weights the trainer holds now); Tunix then
  recomputes them with the trainer for every group only to log the sampler/trainer agreement
  (sampler_trainer/logp_diff_mean, ..._max, prob_diff_*, probs_pearson_corr), a forward pass that
  is here run at the first step and every rl.logp_check_period steps (every step with
  rl.sampler_is=token, which trains on it); the vanilla engine returns no log-probs, so there the
  trainer computes them (an engine that returns none where they are expected fails the run: Tunix
  would use zeros);
- a failed rollout fails the run: Tunix logs a model-call exception and then waits forever for the
  group it never completes, so the error is raised in the training loop instead, and the producer's
  queues are closed whenever training ends (else its threads block process exit).

The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from typing import Callable

import grain
import numpy as np
from flax import nnx
from tunix.rl import utils as rl_utils
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.agentic import agentic_grpo_learner
from tunix.rl.agentic.agents import model_agent, tool_agent
from tunix.rl.agentic.environments import tool_environment
from tunix.rl.agentic.pipeline import rollout_orchestrator
from tunix.rl.agentic.trajectory import trajectory_collect_engine

from maxtext.input_pipeline.templates import PromptTemplate
from maxtext.integration.tunix import learner, metrics
from maxtext.integration.tunix.chat_parser import ConfigChatParser

log = logging.getLogger(__name__)


def system_prompt(cfg, tokenizer) -> str:
  return cfg.rl.system_prompt or PromptTemplate(cfg, tokenizer).system_prompt


def chat_parser(cfg, tokenizer) -> ConfigChatParser:
  return ConfigChatParser(tokenizer, system_prompt(cfg, tokenizer), PromptTemplate(cfg, tokenizer).examples)


def grpo_config(cfg, system: str) -> agentic_grpo_learner.GRPOConfig:
  """The agentic learner's algorithm config, every rl.* key mapped."""
  rl = cfg.rl
  config = agentic_grpo_learner.GRPOConfig(
      **learner.grpo_algorithm_kwargs(cfg),
      system_prompt=system,
      max_concurrency=rl.max_concurrency,
      off_policy_steps=rl.off_policy_steps,
      max_response_length=cfg.max_response_length,
      sampler_is=rl.sampler_is or None,
      sampler_is_threshold=rl.sampler_is_threshold,
      degenerate_group_masking=rl.filter_zero_variance_groups,
      use_rollout_logps=cfg.rollout_engine == "batched",
  )
  log.info("Agentic GRPO algorithm config: %s", config)
  return config


def user_turn_batches(batches: grain.MapDataset) -> grain.MapDataset:
  """Training batches whose `prompts` are the user turns (the agent renders the conversation)."""
  return batches.map(lambda b: {**b, "prompts": b["user_content"]})


class TrajectoryEngine(trajectory_collect_engine.TrajectoryCollectEngine):
  """Tunix's trajectory collection with two fixes.

  Full-length responses kept: Tunix checks the response budget right after the model call and ends
  the episode before the agent records the response, so every completion that used the whole
  budget was trained as empty (a short completion plus its EOS can reach the budget too). Here the
  check right after the model call is skipped; the next step's check ends the episode with the
  response recorded.

  Token in, token out: the trainer trains on the first prompt's tokens followed by each turn's
  sampled tokens and the environment's tokens, but Tunix samples every later turn from the
  conversation re-rendered as text and re-tokenized, which differs wherever sampled tokens
  re-tokenize differently. Here every later turn is sampled from that exact token stream
  (`prompt_ids`, passed to the learner's model call). The environment's tokens start with what the
  template writes after a turn's EOS token ("\n" in ChatML; Tunix left it out), so the stream is
  the template's rendering of the conversation.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._model_just_answered = False
    model_call = self.model_call

    def call_and_mark(*call_args, **call_kwargs):
      out = model_call(*call_args, **call_kwargs)
      self._model_just_answered = True
      return out

    self.model_call = call_and_mark

  async def _one_step(self) -> bool:
    if self.agent.trajectory.steps:
      self.model_call_kwargs = {**self.model_call_kwargs, "prompt_ids": self.token_stream()}
    done = await super()._one_step()
    self._prepend_turn_end()
    return done

  def _prepend_turn_end(self) -> None:
    step = self.agent.get_current_step()
    suffix = getattr(self.chat_parser, "turn_end_suffix", "")
    if step is None or getattr(step, "env_tokens", None) is None or not suffix:
      return
    tokens = self.tokenizer.encode(suffix, add_special_tokens=False)
    step.env_tokens = np.concatenate([np.asarray(tokens, step.env_tokens.dtype), step.env_tokens])
    step.env_masks = np.concatenate([np.zeros(len(tokens), step.env_masks.dtype), step.env_masks])
    self._response_token_count += len(tokens)

  def token_stream(self) -> np.ndarray:
    """The conversation's tokens so far: the prompt the sampler saw (left padding stripped), then
    each turn's sampled tokens and the environment's tokens."""
    trajectory = self.agent.trajectory
    prompt = np.asarray(trajectory.prompt_tokens, np.int32)
    pieces = [prompt[np.argmax(prompt != self.tokenizer.pad_id()):]]
    for step in trajectory.steps:
      pieces += [np.asarray(t, np.int32) for t in (getattr(step, "assistant_tokens", None),
                                                   getattr(step, "env_tokens", None)) if t is not None]
    return np.concatenate(pieces)

  def _check_and_set_context_limit_reached(self) -> bool:
    if self._model_just_answered:  # the check right after the model call, before the response is recorded
      self._model_just_answered = False
      return False
    return super()._check_and_set_context_limit_reached()


class RolloutError(RuntimeError):
  """A rollout (model call) of the agentic producer failed."""


class AgenticGRPOLearner(agentic_grpo_learner.GRPOLearner):
  """Tunix's agentic GRPO learner collecting trajectories with TrajectoryEngine and logging
  the staleness of what it trains on: staleness/mean and staleness/max, the policy-version lag
  of the consumed samples (bounded by rl.off_policy_steps; with the batched engine a sample's
  version is that of its oldest token), and trainer/idle_fraction, the share of each step the
  trainer waited for samples. A failed rollout raises RolloutError from train()."""

  _prompt_queue = None
  _train_queue = None
  _rollout_error: Exception | None = None
  _checked_step = -1

  def __init__(self, *args, logp_check_period: int, before_step: Callable[[int], None] | None = None,
               **kwargs):
    """before_step(steps_done) runs between global steps (it may raise to stop training);
    logp_check_period: see _trainer_recomputes."""
    super().__init__(*args, **kwargs)
    self._before_step = before_step
    self._logp_check_period = logp_check_period
    self._skips_trainer_logps = threading.local()
    actor_logps = self.rl_cluster.get_actor_per_token_logps

    def actor_logps_unless_skipped(*args, **kwargs):
      return None if getattr(self._skips_trainer_logps, "value", False) else actor_logps(*args, **kwargs)

    self.rl_cluster.get_actor_per_token_logps = actor_logps_unless_skipped
    self._conversation_lock = threading.Lock()
    self._conversation_totals: dict[int, collections.Counter] = {}

  def train(self, *args, **kwargs):
    try:
      super().train(*args, **kwargs)
    finally:
      self._close_queues()

  def _close_queues(self) -> None:
    for q in (self._prompt_queue, self._train_queue):
      if q is not None:
        q.put(None)

  def _model_call(self, chat_lists, env=None, max_generation_steps=None, prompt_ids=None):
    """One model turn of a conversation; a later turn continues the conversation's token stream
    `prompt_ids` (TrajectoryEngine) instead of re-rendering `chat_lists`."""
    try:
      if prompt_ids is None:
        out = super()._model_call(chat_lists, env, max_generation_steps)
      else:
        if env is not None:
          env.task["policy_version"] = self.policy_version
        out = self.rl_cluster.generate(prompts=[prompt_ids], mode=rl_cluster_lib.Mode.TRAIN,
                                       max_generation_steps=max_generation_steps)
      if self.algo_config.use_rollout_logps and out.logprobs is None:
        raise ValueError(f"the old policy's log-probs are the sampler's here, but the rollout engine "
                         f"{type(self.rl_cluster.rollout).__name__} returned none (Tunix would train against "
                         "zeros); the batched engine returns them")
    except Exception as e:
      if self._rollout_error is None:
        self._rollout_error = e
      self._close_queues()
      raise
    versions = getattr(self.rl_cluster.rollout, "last_versions", lambda: None)()
    if env is not None and versions and len(versions[0]):
      # The sample's version is that of its oldest token over all turns (Tunix tags the latest call).
      env.task["policy_version"] = env.task[_OLDEST_VERSION] = min(
          int(versions[0].min()), env.task.get(_OLDEST_VERSION, int(versions[0].min())))
    return out

  def _current_version(self) -> int:
    """The version lags are measured from: the engine's weights version when it tags tokens, else
    Tunix's policy version."""
    return getattr(self.rl_cluster.rollout, "version", self.policy_version)

  def _put_prompts_to_queue(self, prompt_queue, batch):
    self._prompt_queue = prompt_queue
    super()._put_prompts_to_queue(prompt_queue, batch)

  def _build_orchestrator(self) -> rollout_orchestrator.RolloutOrchestrator:
    orchestrator = super()._build_orchestrator()
    orchestrator.engine_cls = TrajectoryEngine
    return orchestrator

  def _trainer_recomputes(self, mode, step: int | None) -> bool:
    """Whether the trainer recomputes a group's log-probs: always where they are the old policy's
    (vanilla engine) or sampler_is=token trains on them; where they only check the sampler's, at
    training steps 0, p, 2p, ... of logp_check_period p (never for p=0)."""
    algo = self.algo_config
    if not algo.use_rollout_logps or algo.sampler_is == "token":
      return True
    period = self._logp_check_period
    return mode == rl_cluster_lib.Mode.TRAIN and period > 0 and (step or 0) % period == 0

  def _process_results(self, trajectories, mode=rl_cluster_lib.Mode.TRAIN, expected_step=None):
    recomputes = self._trainer_recomputes(mode, expected_step)
    if recomputes and not self.should_sync_weights:  # shared mesh: the samples came from the live weights
      self.rl_cluster._anchor_policy_state = rl_utils.put_params_on_memory_kind(  # pylint: disable=protected-access
          nnx.state(self.rl_cluster.actor_trainer.model), "pinned_host")
    conversations = [without_examples(item.traj.get("conversation_text") or []) for item in trajectories]
    if mode == rl_cluster_lib.Mode.TRAIN:
      self._log_conversations(conversations, expected_step)
    for item, conversation in zip(trajectories, conversations):
      item.traj = {**item.traj, "conversation_text": joined_assistant_turns(conversation)}
    self._skips_trainer_logps.value = not recomputes
    try:
      example = super()._process_results(trajectories, mode, expected_step)
    finally:
      self._skips_trainer_logps.value = False
    if mode == rl_cluster_lib.Mode.TRAIN:  # Tunix returns a list of TrainExamples (one per group)
      self._log_zero_signal(np.concatenate([np.asarray(e.advantages).reshape(-1) for e in example]), expected_step)
    return example

  def _log_zero_signal(self, advantages, step: int) -> None:
    """frac_reward_zero_std over the step's groups so far (running totals, as _log_conversations)."""
    zero, groups = learner.zero_signal_groups(advantages, self.algo_config.num_generations)
    with self._conversation_lock:
      totals = self._conversation_totals.setdefault(step, collections.Counter())
      totals.update({"zero_signal_groups": zero, "groups": groups})
      fraction = totals["zero_signal_groups"] / totals["groups"]
    self.rl_cluster.buffer_metrics_async({metrics.ZERO_SIGNAL: (fraction, learner.last)},
                                         mode=rl_cluster_lib.Mode.TRAIN, step=step)

  def _log_conversations(self, conversations: list[list[dict]], step: int) -> None:
    """Logs the step's tool and turn metrics from running totals, and learner.rollout_metrics: Tunix
    logs a step's metrics in several parts when groups of different steps finish interleaved, and a
    later part replaces an earlier one, so each part carries the totals so far (the last value of a
    part is kept)."""
    with self._conversation_lock:
      totals = self._conversation_totals.setdefault(step, collections.Counter())
      totals.update(conversation_counts(conversations))
      self.rl_cluster.buffer_metrics_async({**{k: (v, learner.last) for k, v in conversation_metrics(totals).items()},
                                            **learner.rollout_metrics(self.rl_cluster)},
                                           mode=rl_cluster_lib.Mode.TRAIN, step=step)

  def _data_consumer_batch_generator(self, queue, batch_size):
    self._train_queue = queue
    batches = super()._data_consumer_batch_generator(queue, batch_size)
    idle = learner.IdleClock(self.rl_cluster)
    while True:
      idle.wait_starts()
      batch = next(batches, None)
      if batch is None:
        break
      new_step = self.rl_cluster.actor_trainer.train_steps != self._checked_step
      idle.wait_ends(new_step)
      if new_step:
        self._checked_step = self.rl_cluster.actor_trainer.train_steps
        if self._before_step is not None:
          self._before_step(self._checked_step)
      versions = [np.asarray(ex.policy_version).reshape(-1) for ex in batch
                  if getattr(ex, "policy_version", None) is not None]
      if versions:
        lags = self._current_version() - np.concatenate(versions)
        self.rl_cluster.buffer_metrics_async(
            {"staleness/mean": (float(lags.mean()), np.mean), "staleness/max": (float(lags.max()), np.max)},
            mode=rl_cluster_lib.Mode.TRAIN, step=self.rl_cluster.global_steps,
        )
      yield batch
    idle.step_starts()
    if self._rollout_error is not None:
      raise RolloutError(f"an agentic rollout failed: {self._rollout_error}") from self._rollout_error


_OLDEST_VERSION = "oldest_token_policy_version"
_TOOL_FAILURE = "Tool returned result: Error:"  # how ToolAgent writes a failed tool's output


def conversation_counts(conversations: list[list[dict]]) -> collections.Counter:
  """Conversations, those with a tool call, tool calls, failed tool calls and model turns."""
  calls = [[m for m in c if m["role"] == "tool"] for c in conversations]
  return collections.Counter(
      conversations=len(conversations),
      with_calls=sum(bool(c) for c in calls),
      calls=sum(len(c) for c in calls),
      failed=sum(str(m["content"]).startswith(_TOOL_FAILURE) for c in calls for m in c),
      turns=sum(m["role"] == "assistant" for c in conversations for m in c),
  )


def conversation_metrics(counts: collections.Counter) -> dict[str, float]:
  """tools/calls and tools/failed_calls (counts), tools/call_frequency (share of conversations with
  a tool call), tools/failure_frequency (share of tool calls that failed) and turns/mean (model
  turns per conversation)."""
  return {
      "tools/calls": float(counts["calls"]),
      "tools/failed_calls": float(counts["failed"]),
      "tools/call_frequency": counts["with_calls"] / max(counts["conversations"], 1),
      "tools/failure_frequency": counts["failed"] / counts["calls"] if counts["calls"] else 0.0,
      "turns/mean": counts["turns"] / max(counts["conversations"], 1),
  }


def joined_assistant_turns(conversation: list[dict]) -> list[dict]:
  """The conversation with its first assistant message holding every assistant turn's text, which
  is what Tunix hands the reward functions as the completion."""
  turns = [str(m["content"]) for m in conversation if m["role"] == "assistant"]
  if len(turns) < 2:
    return conversation
  first = next(i for i, m in enumerate(conversation) if m["role"] == "assistant")
  out = list(conversation)
  out[first] = {**out[first], "content": "\n".join(turns)}
  return out


# Marks a conversation's demonstration turns, which rewards and metrics leave out (a str: Tunix
# requires every message field to be one).
EXAMPLE = "example"


def without_examples(conversation: list[dict]) -> list[dict]:
  """The conversation less its example turns: what rewards and tool metrics see."""
  return [m for m in conversation if not m.get(EXAMPLE)]


class _ExampleTurns:
  """The data template's EXAMPLES after the system turn of every conversation, marked EXAMPLE."""

  def __init__(self, *args, example_turns=(), **kwargs):
    self.example_turns = tuple(example_turns)
    super().__init__(*args, **kwargs)

  def _init_messages(self, system_prompt: str) -> None:
    super()._init_messages(system_prompt)
    self._messages.extend({**turn, EXAMPLE: "yes"} for turn in self.example_turns)


class ExampleTurnsModelAgent(_ExampleTurns, model_agent.ModelAgent):
  """Tunix's ModelAgent (one reply to the task's `prompts`) with the example turns."""


class UserTurnToolAgent(_ExampleTurns, tool_agent.ToolAgent):
  """Tunix's ToolAgent whose user turn is the task's `prompts` (the user content the data template
  renders), as for Tunix's ModelAgent; ToolAgent itself takes the raw `question` field. The tools'
  descriptions follow the system prompt after a blank line (ToolAgent glued them to its last word).
  The empty observation that ends an episode adds nothing (ToolAgent logged a warning per conversation).
  The example turns follow the system turn."""

  def _init_messages(self, system_prompt: str) -> None:
    if system_prompt and self.tools_prompt:
      system_prompt = system_prompt.rstrip() + "\n\n"
    super()._init_messages(system_prompt)

  def update_from_model(self, response: str, **kwargs):
    """ToolAgent's parse of the reply, with every call's arguments made what ToolEnvironment can
    take: a JSON object's text (a `finish` call: a dict with the response). Model-written arguments
    that are a string, a list or broken JSON would make Tunix's environment raise and stop training;
    here they reach the tool as one `invalid_arguments` argument, which it answers with an error text."""
    action = super().update_from_model(response, **kwargs)
    for call in action.action:
      function = call["function"]
      if function["name"] == "finish":
        args = function["arguments"]
        if not isinstance(args, dict) or not isinstance(args.get("response"), str):
          function["arguments"] = {"response": response}
      else:
        function["arguments"] = _json_object_text(function["arguments"])
    return action

  def _observation_to_messages(self, observation, reward, done, info):
    if isinstance(observation, dict) and not observation:  # the episode's end: nothing to add (Tunix warned)
      return
    if isinstance(observation, dict) and "prompts" in observation and "tool_outputs" not in observation:
      self._messages.append({"role": "user", "content": observation["prompts"]})
      return
    super()._observation_to_messages(observation, reward, done, info)


def _json_object_text(arguments) -> str:
  """Tool-call arguments as the text of a JSON object; anything else wrapped as invalid_arguments."""
  if isinstance(arguments, str):
    try:
      if isinstance(json.loads(arguments), dict):
        return arguments
    except json.JSONDecodeError:
      pass
  elif isinstance(arguments, dict):
    return json.dumps(arguments)
  return json.dumps({"invalid_arguments": arguments if isinstance(arguments, str) else repr(arguments)})


def _agent_kwargs(cfg, tool_map, example_turns) -> dict:
  """The learner's agent and environment arguments: UserTurnToolAgent in a ToolEnvironment with
  tools, else ExampleTurnsModelAgent in Tunix's default environment."""
  if not tool_map:
    return dict(agent_class=ExampleTurnsModelAgent, agent_kwargs={"example_turns": example_turns})
  return dict(agent_class=UserTurnToolAgent,
              agent_kwargs={"tool_map": tool_map, "tool_parser_name": "qwen", "example_turns": example_turns},
              env_class=tool_environment.ToolEnvironment,
              env_kwargs={"tool_map": tool_map, "max_steps": cfg.rl.max_turns})


def first_prompt_renderer(cfg, parser: ConfigChatParser, tool_map=None) -> Callable[[str], str]:
  """user turn -> the first prompt the agent sends to the sampler (system prompt with the tools'
  descriptions, example turns, user turn, generation prompt), which max_prompt_length must bound."""
  kwargs = _agent_kwargs(cfg, tool_map, parser.example_turns)
  opening = kwargs["agent_class"](system_prompt=parser.system_prompt, **kwargs["agent_kwargs"]).chat_completions
  return lambda user: parser.parse([*opening, {"role": "user", "content": user}], add_generation_prompt=True,
                                   is_first_msg=True)


def build_learner(cfg, cluster, reward_fns, parser: ConfigChatParser, tool_map=None,
                  before_step: Callable[[int], None] | None = None) -> AgenticGRPOLearner:
  return AgenticGRPOLearner(
      before_step=before_step,
      logp_check_period=cfg.rl.logp_check_period,
      rl_cluster=cluster,
      algo_config=grpo_config(cfg, parser.system_prompt),
      reward_fns=list(reward_fns),
      chat_parser=parser,
      **_agent_kwargs(cfg, tool_map, parser.example_turns),
  )
