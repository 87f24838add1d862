"""Continuous batching for the KV-cache decoder: concurrent requests share one decode batch.

A `ContinuousBatcher` owns `max_batch_size` slots of one KV cache and a scheduler thread. Callers
`submit` a tokenized prompt with its own sampling parameters and PRNG key from any thread and get a
Future. Between decode steps the scheduler reads the current weights and their version (callables,
so a trainer's updates apply from the next step on), prefills waiting requests into free slots
(several in one prefill call), and releases finished requests at once.
Each request's draws depend only on its own key and token index, so a completion does not depend on
which other requests shared its batch. A completion keeps its EOS token and carries, per token, the
log-probability under the temperature-scaled distribution (what a GRPO trainer recomputes) and the
weights version that produced it.

Prompts are prefilled from scratch: a later turn of a conversation re-reads the whole conversation
(no KV-prefix reuse across requests).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import logging
import threading
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

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
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  versions: list = dataclasses.field(default_factory=list)


def _bucket(n: int, cap: int, base: int = 2, minimum: int = 1) -> int:
  """The smallest power of base >= max(n, minimum), at most cap (bounds the compiled shapes)."""
  size = 1
  while size < max(n, minimum):
    size *= base
  return min(size, cap)


def _sample(logits, keys, steps, temperature, top_p, top_k, top_width: int | None):
  """Per-row sampling. logits [N, V] float32; keys [N, 2]; steps [N] (the token index, folded into
  the row's key); temperature/top_p [N] float; top_k [N] int (<= top_width when filtering).
  top_width None: no top-k/top-p filter in this batch. Returns tokens [N] and their log-probs under
  softmax(logits / temperature) ([N], 0 for greedy rows)."""
  greedy = temperature <= 0
  scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
  logp = jax.nn.log_softmax(scaled, axis=-1)
  row_keys = jax.vmap(jax.random.fold_in)(keys, steps)
  if top_width is None:
    drawn = jax.vmap(jax.random.categorical)(row_keys, scaled)
  else:
    values, index = jax.lax.top_k(scaled, top_width)
    keep = jnp.arange(top_width)[None, :] < top_k[:, None]
    probs = jax.nn.softmax(jnp.where(keep, values, -jnp.inf), axis=-1)
    keep &= (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]
    choice = jax.vmap(jax.random.categorical)(row_keys, jnp.where(keep, values, -jnp.inf))
    drawn = jnp.take_along_axis(index, choice[:, None], axis=-1)[:, 0]
  tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), drawn).astype(jnp.int32)
  chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
  return tokens, jnp.where(greedy, 0.0, chosen)


@functools.partial(jax.jit, static_argnums=(0, 9), donate_argnums=(2,))
def _admit(graphdef, state, cache, tokens, lengths, slots, keys, sampling, top_k, top_width):
  """Prefills right-padded prompts tokens [n, P] (true lengths [n]) into cache rows `slots` and
  samples each one's first token."""
  model = nnx.merge(graphdef, state)
  n, width = tokens.shape
  size = cache["layer_0"]["k"].shape[1]
  rows = model.init_cache(n, size, cache["layer_0"]["k"].dtype)
  positions = jnp.broadcast_to(jnp.arange(width), (n, width))
  mask = jnp.broadcast_to(jnp.arange(size)[None, :] <= jnp.arange(width)[:, None], (n, width, size))
  logits, rows = model(tokens, positions, rows, mask)
  last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
  new = {
      name: {"k": layer["k"].at[slots].set(rows[name]["k"]), "v": layer["v"].at[slots].set(rows[name]["v"]),
             "end_index": layer["end_index"].at[slots].set(lengths)}
      for name, layer in cache.items()
  }
  first, logp = _sample(last, keys, jnp.zeros_like(lengths), sampling[:, 0], sampling[:, 1], top_k, top_width)
  return first, logp, new


@functools.partial(jax.jit, static_argnums=(0, 9), donate_argnums=(2,))
def _decode(graphdef, state, cache, tokens, steps, keys, sampling, top_k, active, top_width):
  """One decode step for the first R slots (R = len(tokens); busy slots sit low): feeds tokens [R] at
  each slot's own position; idle slots (active False) keep their position."""
  model = nnx.merge(graphdef, state)
  rows = tokens.shape[0]
  head = jax.tree.map(lambda x: x[:rows], cache)
  end = head["layer_0"]["end_index"]
  size = head["layer_0"]["k"].shape[1]
  mask = jnp.arange(size)[None, None, :] <= end[:, None, None]
  logits, head = model(tokens[:, None], end[:, None], head, mask)
  for layer in head.values():
    layer["end_index"] = jnp.where(active, layer["end_index"], end)
  next_tokens, logp = _sample(logits[:, 0], keys, steps, sampling[:, 0], sampling[:, 1], top_k, top_width)
  return next_tokens, logp, jax.tree.map(lambda full, part: full.at[:rows].set(part), cache, head)


class ContinuousBatcher:
  """Slots of one KV cache shared by concurrent generate requests (see the module docstring)."""

  def __init__(self, model: nnx.Module, cache_size: int, max_batch_size: int, *,
               weights: Callable[[], nnx.State] | None = None, version: Callable[[], int] = lambda: 0,
               cache_dtype=None):
    """weights() returns the model's current nnx.State (default: nnx.state(model)), version() the
    number to tag tokens sampled with them; both are read between decode steps."""
    self._graphdef, self._state = nnx.split(model)
    # The cache lives where the weights do (replicated over their mesh).
    placement = jax.sharding.NamedSharding(jax.tree.leaves(self._state)[0].sharding.mesh, jax.sharding.PartitionSpec())
    self._weights = weights or (lambda: nnx.state(model))
    self._version_source = version
    self._vocab = model.config.vocab_size
    self.cache_size = cache_size
    self.max_batch_size = max_batch_size
    self._cache = jax.device_put(model.init_cache(max_batch_size, cache_size, cache_dtype or model.config.dtype),
                                 placement)
    self._slots: list[_Request | None] = [None] * max_batch_size
    self._waiting: collections.deque[_Request] = collections.deque()
    self._admitting: list[_Request] = []  # taken from _waiting, not yet in a slot
    self._wake = threading.Condition()
    self.version = version()
    self._closed = False
    self._thread: threading.Thread | None = None
    self.decode_steps = 0  # decode calls so far (each advances every busy slot by one token)

  # ------------------------------------------------------------------ callers' side
  def submit(self, prompt, params: SamplingParams, key: jax.Array | None = None) -> concurrent.futures.Future:
    """Queues one prompt (token ids); the Future resolves to a Completion. key: the request's PRNG
    key (not needed for greedy decoding)."""
    prompt = np.asarray(prompt, np.int32)
    if len(prompt) == 0:
      raise ValueError("cannot generate from an empty prompt")
    if len(prompt) + params.max_new_tokens > self.cache_size:
      raise ValueError(f"a prompt of {len(prompt)} tokens plus {params.max_new_tokens} tokens to generate exceeds "
                       f"the KV cache of {self.cache_size} tokens")
    if params.top_k is not None and params.top_k < 1:
      raise ValueError(f"top_k must be None or >= 1, got {params.top_k}")
    if key is None:
      key = np.zeros(2, np.uint32)
    elif jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
    key = np.asarray(key, np.uint32)
    request = _Request(prompt, params, key, concurrent.futures.Future())
    with self._wake:
      if self._closed:
        raise RuntimeError("the batcher is closed")
      if self._thread is None:
        self._thread = threading.Thread(target=self._run, name="continuous-batcher", daemon=True)
        self._thread.start()
      self._waiting.append(request)
      self._wake.notify()
    return request.future

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
          while not self._closed and not self._waiting and not any(self._slots):
            self._wake.wait()
          if self._closed:
            break
          admitted = self._take_waiting()
        self._state, self.version = self._weights(), self._version_source()
        if admitted:
          self._prefill(admitted)
          self._admitting = []
        if any(self._slots):
          self._step()
    except BaseException as e:  # pylint: disable=broad-except
      log.exception("continuous batcher failed")
      self._fail_all(e)
      return
    self._fail_all(RuntimeError("the batcher was closed"))

  def _take_waiting(self) -> list[tuple[int, _Request]]:
    free = [i for i, r in enumerate(self._slots) if r is None]
    taken = []
    while free and self._waiting:
      taken.append((free.pop(0), self._waiting.popleft()))
    self._admitting = [r for _, r in taken]
    return taken

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

  def _prefill(self, admitted: list[tuple[int, _Request]]) -> None:
    # One call per prompt-width bucket keeps padding waste and compiled shapes bounded.
    by_width: dict[int, list[tuple[int, _Request]]] = collections.defaultdict(list)
    for slot, r in admitted:
      by_width[_bucket(len(r.prompt), self.cache_size, minimum=16)].append((slot, r))
    for width, group in sorted(by_width.items()):
      n = _bucket(len(group), self.max_batch_size, base=4)
      group = group + [group[-1]] * (n - len(group))  # repeats rewrite the same slot with the same rows
      tokens = np.zeros((n, width), np.int32)
      for i, (_, r) in enumerate(group):
        tokens[i, :len(r.prompt)] = r.prompt
      lengths = np.array([len(r.prompt) for _, r in group], np.int32)
      slots = np.array([s for s, _ in group], np.int32)
      sampling, top_k, top_width = self._sampling_arrays([r for _, r in group])
      keys = np.stack([r.key for _, r in group])
      first, logp, self._cache = _admit(self._graphdef, self._state, self._cache, tokens, lengths, slots, keys,
                                        sampling, top_k, top_width)
      first, logp = np.asarray(first), np.asarray(logp)
      for i, (slot, r) in enumerate(group):
        if self._slots[slot] is r:
          continue  # a padding repeat
        self._slots[slot] = r
        self._record(slot, r, int(first[i]), float(logp[i]))

  def _step(self) -> None:
    busy = max(i for i, r in enumerate(self._slots) if r is not None) + 1
    requests = self._slots[:_bucket(busy, self.max_batch_size, base=4)]
    active = np.array([r is not None for r in requests])
    last = np.array([r.tokens[-1] if r is not None else 0 for r in requests], np.int32)
    steps = np.array([len(r.tokens) if r is not None else 0 for r in requests], np.int32)
    keys = np.stack([r.key if r is not None else np.zeros(2, np.uint32) for r in requests])
    sampling, top_k, top_width = self._sampling_arrays(requests)
    tokens, logp, self._cache = _decode(self._graphdef, self._state, self._cache, last, steps, keys, sampling, top_k,
                                        active, top_width)
    self.decode_steps += 1
    tokens, logp = np.asarray(tokens), np.asarray(logp)
    for slot, r in enumerate(requests):
      if r is not None:
        self._record(slot, r, int(tokens[slot]), float(logp[slot]))

  def _record(self, slot: int, r: _Request, token: int, logp: float) -> None:
    """Appends a sampled token; a request that hit EOS or its budget leaves its slot."""
    r.tokens.append(token)
    r.logprobs.append(logp)
    r.versions.append(self.version)
    stopped = token in r.params.eos_ids
    if stopped or len(r.tokens) >= r.params.max_new_tokens:
      self._slots[slot] = None
      r.future.set_result(Completion(np.array(r.tokens, np.int32), np.array(r.logprobs, np.float32),
                                     np.array(r.versions, np.int32), stopped))
