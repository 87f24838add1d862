"""PPO's critic: a decoder whose final hidden states a value head maps to one number per position.

The head (`score`, [D, 1], as transformers' *ForSequenceClassification names it) and the values it
gives are float32 whatever the decoder's dtype: a bfloat16 head rounds the values' small differences
away. It starts at zero, so the first values are 0 and the critic's first updates fit the head to the
returns before the trunk has moved much.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.models import builder
from maxtext.models.decoder import Decoder, ModelConfig
from maxtext.models.shared_prefix import SharedPrefix


class Critic(nnx.Module):
  """`trunk` (a Decoder: its hidden_states, output-free) with the float32 value head `score`."""

  def __init__(self, trunk: Decoder):
    self.trunk = trunk
    replicated = jax.sharding.NamedSharding(builder.mesh_of(trunk), jax.sharding.PartitionSpec())
    self.score = nnx.Param(jax.device_put(jnp.zeros((trunk.config.emb_dim, 1), jnp.float32), replicated))

  def hidden_states(self, input_tokens, positions, cache, attention_mask):
    return self.trunk.hidden_states(input_tokens, positions, cache, attention_mask)

  def values(self, hidden: jax.Array) -> jax.Array:
    """float32 values [B, T] of hidden states [B, T, D] (from hidden_states)."""
    return jnp.einsum("btd,dk->btk", hidden.astype(jnp.float32), self.score[...], precision="highest")[..., 0]

  @property
  def config(self) -> ModelConfig:
    return self.trunk.config


class SharedPrefixCritic:
  """A critic for batches whose rows come in groups of `group_size` sharing their first
  `prompt_length` tokens: its hidden_states are SharedPrefix's over the trunk (each group's prompt
  computed once; positions prompt_length - 1 and later), its values the critic's."""

  def __init__(self, critic: Critic, prompt_length: int, group_size: int):
    self._critic = critic
    self._shared = SharedPrefix(critic.trunk, prompt_length, group_size)

  def hidden_states(self, input_tokens, positions, cache, attention_mask):
    return self._shared.hidden_states(input_tokens, positions, cache, attention_mask)

  def values(self, hidden: jax.Array) -> jax.Array:
    return self._critic.values(hidden)


def from_policy(policy: Decoder, seed: int) -> Critic:
  """A critic whose trunk starts as the policy's weights: a copy of them; with LoRA (the policy's
  config has lora_rank) the policy's frozen base weights themselves (no copy) with adapters of its
  own, seeded by `seed`, which train in place of the base."""
  if policy.config.lora_rank:
    return Critic(builder.with_lora(builder.base_of(policy), policy.config, seed))
  return Critic(nnx.clone(policy))


def trained(critic: Critic) -> nnx.filterlib.Filter:
  """The critic's parameters its optimizer trains: every one but an untied output layer (`lm_head`,
  which no value reads), or with LoRA its adapters and its head (the head is new, so it always
  trains)."""
  if critic.config.lora_rank:
    return nnx.Any(nnx.LoRAParam, nnx.PathContains("score"))
  return nnx.All(nnx.Param, nnx.Not(nnx.PathContains("lm_head")))


def last_token_scores(critic: Critic, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
  """float32 [B]: each row's value at its last token, as transformers' *ForSequenceClassification pools
  a reward model's score. tokens [B, T] hold each row's lengths[b] tokens from position 0 (right-padded);
  every row has at least one."""
  width = tokens.shape[1]
  live = jnp.arange(width)[None, :] < lengths[:, None]
  positions = jnp.broadcast_to(jnp.arange(width), tokens.shape)
  mask = jnp.tril(jnp.ones((width, width), bool))[None] & live[:, None, :]
  hidden, _ = critic.hidden_states(tokens, positions, None, mask)
  values = critic.values(hidden)
  return jnp.take_along_axis(values, (lengths - 1)[:, None], axis=1)[:, 0]
