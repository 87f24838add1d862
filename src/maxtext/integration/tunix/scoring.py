"""The log-probs (and entropies) of completion tokens under a model, the one way the policy loss and
the samplers' get_per_token_logps compute them: Tunix's layout of prompt and completion (its
process_ids: left-padded prompts, positions and the causal mask over non-pad tokens), then the
completion positions' hidden states through models/token_logps.py, so the [B, T, vocab] logits are
never held whole; and the values of completion tokens under PPO's critic (`completion_values`), from
the same layout."""

from __future__ import annotations

import jax
from tunix.rl import common

from maxtext.models.token_logps import token_logps


def completion_logps(
  model, prompt_tokens: jax.Array, completion_tokens: jax.Array, pad_id: int, eos_id: int, temperature: float
) -> tuple[jax.Array, jax.Array]:
  """(log-probs [B, C], entropies [B, C]) of completion_tokens [B, C] after prompt_tokens [B, P]
  under softmax(logits / temperature), plain softmax for temperature 0 (greedy sampling), every
  matmul at the model's matmul_precision. `model` is a Decoder or a SharedPrefix (both have
  hidden_states, output_head and config); either returns hidden states whose last C + 1 positions
  end with the completion's last token."""
  tokens, positions, attention_mask, _ = common.process_ids(prompt_tokens, completion_tokens, pad_id, eos_id)
  hidden, _ = model.hidden_states(tokens, positions, None, attention_mask)
  length = completion_tokens.shape[1]
  return token_logps(
    hidden[:, -length - 1 : -1],
    model.output_head(),
    completion_tokens,
    float(temperature or 1.0),
    model.config.precision,
  )


def completion_values(
  critic, prompt_tokens: jax.Array, completion_tokens: jax.Array, pad_id: int, eos_id: int
) -> jax.Array:
  """float32 values [B, C] of the states before each of completion_tokens [B, C] (the prompt and the
  completion's earlier tokens) under `critic` (a models.critic.Critic): the hidden states at the
  positions the log-probs are read from."""
  tokens, positions, attention_mask, _ = common.process_ids(prompt_tokens, completion_tokens, pad_id, eos_id)
  hidden, _ = critic.hidden_states(tokens, positions, None, attention_mask)
  length = completion_tokens.shape[1]
  return critic.values(hidden[:, -length - 1 : -1])
