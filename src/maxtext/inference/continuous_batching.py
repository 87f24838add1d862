"""Continuous batching for the KV-cache decoder: concurrent requests share one decode batch.

A `ContinuousBatcher` owns `max_batch_size` slots of one KV cache and a scheduler thread. Callers
`submit` a tokenized prompt with its own sampling parameters and PRNG key from any thread and get a
Future. The scheduler dispatches decode steps in chunks of up to `steps_per_dispatch` (one
kv_programs._decode program each; the tokens come back to the host once per chunk). A chunk runs
with the model's weights as they are when it starts (a trainer that updates the model in place
reaches requests in flight from the next chunk on) and tags its tokens with the weights version read
before it. Between chunks the scheduler admits waiting requests into free slots (slots.Slots.admit:
which slot, and which held or shared prompt prefix each reuses), prefills them (several in one call,
in chunks of at most `prefill_chunk` tokens; all of a prompt but its last token, which the request's
first decode step feeds, so prefill computes no logits), releases finished requests (their slots
keep the keys and values they hold for later requests), and grows or shrinks the cache as the
table decides. Held prefixes are dropped when the weights version changes or `weights_changed()` is
called. A request in flight then goes on with the new weights over the keys and values it holds
(computed by the weights before, as in vLLM's pause and resume and PipelineRL's in-flight updates):
what it samples from then on is tagged with the new version, and its recorded log-probs are those it
was sampled with. A completion keeps its EOS token and carries, per token, the log-probability under the
temperature-scaled distribution (what a GRPO trainer recomputes) and the weights version that
produced it; its tokens do not depend on which other requests shared its batch or on the chunk
(see kv_programs).

`paused()` holds the scheduler between chunks while its caller replaces the weights (a sampler on
devices of its own taking the trainer's): requests in flight wait, none is dropped, and none reads
half-replaced weights.

A request's `on_tokens` callback (optional) gets each chunk's tokens and log-probs as they are
recorded, on the scheduler thread (it must return at once and not raise), for callers that stream.
A caller that cancels its Future (Future.cancel()) gives its request up: it leaves the queue, or its
slot before the next chunk.

With `unrolled_layers` (the default) the batcher decodes with unrolled layers, each layer's weights
and KV cache arrays of their own (no per-layer copy out of stacked arrays in a decode step). A model
with scan_layers sampled so, or with `matmul_dtype` set (bfloat16 halves the weight bytes a decode step
reads), is sampled from a `DecodeCopy` of it: made whenever requests are admitted into an empty batch,
remade when version() changes or `weights_changed()` is called, dropped while the batcher waits idle.
Otherwise the model is read as it is: updates in place show.

`decode_rate()` reports the decode steps' throughput (steps that compiled left out): busy rows'
tokens per second, and the bytes per second those steps had to read at least (every weight and the
whole KV cache once per step), which a GPU's HBM bandwidth bounds.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from maxtext.inference import program_census
from maxtext.inference.kv_programs import _decode, _extend, _put_rows, _resize, _StaticGraph, _take_rows
from maxtext.inference.slots import Admission, Request, Slots, _bucket, _chunk_width, _filled
from maxtext.models.decoder import DecodeCopy, Decoder, cache_rows

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


def unrolled_layers(rollout_layers: str) -> bool:
  """The batcher's unrolled_layers for the config's rollout_layers: auto is unrolled on a GPU or TPU
  and stacked on a CPU, where the copies a stacked layer's decode step makes cost a few percent of it
  and compiling every layer more (benchmarks/RESULTS.md, "Decode from unrolled layers")."""
  if rollout_layers == "auto":
    return jax.default_backend() != "cpu"
  return rollout_layers == "unrolled"


def _key_data(key) -> np.ndarray:
  """A PRNG key (typed or raw; None for greedy requests) as uint32[2]."""
  if key is None:
    return np.zeros(2, np.uint32)
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return np.asarray(key, np.uint32)


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
    unrolled_layers: bool = True,
  ):
    """version() returns the number to tag tokens with, read before each decode step; a change
    drops held prefixes (and remakes the copy). cache_size: the most tokens (prompt + completion) of
    one request. matmul_dtype: None samples with the model's own dtypes, else from a DecodeCopy in
    that dtype. unrolled_layers: a scanned model is sampled from an unrolled DecodeCopy (else from its
    stacked layers)."""
    self._decoder = model.config
    copied = matmul_dtype is not None or (model.config.scan_layers and unrolled_layers)
    self._copy = DecodeCopy(model, matmul_dtype, unrolled_layers) if copied else None
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
      cache = (self._copy or model).init_cache(1, cache_size, cache_dtype or model.config.dtype)
      self._cache = jax.device_put(cache, placement)
    self._table = Slots(max_batch_size, version())  # which request each slot decodes, what free ones hold
    self._waiting: collections.deque[Request] = collections.deque()
    lock = threading.RLock()  # the version source may call weights_changed() under it
    self._wake = threading.Condition(lock)  # the scheduler waits on it for work (or for a pause to end)
    self._between = threading.Condition(lock)  # pause() waits on it for the scheduler to be between chunks
    self._pauses = 0  # pause() bodies running: the scheduler does not start another round
    self._working = False  # the scheduler is in a round (admitting, prefilling, decoding a chunk)
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

  @property
  def version(self) -> int:
    """The weights version read before the latest round (what new tokens are tagged with)."""
    return self._table.version

  # ------------------------------------------------------------------ callers' side
  def submit(
    self,
    prompt,
    params: SamplingParams,
    key: jax.Array | None = None,
    on_tokens: Callable[[list[int], list[float]], None] | None = None,
    owner: Any = None,
  ) -> concurrent.futures.Future:
    """Queues one prompt (token ids); the Future resolves to a Completion. key: the request's PRNG
    key (not needed for greedy decoding); on_tokens: called with each chunk's tokens and log-probs
    (see the module docstring); owner: see submit_many."""
    return self.submit_many([prompt], params, [key], [on_tokens], owner)[0]

  def submit_many(
    self, prompts, params: SamplingParams | list[SamplingParams], keys=None, on_tokens=None, owner: Any = None
  ) -> list[concurrent.futures.Future]:
    """Queues several prompts at once (they are admitted together while slots are free, so prompts
    with a common prefix, such as a GRPO group's, read it once); params: shared or one per prompt;
    keys and on_tokens: one per prompt or None. owner (hashable): who asks, for fair admission
    (slots.Slots.admit: free slots go to the owner holding the fewest); None: this call alone."""
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    owner = object() if owner is None else owner
    requests = [
      Request(self._checked(p, q), q, _key_data(k), concurrent.futures.Future(), callback, owner)
      for p, q, k, callback in zip(
        prompts, per_prompt, keys or [None] * len(prompts), on_tokens or [None] * len(prompts)
      )
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

  @contextlib.contextmanager
  def paused(self):
    """The scheduler held between rounds while the body runs (to replace the weights it reads):
    pause() returns once the round under way, if any, has ended; requests in flight wait, none is
    dropped, new ones queue, and after the body all of them go on with the weights then held, their
    tokens tagged with the version read then."""
    with self._between:
      self._pauses += 1
      while self._working:
        self._between.wait()
    try:
      yield
    finally:
      with self._wake:
        self._pauses -= 1
        self._wake.notify()

  def weights_changed(self) -> None:
    """The model's weights changed (whether or not version() did): held prefixes are dropped and a
    copy (DecodeCopy) is remade before the next decode step."""
    with self._wake:
      self._stale = True

  def decode_layer_copies(self, rows: int) -> dict[str, int]:
    """program_census.layer_copies of the decode-chunk program this batcher runs at `rows` rows: {}
    when its decode steps copy no layer's weight matrix or KV cache."""
    layer = program_census.layer_buffers(self._decoder, rows, self.cache_size)
    return program_census.layer_copies(self.decode_program(rows), layer)

  def decode_program(self, rows: int) -> str:
    """The optimized HLO text of the decode-chunk program this batcher runs at `rows` rows (greedy
    rows, one EOS id, chunks of steps_per_dispatch), compiled from abstract arrays here."""
    state: Any = self._state if self._copy is None else jax.eval_shape(self._copy.state)
    cache = jax.eval_shape(lambda: _resize(self._cache, rows))
    ints = jax.ShapeDtypeStruct((rows,), jnp.int32)
    compiled = _decode.lower(
      self._graphdef,
      state,
      cache,
      ints,
      ints,
      ints,
      jax.ShapeDtypeStruct((rows, 2), jnp.uint32),
      jax.ShapeDtypeStruct((rows, 2), jnp.float32),
      ints,
      None,
      ints,
      jax.ShapeDtypeStruct((rows, 1), jnp.int32),
      jax.ShapeDtypeStruct((2,), jnp.int32),
      self.steps_per_dispatch,
    ).compile()
    return compiled.as_text() or ""

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
          if self._copy is not None and not self._waiting and not self._table.busy():
            self._state = None  # idle: the copy's memory goes back until the next request
          while not self._closed and (self._pauses or (not self._waiting and not self._table.busy())):
            self._wake.wait()
          if self._closed:
            break
          self._working = True
          self._drop_cancelled()
          changed = self._table.set_version(self._version_source(), self._stale)
          self._stale = False
          admitted = self._table.admit(self._waiting)
          starting = bool(admitted) and not self._table.busy()  # a busy period begins
        if self._copy is not None and (self._state is None or changed or starting):
          self._state = None  # the old copy goes before the new one is made
          self._state = self._copy.state()
        if admitted:
          self._fit_rows(self._table.grown_rows(self.rows, admitted))
          self._prefill(admitted)
          self._table.place(admitted)
        if self._table.busy():
          self._step()
          self._shrink()
        with self._between:
          self._working = False
          self._between.notify_all()
    except BaseException as e:
      log.exception("continuous batcher failed")
      with self._wake:
        self._failure = e
        self._working = False
        self._between.notify_all()
      self._fail_all(e)
      return
    self._fail_all(RuntimeError("the batcher was closed"))

  def _drop_cancelled(self) -> None:
    """Requests whose Future was cancelled leave the queue and their slots (under the lock)."""
    if any(r.future.cancelled() for r in self._waiting):
      self._waiting = collections.deque(r for r in self._waiting if not r.future.cancelled())
    for slot, r in enumerate(self._table.requests):
      if r is not None and r.future.cancelled():
        self._table.release(slot)

  def queued(self) -> int:
    """Requests waiting for a slot now."""
    with self._wake:
      return len(self._waiting)

  def active(self) -> int:
    """Requests waiting or decoding now (a cancelled one counts until the scheduler drops it)."""
    with self._wake:
      return len(self._waiting) + sum(r is not None for r in self._table.requests)

  @property
  def rows(self) -> int:
    """Cache rows now allocated (each decode step computes all of them)."""
    return cache_rows(self._cache)

  def _fit_rows(self, rows: int) -> None:
    """Gives the cache `rows` rows (its first rows kept) unless it has them already."""
    if rows != self.rows:
      self._cache = _resize(self._cache, rows)

  def _shrink(self) -> None:
    """Halves the cache when the slot table says so (see Slots.shrink)."""
    with self._wake:
      waiting = bool(self._waiting)
    self._fit_rows(self._table.shrink(self.rows, waiting))

  def _fail_all(self, error: BaseException) -> None:
    with self._wake:
      self._closed = True
      requests = self._table.clear() + list(self._waiting)
      self._waiting.clear()
    for r in requests:
      _resolve(r.future, exception=error)

  def _sampling_arrays(self, requests: list[Request | None]):
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

  def _prefill(self, admitted: list[Admission]) -> None:
    """Prefills requests whose reused prefix is held in their own slot, then copies the others'
    shared prefixes from their source slots (busy ones, or ones just prefilled) and prefills the
    rest of their prompts (the caller then places them in their slots: the next decode step feeds
    each prompt's last token and samples its first)."""
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

  def _feed(self, pending: list[tuple[int, Request, int]]) -> None:
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
    requests = self._table.requests[: self.rows]
    last = np.array([(r.tokens[-1] if r.tokens else r.prompt[-1]) if r is not None else 0 for r in requests], np.int32)
    # A busy row feeds its next token after what it holds; an idle one writes past its held prefix.
    positions = np.array(
      [_filled(r) if r is not None else len(self._table.held[slot]) for slot, r in enumerate(requests)], np.int32
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
    chunk = 1 if waiting and self._table.has_free() else self.steps_per_dispatch
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

  def _record(self, slot: int, r: Request, tokens: list[int], logps: list[float]) -> None:
    """Appends a chunk's sampled tokens; a request that hit EOS or its budget leaves its slot."""
    r.tokens.extend(tokens)
    r.logprobs.extend(logps)
    r.versions.extend([self.version] * len(tokens))
    if r.on_tokens is not None and tokens and not r.future.cancelled():
      r.on_tokens(tokens, logps)
    stopped = bool(tokens) and tokens[-1] in r.params.eos_ids
    if stopped or len(r.tokens) >= r.params.max_new_tokens:
      self._table.release(slot)
      _resolve(
        r.future,
        Completion(
          np.array(r.tokens, np.int32), np.array(r.logprobs, np.float32), np.array(r.versions, np.int32), stopped
        ),
      )


def _resolve(future: concurrent.futures.Future, result=None, exception: BaseException | None = None) -> None:
  """Sets a request's result or exception unless its caller cancelled it (even just now)."""
  try:
    if exception is not None:
      future.set_exception(exception)
    else:
      future.set_result(result)
  except concurrent.futures.InvalidStateError:  # cancelled (or already failed): nobody waits for it
    pass
