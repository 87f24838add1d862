"""Log-probabilities and entropies of given tokens from a decoder's final hidden states, computed a
slice of the vocabulary at a time so the [tokens, vocab] logits never exist whole.

A policy loss needs, per completion token, log softmax(logits / temperature)[token] and (as a
diagnostic) the distribution's entropy, and the gradient of both. Taken through whole logits, the
forward and backward passes hold several logits-sized float32 arrays (the logits, their temperature
scaling, the log-softmax and their gradients), each tokens x vocab x 4 bytes. Here the forward pass
runs an online softmax over vocabulary slices and keeps one logsumexp and one entropy per token;
the backward pass recomputes each slice's logits (one more output-layer matmul; not where one slice
holds the whole vocabulary, whose logits it keeps) to form its gradient, writing the head's gradient
slice by slice and summing the hidden states' gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# The most bytes one vocabulary slice's float32 logits take (all tokens x the slice). Where the whole
# vocabulary fits one slice, the backward pass reuses its logits instead of recomputing them.
CHUNK_BYTES = 64 * 2**20
_MIN_SLICE = 1024  # columns: narrower slices cost more per slice than they save
_MASK = float(jnp.finfo(jnp.float32).min)  # the logit of a padding column (exp gives exactly 0)


def vocab_slice(tokens: int, vocab: int) -> int:
  """How many vocabulary columns one slice holds for `tokens` tokens (at most the vocabulary)."""
  return min(vocab, max(_MIN_SLICE, CHUNK_BYTES // (4 * tokens)))


def token_logps(
  hidden: jax.Array,
  head: jax.Array,
  tokens: jax.Array,
  temperature: float,
  precision: jax.lax.Precision = jax.lax.Precision.DEFAULT,
):
  """hidden [B, T, D] (the final norm's output at the positions that predict `tokens`), head [D, V]
  (the output layer), tokens [B, T] -> (log-probs [B, T], entropies [B, T]) of
  softmax(hidden @ head / temperature), in float32, the logits computed in float32 from operands of
  head's dtype. Both outputs are differentiable with respect to hidden and head; every matmul of
  either pass, the gradient's included, runs at `precision`."""
  batch, length, dim = hidden.shape
  logps, entropy = _token_logps(hidden.reshape(-1, dim), head.T, tokens.reshape(-1), float(temperature), precision)
  return logps.reshape(batch, length), entropy.reshape(batch, length)


def _slices(rows: jax.Array, width: int) -> jax.Array:
  """head rows [V, D] -> [V / width, width, D], V padded with zero rows to a multiple of width."""
  pad = -rows.shape[0] % width
  return jnp.pad(rows, [(0, pad), (0, 0)]).reshape(-1, width, rows.shape[1])


def _slice_logits(h, w, first, vocab, temperature, precision):
  """h [N, D] times the slice w [width, D] of the head starting at column `first`: float32 logits
  / temperature [N, width], padding columns (at or past `vocab`) at _MASK."""
  dims = (((1,), (1,)), ((), ()))
  z = jax.lax.dot_general(h, w, dims, precision=precision, preferred_element_type=jnp.float32) / temperature
  columns = first + jnp.arange(w.shape[0])
  return jnp.where(columns < vocab, z, _MASK), columns


def _forward(hidden, head_rows, tokens, temperature, precision):
  """(log-probs, logsumexps, entropies, the logits when one slice holds the whole vocabulary)."""
  n, vocab = hidden.shape[0], head_rows.shape[0]
  width = vocab_slice(n, vocab)
  h = hidden.astype(head_rows.dtype)

  def one(carry, args):
    top, total, weighted, picked = carry
    w, first = args
    z, columns = _slice_logits(h, w, first, vocab, temperature, precision)
    new_top = jnp.maximum(top, jnp.max(z, axis=-1))
    scale = jnp.exp(top - new_top)
    e = jnp.exp(z - new_top[:, None])
    total = total * scale + jnp.sum(e, axis=-1)
    weighted = weighted * scale + jnp.sum(e * z, axis=-1)
    picked = picked + jnp.sum(jnp.where(columns == tokens[:, None], z, 0.0), axis=-1)
    return (new_top, total, weighted, picked), z

  zeros = jnp.zeros((n,), jnp.float32)
  start = (jnp.full((n,), _MASK), zeros, zeros, zeros)
  if width == vocab:  # one slice: its logits stay for the backward pass instead of being recomputed
    (top, total, weighted, picked), logits = one(start, (head_rows, 0))
  else:
    (top, total, weighted, picked), _ = jax.lax.scan(
      lambda carry, args: (one(carry, args)[0], None), start, (_slices(head_rows, width), jnp.arange(0, vocab, width))
    )
    logits = None
  lse = top + jnp.log(total)
  return picked - lse, lse, lse - weighted / total, logits


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _token_logps(hidden, head_rows, tokens, temperature, precision):
  logps, _, entropy, _ = _forward(hidden, head_rows, tokens, temperature, precision)
  return logps, entropy


def _token_logps_fwd(hidden, head_rows, tokens, temperature, precision):
  logps, lse, entropy, logits = _forward(hidden, head_rows, tokens, temperature, precision)
  return (logps, entropy), (hidden, head_rows, tokens, lse, entropy, logits)


def _token_logps_bwd(temperature, precision, residuals, cotangents):
  """d logp / dz = onehot(token) - p and d entropy / dz = -p * (log p + entropy) for z = logits /
  temperature; a slice's logits gradient gives its head rows' gradient and adds to the hidden
  states'."""
  hidden, head_rows, tokens, lse, entropy, logits = residuals
  g_logps, g_entropy = cotangents
  n, vocab = hidden.shape[0], head_rows.shape[0]
  width = vocab_slice(n, vocab)
  h = hidden.astype(head_rows.dtype)

  def one(h_grad, args, z=None):
    w, first = args
    if z is None:
      z, columns = _slice_logits(h, w, first, vocab, temperature, precision)
    else:
      columns = first + jnp.arange(w.shape[0])
    log_p = z - lse[:, None]
    p = jnp.exp(log_p)
    onehot = columns == tokens[:, None]
    dz = (g_logps[:, None] * (onehot - p) - g_entropy[:, None] * p * (log_p + entropy[:, None])) / temperature
    dz = jnp.where(columns < vocab, dz, 0.0).astype(head_rows.dtype)
    h_grad = h_grad + jnp.dot(dz, w, precision=precision, preferred_element_type=jnp.float32)
    dims = (((0,), (0,)), ((), ()))
    w_grad = jax.lax.dot_general(dz, h, dims, precision=precision, preferred_element_type=jnp.float32)
    return h_grad, w_grad.astype(head_rows.dtype)

  start = jnp.zeros(hidden.shape, jnp.float32)
  if logits is not None:
    h_grad, w_grads = one(start, (head_rows, 0), logits)
  else:
    h_grad, w_grads = jax.lax.scan(one, start, (_slices(head_rows, width), jnp.arange(0, vocab, width)))
  tokens_grad = jnp.zeros(tokens.shape, jax.dtypes.float0)
  return h_grad.astype(hidden.dtype), w_grads.reshape(-1, hidden.shape[1])[:vocab], tokens_grad


_token_logps.defvjp(_token_logps_fwd, _token_logps_bwd)
