"""Our rollout engine for Tunix: its vanilla sampler with three defects of google-tunix 0.1.7 fixed.

1. Fresh randomness: with no seed, Tunix's sampler uses PRNGKey(0) on every call, so the samples
   of a GRPO group are identical across steps. Each call here folds the training step
   (`step_source`) and a call counter within that step into a base seed unless the rollout config
   carries its own seed, so a resumed run draws what an uninterrupted one would.
2. EOS kept: the sampler cuts completions before their EOS token, so the trained sequence never
   contains EOS and the policy never learns to stop. A completion that stopped early (shorter than
   the generation budget) gets its EOS token back.
3. Weight sync between disjoint multi-device meshes: on CPU Tunix forbids host transfers while
   syncing weights, but jax.device_put of replicated arrays from one multi-device mesh to another
   goes through host memory, so a trainer/sampler split of 4/4 devices crashed.
4. Later turns of a conversation: the sampler pads a prompt longer than max_prompt_length to the
   next power of two, which overflows the KV cache (max_prompt_length + max_response_length) although
   the conversation fits it. Such a prompt is padded to the room the cache leaves instead, and one
   that does not fit raises an error that says by how much.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from tunix.rl.rollout import base_rollout, vanilla_rollout


def _place_on_mesh(model: nnx.Module, mesh: Mesh) -> nnx.Module:
  """The model itself when already on mesh, else a copy resharded onto it."""
  graphdef, state = nnx.split(model)
  if jax.tree.leaves(state)[0].sharding.mesh == mesh:
    return model
  return nnx.merge(graphdef, jax.device_put(state, nnx.get_named_sharding(state, mesh)))


class RolloutEngine(vanilla_rollout.VanillaRollout):
  """Tunix's vanilla rollout (KV-cache sampler) with fresh seeds and completions that keep EOS.

  Passed to Tunix as `ClusterConfig.rollout_engine` (a BaseRollout subclass, via functools.partial
  to bind `seed`).
  """

  def __init__(self, rollout_actor: nnx.Module, tokenizer, mesh: Mesh,
               rollout_config: base_rollout.RolloutConfig, seed: int):
    model = _place_on_mesh(rollout_actor, mesh)
    super().__init__(
        model,
        tokenizer,
        base_rollout.CacheConfig(
            cache_size=rollout_config.kv_cache_size,
            num_layers=model.config.num_layers,
            num_kv_heads=model.config.num_kv_heads,
            head_dim=model.config.head_dim,
        ),
    )
    self.mesh = mesh
    self._seed = seed
    self.step_source: Callable[[], int] = lambda: 0  # the training step (RLCluster's global step)
    self._step = 0
    self._calls = 0  # calls drawing from the base seed within self._step

  def update_params(self, params, filter_types=None) -> None:
    with jax.transfer_guard("allow"):
      super().update_params(params, filter_types)

  def generate(self, prompts: list[str], rollout_config: base_rollout.RolloutConfig, **kwargs):
    # Tunix builds the sampling state on the default device; put it where the sampler's weights are.
    with self.mesh, jax.default_device(self.mesh.devices.flat[0]):
      if rollout_config.seed is None and rollout_config.temperature:  # greedy decoding draws nothing
        rollout_config = dataclasses.replace(rollout_config, seed=self._next_key())
      rollout_config = self._fitted(prompts, rollout_config)
      out = super().generate(prompts, rollout_config, **kwargs)
    eos = rollout_config.eos_tokens[0] if rollout_config.eos_tokens else self.eos_id()
    budget = rollout_config.max_tokens_to_generate
    out.tokens = [
        np.append(t, np.asarray(eos, t.dtype)) if len(t) < budget else t for t in out.tokens
    ]
    if out.logprobs is not None:
      raise NotImplementedError("RolloutEngine does not return sampler log-probs")
    return out

  def _next_key(self) -> jax.Array:
    step = self.step_source()
    if step != self._step:
      self._step, self._calls = step, 0
    self._calls += 1
    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(self._seed), step), self._calls - 1)

  def _fitted(self, prompts: list[str], config: base_rollout.RolloutConfig) -> base_rollout.RolloutConfig:
    """config with max_prompt_length raised to what the KV cache leaves when a prompt is longer."""
    longest = max(len(self._sampler.tokenize(p)) for p in prompts)
    if longest <= config.max_prompt_length:
      return config
    room = config.kv_cache_size - config.max_tokens_to_generate
    if longest > room:
      raise ValueError(
          f"a prompt of {longest} tokens plus {config.max_tokens_to_generate} tokens to generate exceeds the KV "
          f"cache of {config.kv_cache_size} tokens (max_prompt_length + max_response_length); raise "
          "max_prompt_length or max_response_length")
    return dataclasses.replace(config, max_prompt_length=room)
