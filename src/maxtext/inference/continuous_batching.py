"""Continuous batching for the KV-cache decoder: concurrent requests share one decode batch.

A `ContinuousBatcher` owns `max_batch_size` slots of one KV cache and a scheduler thread. Callers
`submit` a tokenized prompt with its own sampling parameters and PRNG key from any thread and get a
Future. The scheduler dispatches decode steps in chunks of up to `steps_per_dispatch`: one compiled
program loops over the steps on the device (sampling, log-probs, stopping rows at EOS or their
budget) and the tokens come back to the host once per chunk. A chunk runs with the model's weights
as they are when it starts (a trainer that updates the model in place reaches requests in flight
from the next chunk on) and tags its tokens with the weights version read before it. Between
chunks the scheduler prefills waiting requests into free slots (several in one call, in chunks of
at most `prefill_chunk` tokens; all of a prompt but its last token, which the request's first
decode step feeds, so prefill computes no logits), and releases finished requests. A chunk ends
where single steps would change the batch (a request finishes while others wait, or the cache
would shrink), so requests queued together get the same tokens and bit-identical log-probs
whatever the chunk. Each request's draws depend only on its own key and token index, so its tokens
do not depend on which other requests shared its batch (its log-probs do, to float32 rounding,
through the batch's row count). A completion keeps its EOS token and carries, per token, the
log-probability under the temperature-scaled distribution (what a GRPO trainer recomputes) and the
weights version that produced it.

KV-prefix reuse: a finished request's slot keeps its keys and values (prompt and completion) until
the slot is needed again or the weights change. A new request goes to the free slot whose held
tokens share the longest prefix with its prompt and prefills only the rest: a later turn of a
conversation re-reads only the tool output, and conversations that share a system prompt read it
once per slot. A request also copies a common prefix from a busy slot or from a request admitted
with it, so a GRPO group's samples read their prompt once, whether they arrive together or not.
Held prefixes are dropped when the weights version changes, so reused keys and values always come
from the current weights.

With `matmul_dtype` set the batcher samples from a `MatmulCopy` of the model in that dtype (bfloat16
halves the weight bytes a decode step reads): made whenever requests are admitted into an empty
batch, remade when version() changes or `weights_changed()` is called, dropped while the batcher
waits idle.

`decode_rate()` reports the decode steps' throughput (steps that compiled left out): busy rows'
tokens per second, and the bytes per second those steps had to read at least (every weight and the
whole KV cache once per step), which a GPU's HBM bandwidth bounds.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from maxtext.models.decoder import Decoder, MatmulCopy, cache_length, cache_rows

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """temperature 0 is greedy; top_k None or top_p 1.0 turn that filter off."""

  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int | None = None
  eos_ids: tuple[int, ...] = ()


@dataclasses.dataclass
class Completion:
  """Generated tokens (ending with EOS when the request stopped on it), their log-probs and the
  weights version each was sampled with."""

  tokens: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray
  stopped: bool  # ended on an EOS token (else it used its whole budget)


@dataclasses.dataclass
class _Request:
  prompt: np.ndarray
  params: SamplingParams
  key: np.ndarray  # uint32[2]
  future: concurrent.futures.Future
  version: int = 0  # weights version at admission; its keys and values are reusable only under it
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  versions: list = dataclasses.field(default_factory=list)


def _bucket(n: int, cap: int) -> int:
  """The smallest power of two >= n, at most cap (bounds the compiled shapes)."""
  size = 1
  while size < n:
    size *= 2
  return min(size, cap)


def _chunk_width(remaining: int, cap: int) -> int:
  """Prefill chunk width: the largest of 16, 64, 256, ... (at most cap) that the longest remaining
  prompt part fills, so few shapes compile and little padding is computed; 16 for shorter parts."""
  width = min(16, cap)
  while width * 4 <= min(remaining, cap):
    width *= 4
  return width


def _key_data(key) -> np.ndarray:
  """A PRNG key (typed or raw; None for greedy requests) as uint32[2]."""
  if key is None:
    return np.zeros(2, np.uint32)
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return np.asarray(key, np.uint32)


def _shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
  """Length of the longest common prefix of two token arrays."""
  n = min(len(a), len(b))
  differ = np.flatnonzero(a[:n] != b[:n])
  return int(differ[0]) if len(differ) else n


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
    shrink = ~waiting & (4 * highest <= rows)  # the host would halve the cache (ContinuousBatcher._shrink)
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


def _filled(r: _Request) -> int:
  """How many positions of a request's slot hold keys and values: its prompt and sampled tokens but
  the last one (a decode step feeds that one, the prompt's last token before the first). The next
  decode step writes at this position."""
  return len(r.prompt) - 1 + len(r.tokens)


def _cached(r: _Request) -> np.ndarray:
  """The tokens whose keys and values a request's slot holds (see _filled)."""
  return np.concatenate([r.prompt, np.asarray(r.tokens, np.int32)])[: _filled(r)]


class ContinuousBatcher:
  """Slots of one KV cache shared by concurrent generate requests (see the module docstring)."""

  def __init__(
    self,
    model: Decoder,
    cache_size: int,
    max_batch_size: int,
    *,
    version: Callable[[], int] = lambda: 0,
    cache_dtype=None,
    prefill_chunk: int = 256,
    matmul_dtype=None,
    steps_per_dispatch: int = 1,
  ):
    """version() returns the number to tag tokens with, read before each decode step; a change
    drops held prefixes (and remakes a matmul_dtype copy). cache_size: the most tokens (prompt +
    completion) of one request. matmul_dtype: None samples from the model's own weights, else from
    a MatmulCopy in that dtype."""
    self._copy = MatmulCopy(model, matmul_dtype) if matmul_dtype is not None else None
    self._state: nnx.State | None  # a copy's is made when a busy period starts
    if self._copy is None:
      graphdef, self._state = nnx.split(model)  # the model's own variables: updates in place show
    else:
      graphdef, self._state = self._copy.graphdef, None
    self._stale = False  # weights_changed() was called: remake the copy before the next step
    self._graphdef = _StaticGraph(graphdef)
    # The cache lives where the weights do (replicated over their mesh).
    mesh = jax.tree.leaves(nnx.state(model))[0].sharding.mesh
    placement = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    self._version_source = version
    self._vocab = model.config.vocab_size
    self.cache_size = cache_size
    self.max_batch_size = max_batch_size
    if prefill_chunk < 1:
      raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
    self.prefill_chunk = prefill_chunk
    if steps_per_dispatch < 1:
      raise ValueError(f"steps_per_dispatch must be >= 1, got {steps_per_dispatch}")
    self.steps_per_dispatch = steps_per_dispatch
    # Rows grow with demand up to max_batch_size (and shrink when few are busy): a decode step
    # computes every row, so idle rows cost as much as busy ones.
    with jax.set_mesh(mesh):  # not the caller's mesh, which may span other devices
      self._cache = jax.device_put(model.init_cache(1, cache_size, cache_dtype or model.config.dtype), placement)
    self._slots: list[_Request | None] = [None] * max_batch_size
    self._held: list[np.ndarray] = [np.zeros(0, np.int32)] * max_batch_size  # tokens whose KV a free slot holds
    self._waiting: collections.deque[_Request] = collections.deque()
    self._admitting: list[_Request] = []  # taken from _waiting, not yet in a slot
    self._wake = threading.Condition()
    self.version = version()
    self._closed = False
    self._failure: BaseException | None = None  # what stopped the scheduler, if it failed
    self._thread: threading.Thread | None = None
    self.decode_steps = 0  # decode steps so far (each advances every busy slot by one token)
    self.decode_dispatches = 0  # decode programs dispatched so far (each runs a chunk of steps)
    self.prompt_tokens = 0  # prompt tokens admitted so far
    self.reused_tokens = 0  # of those, read from a held KV prefix instead of prefilled
    self._weight_bytes = (
      self._copy.nbytes if self._copy else sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    )
    self._compiled: set[tuple[int, int | None, int]] = (
      set()
    )  # (rows, top-k width, EOS ids) of decode programs run so far
    self._timed = (0, 0.0, 0)  # decode steps that did not compile: busy-row tokens, seconds, bytes read

  # ------------------------------------------------------------------ callers' side
  def submit(self, prompt, params: SamplingParams, key: jax.Array | None = None) -> concurrent.futures.Future:
    """Queues one prompt (token ids); the Future resolves to a Completion. key: the request's PRNG
    key (not needed for greedy decoding)."""
    return self.submit_many([prompt], params, [key])[0]

  def submit_many(
    self, prompts, params: SamplingParams | list[SamplingParams], keys=None
  ) -> list[concurrent.futures.Future]:
    """Queues several prompts at once (they are admitted together while slots are free, so prompts
    with a common prefix, such as a GRPO group's, read it once); params: shared or one per prompt;
    keys: one per prompt or None."""
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    requests = [
      _Request(self._checked(p, q), q, _key_data(k), concurrent.futures.Future())
      for p, q, k in zip(prompts, per_prompt, keys or [None] * len(prompts))
    ]
    with self._wake:
      if self._failure is not None:
        raise RuntimeError(f"the batcher failed: {self._failure}") from self._failure
      if self._closed:
        raise RuntimeError("the batcher is closed")
      if self._thread is None:
        self._thread = threading.Thread(target=self._run, name="continuous-batcher", daemon=True)
        self._thread.start()
      self._waiting.extend(requests)
      self._wake.notify()
    return [r.future for r in requests]

  def weights_changed(self) -> None:
    """The model's weights changed (whether or not version() did): held prefixes are dropped and a
    matmul_dtype copy is remade before the next decode step."""
    with self._wake:
      self._stale = True

  def decode_rate(self) -> tuple[float, float] | None:
    """(tokens/s, bytes read/s) of the decode steps so far that did not compile; None before any."""
    tokens, seconds, read = self._timed
    return (tokens / seconds, read / seconds) if seconds else None

  def _checked(self, prompt, params: SamplingParams) -> np.ndarray:
    prompt = np.asarray(prompt, np.int32)
    if len(prompt) == 0:
      raise ValueError("cannot generate from an empty prompt")
    if len(prompt) + params.max_new_tokens > self.cache_size:
      raise ValueError(
        f"a prompt of {len(prompt)} tokens plus {params.max_new_tokens} tokens to generate exceeds "
        f"the KV cache of {self.cache_size} tokens"
      )
    if params.top_k is not None and params.top_k < 1:
      raise ValueError(f"top_k must be None or >= 1, got {params.top_k}")
    return prompt

  def close(self) -> None:
    """Stops the scheduler; unfinished requests fail."""
    with self._wake:
      self._closed = True
      self._wake.notify()
    if self._thread is not None:
      self._thread.join()

  # ------------------------------------------------------------------ scheduler thread
  def _run(self) -> None:
    try:
      while True:
        with self._wake:
          if self._copy is not None and not self._waiting and not any(self._slots):
            self._state = None  # idle: the copy's memory goes back until the next request
          while not self._closed and not self._waiting and not any(self._slots):
            self._wake.wait()
          if self._closed:
            break
          version = self._version_source()
          changed = version != self.version or self._stale
          if changed:  # held keys and values came from older weights
            self._held = [np.zeros(0, np.int32)] * self.max_batch_size
          self.version, self._stale = version, False
          admitted = self._take_waiting()
          starting = bool(admitted) and not any(self._slots)  # a busy period begins
        if self._copy is not None and (self._state is None or changed or starting):
          self._state = None  # the old copy goes before the new one is made
          self._state = self._copy.state()
        if admitted:
          self._grow(max(slot for slot, _, _, _ in admitted) + 1)
          self._prefill(admitted)
          self._admitting = []
        if any(self._slots):
          self._step()
          self._shrink()
    except BaseException as e:
      log.exception("continuous batcher failed")
      with self._wake:
        self._failure = e
      self._fail_all(e)
      return
    self._fail_all(RuntimeError("the batcher was closed"))

  def _take_waiting(self) -> list[tuple[int, _Request, int, int | None]]:
    """(slot, request, reused prefix length, slot to copy that prefix from or None) for waiting
    requests, in arrival order, while slots are free. A request reuses the longest prefix of its
    prompt that a free slot holds (it then goes to that slot), or copies it from a busy slot or from
    a request prefilled in this round (so samples of one prompt read it once, together or not). A
    prompt's last token is never reused: the first decode step feeds it. Among equals the lowest
    slot wins, so busy slots stay low."""
    free = [i for i, r in enumerate(self._slots) if r is None]
    if not (free and self._waiting):  # the usual case between decode steps: nothing to admit
      self._admitting = []
      return []
    sources = [(slot, _cached(r)) for slot, r in enumerate(self._slots) if r is not None and r.version == self.version]
    taken = []
    while free and self._waiting:
      r = self._waiting.popleft()
      r.version = self.version
      room = len(r.prompt) - 1
      held = [min(_shared_prefix(self._held[i], r.prompt), room) for i in free]
      best = max(range(len(free)), key=lambda j: (held[j], -free[j]))
      shared, source = max(
        ((min(_shared_prefix(tokens, r.prompt), room), slot) for slot, tokens in sources), default=(0, None)
      )
      if shared > held[best]:
        taken.append((free.pop(0), r, shared, source))
      else:
        taken.append((free.pop(best), r, held[best], None))
        sources.append((taken[-1][0], _cached(r)))  # what its slot holds once prefilled
    self._admitting = [r for _, r, _, _ in taken]
    return taken

  @property
  def rows(self) -> int:
    """Cache rows now allocated (each decode step computes all of them)."""
    return cache_rows(self._cache)

  def _grow(self, needed: int) -> None:
    """Grows the cache to the smallest power of two of rows (at most max_batch_size) >= needed."""
    if needed > self.rows:
      self._cache = _resize(self._cache, _bucket(needed, self.max_batch_size))

  def _shrink(self) -> None:
    """Halves the cache when the busy slots fit a quarter of it and nothing waits; prefixes held in
    the dropped rows are forgotten. An idle batcher keeps its rows (and held prefixes)."""
    busy = max((i + 1 for i, r in enumerate(self._slots) if r is not None), default=0)
    with self._wake:
      waiting = bool(self._waiting)
    if busy and not waiting and 4 * busy <= self.rows:
      rows = self.rows // 2
      self._cache = _resize(self._cache, rows)
      self._held[rows:] = [np.zeros(0, np.int32)] * (self.max_batch_size - rows)

  def _fail_all(self, error: BaseException) -> None:
    with self._wake:
      self._closed = True
      requests = [r for r in self._slots if r is not None] + self._admitting + list(self._waiting)
      self._slots = [None] * self.max_batch_size
      self._waiting.clear()
    for r in requests:
      if not r.future.done():
        r.future.set_exception(error)

  def _sampling_arrays(self, requests: list[_Request | None]):
    """Per-row [temperature, top_p] and top_k, and the static top-k width: None when no sampling
    row filters, else the widest candidate set a sampling row needs (the vocabulary for a row
    with top_p < 1 or without top_k)."""
    params = [r.params if r is not None else SamplingParams(1, temperature=0.0) for r in requests]
    drawing = [p for p in params if p.temperature > 0]
    width = None
    if any(p.top_k is not None or p.top_p < 1.0 for p in drawing):
      need = max(p.top_k if p.top_k is not None and p.top_p >= 1.0 else self._vocab for p in drawing)
      width = min(_bucket(need, self._vocab), self._vocab)
    sampling = np.array([[p.temperature, p.top_p] for p in params], np.float32)
    top_k = np.array([min(p.top_k or self._vocab, self._vocab) for p in params], np.int32)
    return sampling, top_k, width

  def _prefill(self, admitted: list[tuple[int, _Request, int, int | None]]) -> None:
    """Prefills requests whose reused prefix is held in their own slot, then copies the others'
    shared prefixes from their source slots (busy ones, or ones just prefilled) and prefills the
    rest of their prompts; every request then takes its slot (the next decode step feeds its
    prompt's last token and samples its first)."""
    for _, r, reused, _ in admitted:
      self.prompt_tokens += len(r.prompt)
      self.reused_tokens += reused
    self._feed([(slot, r, reused) for slot, r, reused, source in admitted if source is None])
    copies = [(source, slot, r, reused) for slot, r, reused, source in admitted if source is not None]
    if copies:
      n = _bucket(len(copies), self.max_batch_size)
      pairs = np.array(
        [[source, slot] for source, slot, _, _ in copies] + [copies[-1][:2]] * (n - len(copies)), np.int32
      )
      self._cache = _put_rows(self._cache, pairs[:, 1], _take_rows(self._cache, pairs[:, 0]))
      self._feed([(slot, r, reused) for _, slot, r, reused in copies])
    for slot, r, _, _ in admitted:
      self._slots[slot] = r

  def _feed(self, pending: list[tuple[int, _Request, int]]) -> None:
    """Feeds each (slot, request, tokens already in the slot) prompt's remaining tokens but the last,
    all rows together in chunks (see _chunk_width; rows padded to a power of two). A chunk that
    would run past the cache starts earlier, feeding again prompt tokens the slot already holds."""
    pending = [(slot, r, done) for slot, r, done in pending if done < len(r.prompt) - 1]
    while pending:
      width = _chunk_width(
        max(len(r.prompt) - 1 - done for _, r, done in pending), min(self.prefill_chunk, self.cache_size)
      )
      n = _bucket(len(pending), self.max_batch_size)
      group = pending + [pending[-1]] * (n - len(pending))  # repeats rewrite the same slot with the same rows
      starts = np.array([min(done, self.cache_size - width) for _, _, done in group], np.int32)
      tokens = np.zeros((n, width), np.int32)
      ends = np.zeros(n, np.int32)
      for i, (_, r, _) in enumerate(group):
        part = r.prompt[starts[i] : min(starts[i] + width, len(r.prompt) - 1)]
        tokens[i, : len(part)] = part
        ends[i] = starts[i] + len(part)
      slots = np.array([slot for slot, _, _ in group], np.int32)
      rows = _extend(self._graphdef, self._state, _take_rows(self._cache, slots), tokens, starts)
      self._cache = _put_rows(self._cache, slots, rows)
      pending = [(slot, r, int(ends[i])) for i, (slot, r, _) in enumerate(pending) if ends[i] < len(r.prompt) - 1]

  def _step(self) -> None:
    """Decodes a chunk of up to steps_per_dispatch tokens for every busy slot in one program, then
    records them (a chunk stops at the first finished request when others wait for a slot)."""
    requests = self._slots[: self.rows]
    last = np.array([(r.tokens[-1] if r.tokens else r.prompt[-1]) if r is not None else 0 for r in requests], np.int32)
    # A busy row feeds its next token after what it holds; an idle one writes past its held prefix.
    positions = np.array(
      [_filled(r) if r is not None else len(self._held[slot]) for slot, r in enumerate(requests)], np.int32
    )
    steps = np.array([len(r.tokens) if r is not None else 0 for r in requests], np.int32)
    limits = np.array([r.params.max_new_tokens if r is not None else 0 for r in requests], np.int32)
    eos_sets = [r.params.eos_ids if r is not None else () for r in requests]
    eos = np.full((len(requests), _bucket(max(map(len, eos_sets)), 1 << 30)), -1, np.int32)
    for row, ids in zip(eos, eos_sets):
      row[: len(ids)] = ids
    keys = np.stack([r.key if r is not None else np.zeros(2, np.uint32) for r in requests])
    sampling, top_k, top_width = self._sampling_arrays(requests)
    with self._wake:
      waiting = bool(self._waiting)
    # A request that arrived since the admission round, with a slot free for it, is admitted next step.
    chunk = 1 if waiting and None in self._slots else self.steps_per_dispatch
    until = np.array([chunk, waiting], np.int32)
    read = self._weight_bytes + sum(x.nbytes for x in jax.tree.leaves(self._cache))
    shape = (len(requests), top_width, eos.shape[1])  # what a new decode program is compiled for
    # Dispatch is asynchronous: a prefill dispatched this round may still be running. The meter
    # starts once it has finished, so decode_rate times decode steps only.
    jax.block_until_ready(self._cache)
    started = time.perf_counter()
    tokens, logp, made, ran, self._cache = _decode(
      self._graphdef,
      self._state,
      self._cache,
      last,
      positions,
      steps,
      keys,
      sampling,
      top_k,
      top_width,
      limits,
      eos,
      until,
      self.steps_per_dispatch,
    )
    tokens, logp, made, ran = jax.device_get((tokens, logp, made, ran))  # one copy to the host per chunk
    if shape in self._compiled:
      tokens_so_far, seconds, read_so_far = self._timed  # replaced whole: readers on other threads see one state
      self._timed = (
        tokens_so_far + int(made.sum()),
        seconds + time.perf_counter() - started,
        read_so_far + int(ran) * read,
      )
    self._compiled.add(shape)
    self.decode_steps += int(ran)
    self.decode_dispatches += 1
    for slot, r in enumerate(requests):
      if r is not None:
        self._record(slot, r, tokens[slot, : made[slot]].tolist(), logp[slot, : made[slot]].tolist())

  def _record(self, slot: int, r: _Request, tokens: list[int], logps: list[float]) -> None:
    """Appends a chunk's sampled tokens; a request that hit EOS or its budget leaves its slot."""
    r.tokens.extend(tokens)
    r.logprobs.extend(logps)
    r.versions.extend([self.version] * len(tokens))
    stopped = bool(tokens) and tokens[-1] in r.params.eos_ids
    if stopped or len(r.tokens) >= r.params.max_new_tokens:
      self._slots[slot] = None
      self._held[slot] = _cached(r) if r.version == self.version else np.zeros(0, np.int32)
      r.future.set_result(
        Completion(
          np.array(r.tokens, np.int32), np.array(r.logprobs, np.float32), np.array(r.versions, np.int32), stopped
        )
      )
