"""The batcher's device programs on one KV cache (jitted; the model passed as a static
`_StaticGraph` and its state): prefill a chunk of prompt tokens into some cache rows (`_extend`),
move rows between slots (`_take_rows`, `_put_rows`), resize the cache (`_resize`), and run a chunk
of decode steps over every row (`_decode`, sampling with `_sample`).

A decode chunk loops over up to `width` steps on the device (sampling, log-probs, stopping rows at
EOS or their budget) and hands the tokens back once. It ends where single steps would change the
batch (a request finishes while others wait, or the cache would shrink, see slots.Slots.shrink), so
requests queued together get the same tokens and bit-identical log-probs whatever the chunk. Each
row's draws depend only on its own key and token index, so its tokens do not depend on which other
rows share its batch (its log-probs do, to float32 rounding, through the batch's row count). A
token's log-probability is taken under the temperature-scaled distribution (what a GRPO trainer
recomputes).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.models.decoder import cache_length


class _StaticGraph:
  """A GraphDef as a jit static argument, hashed once (hashing a model's GraphDef takes
  milliseconds, a noticeable share of a small decode step)."""

  def __init__(self, graphdef):
    self.graphdef = graphdef
    self._hash = hash(graphdef)

  def __hash__(self):
    return self._hash

  def __eq__(self, other):
    return isinstance(other, _StaticGraph) and (self.graphdef is other.graphdef or self.graphdef == other.graphdef)


def _sample(logits, keys, steps, temperature, top_p, top_k, top_width: int | None):
  """Per-row sampling. logits [N, V] float32; keys [N, 2]; steps [N] (the token index, folded into
  the row's key); temperature/top_p [N] float; top_k [N] int (<= top_width when filtering).
  top_width None: no top-k/top-p filter in this batch. Returns tokens [N] and their log-probs under
  softmax(logits / temperature) ([N], 0 for greedy rows).

  A row draws with the Gumbel-max trick, its noise indexed by token id and drawn from its own key
  over the whole vocabulary (what jax.random.categorical does), then restricted to the tokens its
  filters keep: its draw does not depend on top_width or on the other rows of the batch."""
  greedy = temperature <= 0
  scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
  logp = jax.nn.log_softmax(scaled, axis=-1)
  row_keys = jax.vmap(jax.random.fold_in)(keys, steps)
  noise = jax.vmap(lambda key: jax.random.gumbel(key, scaled.shape[1:], scaled.dtype))(row_keys)
  if top_width is None:
    drawn = jnp.argmax(scaled + noise, axis=-1)
  else:
    values, index = jax.lax.top_k(scaled, top_width)
    keep = jnp.arange(top_width)[None, :] < top_k[:, None]
    probs = jax.nn.softmax(jnp.where(keep, values, -jnp.inf), axis=-1)
    keep &= (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]
    perturbed = jnp.where(keep, values + jnp.take_along_axis(noise, index, axis=-1), -jnp.inf)
    drawn = jnp.take_along_axis(index, jnp.argmax(perturbed, axis=-1)[:, None], axis=-1)[:, 0]
  tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), drawn).astype(jnp.int32)
  chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
  return tokens, jnp.where(greedy, 0.0, chosen)


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def _extend(graph, state, rows, tokens, starts):
  """Writes the keys and values of tokens [n, C] into cache rows `rows` (n rows taken out of the
  cache) from positions starts[n] on; a row's padding past its real tokens is written too and
  overwritten later. No logits are used, so the output layer is not computed. Its shapes do not
  depend on the cache's row count, so growing the cache compiles no new prefill."""
  model = nnx.merge(graph.graphdef, state)
  for layer in rows.values():
    layer["end_index"] = starts
  size = cache_length(rows)
  positions = starts[:, None] + jnp.arange(tokens.shape[1])[None, :]
  mask = jnp.arange(size)[None, None, :] <= positions[:, :, None]
  _, rows = model(tokens, positions, rows, mask)
  return rows


@jax.jit
def _take_rows(cache, slots):
  """Cache rows `slots`, as a cache of len(slots) rows."""
  return jax.tree.map(lambda x: x[slots], cache)


@functools.partial(jax.jit, donate_argnums=(0,))
def _put_rows(cache, slots, rows):
  """The cache with rows `slots` replaced by `rows`."""
  return jax.tree.map(lambda full, part: full.at[slots].set(part), cache, rows)


@functools.partial(jax.jit, static_argnums=(1,))
def _resize(cache, rows: int):
  """The cache with `rows` rows: its first rows kept, any new ones empty."""

  def fit(x):
    if x.shape[0] >= rows:
      return x[:rows]
    return jnp.concatenate([x, jnp.zeros((rows - x.shape[0],) + x.shape[1:], x.dtype)])

  return jax.tree.map(fit, cache)


@functools.partial(jax.jit, static_argnums=(0, 9, 13), donate_argnums=(2,))
def _decode(graph, state, cache, tokens, positions, steps, keys, sampling, top_k, top_width, limits, eos, until, width):
  """Up to until[0] (<= width) decode steps for every cache row in one program. A step feeds each
  row's last token at its position and samples the row's next one; a busy row stops after EOS (any
  of its eos [rows, E] ids; -1 pads) or once it holds limits[rows] tokens, and then, like an idle
  row (limit 0), feeds its last token again at a position past what it holds. After its first step
  the loop ends early where a loop of single steps would change the batch: when no row is busy,
  when until[1] is set (requests wait for a slot) and a row stopped, or when nothing waits and the
  busy slots fit a quarter of the rows (the host then shrinks the cache). So every token is computed
  with the same rows, and the same bits, whatever the chunk. Returns tokens and log-probs [rows,
  width], how many of them each row made, the decode steps run and the cache."""
  model = nnx.merge(graph.graphdef, state)
  size = cache_length(cache)
  rows = tokens.shape[0]

  def step(carry):
    i, cache, last, positions, steps, busy, out_tokens, out_logp, made = carry
    for layer in cache.values():
      layer["end_index"] = positions
    mask = jnp.arange(size)[None, None, :] <= positions[:, None, None]
    logits, cache = model(last[:, None], positions[:, None], cache, mask)
    drawn, logp = _sample(logits[:, 0], keys, steps, sampling[:, 0], sampling[:, 1], top_k, top_width)
    out_tokens = out_tokens.at[:, i].set(drawn)
    out_logp = out_logp.at[:, i].set(logp)
    made = made + busy
    stops = (drawn[:, None] == eos).any(axis=1) | (steps + 1 >= limits)
    last = jnp.where(busy, drawn, last)
    positions = jnp.where(busy, positions + 1, positions)
    steps = jnp.where(busy, steps + 1, steps)
    return i + 1, cache, last, positions, steps, busy & ~stops, out_tokens, out_logp, made

  busy = steps < limits
  waiting = until[1].astype(bool)

  def more(carry):
    i, now = carry[0], carry[5]
    highest = jnp.max(jnp.where(now, jnp.arange(rows) + 1, 0))  # the busy slots fit this many rows
    admit = waiting & (now != busy).any()  # a slot is free for a waiting request
    shrink = ~waiting & (4 * highest <= rows)  # the host would halve the cache (slots.Slots.shrink)
    return (i < until[0]) & now.any() & ((i == 0) | ~(admit | shrink))

  start = (
    jnp.int32(0),
    cache,
    tokens,
    positions,
    steps,
    busy,
    jnp.zeros((rows, width), jnp.int32),
    jnp.zeros((rows, width), jnp.float32),
    jnp.zeros(rows, jnp.int32),
  )
  ran, cache, _, _, _, _, out_tokens, out_logp, made = jax.lax.while_loop(more, step, start)
  return out_tokens, out_logp, made, ran, cache
