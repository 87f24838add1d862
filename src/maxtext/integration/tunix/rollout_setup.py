"""What the config selects for sampling: the rollout engine Tunix builds (rollout_engine), the
sampling configs of training and evaluation rollouts (rollout_configs), and the sampler built from
them alone, outside a training run (load_sampler, for decode and evaluate_rl)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from tunix.rl.rl_cluster import Mode  # which sampling: TRAIN (decode_sampling_*) or EVAL (eval_sampling_strategy)
from tunix.rl.rollout import base_rollout

from maxtext.configs.sections import EVAL_SAMPLING, EvalStrategy, MeshSection, ModelSection, SamplingSection
from maxtext.inference.continuous_batching import unrolled_layers
from maxtext.integration.tunix.rollout import BatchedRolloutEngine, RolloutEngine

if TYPE_CHECKING:
  import transformers

__all__ = ["Mode", "load_batched_engine", "load_sampler", "rollout_configs", "rollout_engine"]


def rollout_engine(sampling: SamplingSection):
  """ClusterConfig.rollout_engine for cfg.rollout_engine: our engine bound to its settings."""
  if sampling.rollout_engine == "batched":
    return functools.partial(
      BatchedRolloutEngine,
      seed=sampling.decode_seed,
      max_batch_size=sampling.rollout_max_batch_size,
      matmul_dtype=None if sampling.rollout_dtype == "model" else sampling.rollout_dtype,
      steps_per_dispatch=sampling.decode_steps_per_dispatch,
      unrolled_layers=unrolled_layers(sampling.rollout_layers),
    )
  return functools.partial(RolloutEngine, seed=sampling.decode_seed)


def rollout_configs(
  sampling: SamplingSection, eval_sampling_strategy: EvalStrategy, agentic: bool, eos_id: int
) -> dict:
  """Sampling for training rollouts (greedy when decode_sampling_temperature is 0; with the sampler's
  log-probs on the batched engine) and for evaluation (with log-probs in `agentic` runs)."""
  shared = dict(
    max_tokens_to_generate=sampling.max_response_length,
    max_prompt_length=sampling.max_prompt_length,
    kv_cache_size=sampling.kv_cache_size,
    eos_tokens=[eos_id],
  )
  greedy = base_rollout.RolloutConfig(**EVAL_SAMPLING["greedy"], **shared)
  train = (
    greedy
    if sampling.decode_sampling_temperature == 0
    else base_rollout.RolloutConfig(
      temperature=sampling.decode_sampling_temperature,
      top_p=sampling.decode_sampling_top_p,
      top_k=sampling.decode_sampling_top_k or None,
      **shared,
    )
  )
  evaluation = base_rollout.RolloutConfig(**EVAL_SAMPLING[eval_sampling_strategy], **shared)
  if sampling.rollout_engine == "batched":  # the agentic learner trains on them; both learners check them
    train = dataclasses.replace(train, return_logprobs=True)
    if agentic:
      evaluation = dataclasses.replace(evaluation, return_logprobs=True)
  return {Mode.TRAIN: train, Mode.EVAL: evaluation}


def load_sampler(
  model: ModelSection, devices: MeshSection, sampling: SamplingSection, eval_sampling_strategy: EvalStrategy, mode: Mode
) -> tuple[Callable, transformers.PreTrainedTokenizerBase]:
  """(generate, tokenizer): the RL sampler on its own (rollout_engine vanilla or batched). generate(prompts)
  returns Tunix's RolloutOutput, sampled as `mode` says."""
  from maxtext.input_pipeline.tokenizer import tokenizer_for
  from maxtext.models.load import load_model
  from maxtext.utils import distributed
  from maxtext.utils import mesh as mesh_lib

  distributed.initialize()
  _, mesh = mesh_lib.create_meshes(devices, agentic=False)
  tokenizer = tokenizer_for(model)
  config = rollout_configs(sampling, eval_sampling_strategy, False, tokenizer.eos_token_id)[mode]
  engine = rollout_engine(sampling)(load_model(model, mesh), tokenizer, mesh, config)
  return (lambda prompts: engine.generate(prompts, config)), tokenizer


def load_batched_engine(
  model: ModelSection, devices: MeshSection, sampling: SamplingSection
) -> tuple[BatchedRolloutEngine, transformers.PreTrainedTokenizerBase]:
  """(engine, tokenizer): the batched rollout engine on its own (whatever rollout_engine says), loaded as
  load_sampler loads it, for callers that submit to its ContinuousBatcher (engine.batcher) themselves."""
  from maxtext.input_pipeline.tokenizer import tokenizer_for
  from maxtext.models.load import load_model
  from maxtext.utils import distributed
  from maxtext.utils import mesh as mesh_lib

  distributed.initialize()
  _, mesh = mesh_lib.create_meshes(devices, agentic=False)
  tokenizer = tokenizer_for(model)
  config = rollout_configs(sampling, "greedy", False, tokenizer.eos_token_id)[Mode.TRAIN]
  make = rollout_engine(dataclasses.replace(sampling, rollout_engine="batched"))
  return make(load_model(model, mesh), tokenizer, mesh, config), tokenizer
