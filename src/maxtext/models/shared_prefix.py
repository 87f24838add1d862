"""Scoring GRPO's groups with each prompt computed once.

GRPO samples G completions of every prompt, so a training batch holds each prompt G times in a row.
Under causal attention a prompt's activations do not depend on what follows, so computing them once
per group and letting its G completions attend to the same keys and values gives the same logits,
and, since repeating the prompt's keys and values sums their gradients over the group, the same
gradients: the decoder runs on B / G prompts plus B completions instead of B whole sequences.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.models.decoder import Decoder, ModelConfig


class SharedPrefix(nnx.Module):
  """A decoder for batches whose rows come in groups of `group_size` sharing their first
  `prompt_length` tokens (row g * group_size holds the group's prompt). Called as the decoder is
  without a cache, it returns the logits of positions prompt_length - 1 and later, the ones that
  predict the completion's tokens: [B, T - prompt_length + 1, V]; `hidden_states` returns the final
  norm's output there instead, and `output_head` and `config` the decoder's."""

  def __init__(self, model: Decoder, prompt_length: int, group_size: int):
    self.model = model
    self.prompt_length = prompt_length
    self.group_size = group_size

  def __call__(self, input_tokens, positions, cache, attention_mask):
    hidden, _ = self.hidden_states(input_tokens, positions, cache, attention_mask)
    return self.model.logits(hidden), None

  def hidden_states(self, input_tokens, positions, cache, attention_mask):
    if cache is not None:
      raise ValueError("SharedPrefix scores whole sequences; it takes no KV cache")
    p, g = self.prompt_length, self.group_size
    batch, length = input_tokens.shape
    if batch % g or not 0 < p < length:
      raise ValueError(
        f"SharedPrefix: a batch of {batch} x {length} tokens does not hold groups of {g} rows sharing {p} prompt tokens"
      )
    prompt_cache = self.model.init_cache(batch // g, length, self.model.config.dtype)
    first, prompt_cache = self.model.hidden_states(
      input_tokens[::g, :p], positions[::g, :p], prompt_cache, attention_mask[::g, :p], first=p - 1
    )
    group_cache = jax.tree.map(lambda a: jnp.repeat(a, g, axis=0), prompt_cache)
    rest, _ = self.model.hidden_states(input_tokens[:, p:], positions[:, p:], group_cache, attention_mask[:, p:])
    return jnp.concatenate([jnp.repeat(first, g, axis=0), rest], axis=1), None

  def output_head(self) -> jax.Array:
    return self.model.output_head()

  @property
  def config(self) -> ModelConfig:
    return self.model.config
