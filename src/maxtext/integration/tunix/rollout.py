"""The rollout engines Tunix samples with (ClusterConfig.rollout_engine): RolloutEngine on Tunix's
vanilla KV-cache sampler (rollout_engine: vanilla) and BatchedRolloutEngine on our continuous batcher
(rollout_engine: batched).

Both guarantee:
1. Fresh randomness: a call without a seed in its rollout config draws its key from StepKeys
   (inference/step_keys.py), so a resumed run draws what an uninterrupted one would.
2. EOS kept: a completion that stopped before the generation budget ends with its EOS token.
3. A sampled pad token ends the completion and is kept (masked like the padding it stands for).
4. `get_per_token_logps` scores tokens under softmax(logits / temperature), the distribution that
   sampled them and the one the trainer's loss uses.
5. Prompts are text or token ids (used as they are).
6. A prompt plus the generation budget must fit the KV cache (max_prompt_length +
   max_response_length), else an InputError says by how much; a prompt longer than
   max_prompt_length that fits is sampled (RolloutEngine pads it to the room the cache leaves).
7. Weights from a trainer on another (multi-device) mesh are accepted: they may pass through host
   memory, and a trainer spanning several processes gives each process's sampler whole copies
   (mesh.placed).

BatchedRolloutEngine serves the agentic learner, which calls the engine once per conversation
turn with a single prompt from up to rl.max_concurrency threads: the calls are merged into one decode
batch. It returns per-token log-probs and the weights version of every token (VersionedOutput), and
reuses KV prefixes the batcher holds (a conversation's earlier turns, a shared system prompt, a GRPO
group's prompt).

What a call gets and gives travels in its arguments and return value, never in per-thread state: its
key is its rollout config's seed (else StepKeys.next()), and its tokens' versions are a field of its
output. (Tunix's RLCluster.generate takes no seed and rebuilds the output from the fields it knows,
so the agentic learner, which names each turn's key and reads the versions, calls the engine itself.)

Why each guarantee (the google-tunix 0.1.7 defects they fix): docs/decisions.md, "Rollout engine".
The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from tunix.generate import sampler, tokenizer_adapter
from tunix.rl.rollout import base_rollout

from maxtext.inference.continuous_batching import ContinuousBatcher, SamplingParams
from maxtext.inference.step_keys import StepKeys
from maxtext.input_pipeline.text_as_data import Rendered
from maxtext.integration.tunix import scoring
from maxtext.utils import errors
from maxtext.utils import mesh as mesh_lib

log = logging.getLogger(__name__)

if TYPE_CHECKING:
  from maxtext.models.decoder import Decoder


def _place_on_mesh(model: Decoder, mesh: Mesh) -> Decoder:
  """The model itself when already on mesh, else a copy resharded onto it."""
  graphdef, state = nnx.split(model)
  if jax.tree.leaves(state)[0].sharding.mesh == mesh:
    return model
  return nnx.merge(graphdef, mesh_lib.placed(state, nnx.get_named_sharding(state, mesh)))


def _placed_like(model: nnx.Module, params, filter_types) -> nnx.State:
  """params (the trainer's weights) placed as `model`'s own (filtered by filter_types) are."""
  current = nnx.state(model, filter_types) if filter_types is not None else nnx.state(model)
  return mesh_lib.placed(params, jax.tree.map(lambda x: x.sharding, current))


def tokenized(tokenizer: tokenizer_adapter.TokenizerAdapter, prompt: Prompt) -> np.ndarray:
  """A prompt's ids as Tunix's sampler makes them, the tokenizer's BOS first and once: token ids as
  they are; a text_as_data.Rendered prompt's own ids (its data encoded as text); another text as the
  tokenizer encodes it."""
  if not isinstance(prompt, str):
    return np.asarray(prompt, np.int32)
  ids = list(prompt.ids) if isinstance(prompt, Rendered) else tokenizer.encode(prompt)
  bos = [tokenizer.bos_id()] if tokenizer.bos_id() else []
  return np.asarray(tokenizer.dedup_bos_ids(bos + ids), np.int32)


def _check_fits(prompt_tokens: int, budget: int, cache_size: int) -> None:
  """A prompt plus the tokens to generate must fit the KV cache, else an error that names both."""
  if prompt_tokens + budget > cache_size:
    raise errors.InputError(
      f"a prompt of {prompt_tokens} tokens plus {budget} tokens to generate exceeds the KV cache of "
      f"{cache_size} tokens (max_prompt_length + max_response_length); raise max_prompt_length or "
      "max_response_length"
    )


Prompt = str | np.ndarray  # text, or token ids used as they are


def per_token_logps(
  model: nnx.Module,
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  pad_id: int,
  eos_id: int,
  temperature: float | None,
) -> jax.Array:
  """Log-probs of completion_tokens under softmax(logits / temperature) (plain softmax for greedy
  sampling), as the policy loss computes them, without gradient."""
  graphdef, state = nnx.split(model)
  return _logps(graphdef, state, prompt_tokens, completion_tokens, pad_id, eos_id, float(temperature or 1.0))


@functools.partial(jax.jit, static_argnames=("graphdef", "pad_id", "eos_id", "temperature"))
def _logps(graphdef, state, prompt_tokens, completion_tokens, pad_id, eos_id, temperature):
  model = nnx.merge(graphdef, state)
  logps, _ = scoring.completion_logps(model, prompt_tokens, completion_tokens, pad_id, eos_id, temperature)
  return jax.lax.stop_gradient(logps)


@dataclasses.dataclass
class VersionedOutput(base_rollout.RolloutOutput):
  """Tunix's RolloutOutput plus, per prompt, the weights version (the training step whose weights)
  that sampled each completion token. BatchedRolloutEngine.generate returns it; RLCluster.generate
  rebuilds a plain RolloutOutput and drops the versions."""

  versions: list[np.ndarray] | None = None


def versions_of(out: base_rollout.RolloutOutput) -> list[np.ndarray] | None:
  """The per-token weights versions of a generate call's output; None where the engine does not
  record them (the vanilla engine)."""
  return out.versions if isinstance(out, VersionedOutput) else None


@runtime_checkable
class Engine(Protocol):
  """What our learners and metrics read of a rollout engine beside Tunix's BaseRollout; None where
  the engine does not have it (the vanilla engine: no per-token versions, no prefix reuse, no decode
  meter). Per-token versions come back in generate's output (versions_of)."""

  keys: StepKeys | None  # the draws of the engine's calls without a seed (guarantee 1); for_request names one

  @property
  def version(self) -> int | None:
    """Weights version (the training step whose weights) of the next sampled token."""

  def prefix_reuse(self) -> float | None:
    """The share of prompt tokens so far read from a reused KV prefix instead of prefilled."""

  def decode_rate(self) -> tuple[float, float] | None:
    """(tokens/s, bytes read/s) of the decode steps so far that did not compile."""


class WithoutExtras:
  """Engine's members for an engine that has none of them but its keys."""

  keys: StepKeys | None = None
  version = None

  def prefix_reuse(self) -> float | None:
    return None

  def decode_rate(self) -> tuple[float, float] | None:
    return None


class _TokenPromptSampler(sampler.Sampler):
  """Tunix's sampler that also takes prompts as token ids."""

  def tokenize(self, input_string: Prompt) -> np.ndarray:
    return tokenized(self.tokenizer, input_string)


class RolloutEngine(WithoutExtras, base_rollout.BaseRollout):
  """Tunix's KV-cache sampler (what Tunix's VanillaRollout runs) with fresh seeds, token prompts and
  completions that keep EOS.

  Passed to Tunix as `ClusterConfig.rollout_engine` (a BaseRollout subclass, via functools.partial
  to bind `seed`).
  """

  keys: StepKeys

  def __init__(
    self, rollout_actor: Decoder, tokenizer, mesh: Mesh, rollout_config: base_rollout.RolloutConfig, seed: int
  ):
    model = _place_on_mesh(rollout_actor, mesh)
    self.temperature = rollout_config.temperature
    self.sampler = _TokenPromptSampler(
      model,
      tokenizer,
      sampler.CacheConfig(
        cache_size=rollout_config.kv_cache_size,
        num_layers=model.config.num_layers,
        num_kv_heads=model.config.num_kv_heads,
        head_dim=model.config.head_dim,
      ),
    )
    self.mesh = mesh
    self.keys = StepKeys(seed)

  def model(self) -> nnx.Module:
    return self.sampler.transformer

  def pad_id(self) -> int:
    return self.sampler.tokenizer.pad_id()

  def eos_id(self) -> int:
    return self.sampler.tokenizer.eos_id()

  def update_params(self, params, filter_types=None) -> None:
    """The sampler's weights become `params` (those of filter_types, else all), placed and typed as
    the sampler's own."""
    model = self.model()
    with jax.transfer_guard("allow"):
      placed = _placed_like(model, params, filter_types)
      current = nnx.state(model, filter_types) if filter_types is not None else nnx.state(model)
      nnx.update(model, jax.tree.map(lambda new, old: new.astype(old.dtype), placed, current))
    self.sampler.transformer_state = nnx.variables(model, nnx.Param)

  def get_per_token_logps(self, prompt_tokens: jax.Array, completion_tokens: jax.Array) -> jax.Array:
    return per_token_logps(
      self.model(), prompt_tokens, completion_tokens, self.pad_id(), self.eos_id(), self.temperature
    )

  def generate(self, prompts: list[Prompt], rollout_config: base_rollout.RolloutConfig, **kwargs):
    # Tunix builds the sampling state on the default device; put it where the sampler's weights are.
    with self.mesh, jax.default_device(self.mesh.devices.flat[0]):
      if rollout_config.seed is None and rollout_config.temperature:  # greedy decoding draws nothing
        rollout_config = dataclasses.replace(rollout_config, seed=self.keys.next())
      rollout_config = self._fitted(prompts, rollout_config)
      sampled = self.sampler(
        input_strings=prompts,
        max_generation_steps=rollout_config.max_tokens_to_generate,
        max_prompt_length=rollout_config.max_prompt_length,
        echo=False,
        temperature=rollout_config.temperature,
        top_p=rollout_config.top_p,
        top_k=rollout_config.top_k,
        seed=rollout_config.seed,
        pad_output=False,
        eos_tokens=rollout_config.eos_tokens,
        return_logprobs=rollout_config.return_logprobs,
      )
    out = base_rollout.RolloutOutput(
      text=sampled.text,
      logits=sampled.logits,
      tokens=sampled.tokens,
      left_padded_prompt_tokens=sampled.padded_prompt_tokens,
      logprobs=sampled.logprobs,
    )
    eos = rollout_config.eos_tokens[0] if rollout_config.eos_tokens else self.eos_id()
    budget = rollout_config.max_tokens_to_generate
    out.tokens = [np.append(t, np.asarray(eos, t.dtype)) if len(t) < budget else t for t in out.tokens]
    for i, t in enumerate(out.tokens):
      pads = np.flatnonzero(t == self.pad_id())
      if len(pads):  # the sampler went on after a pad token; the completion ends there
        out.tokens[i] = t[: pads[0] + 1]
        out.text[i] = self.sampler.tokenizer.decode(t[: pads[0]].tolist())
    if out.logprobs is not None:
      raise NotImplementedError("RolloutEngine does not return sampler log-probs")
    return out

  def _fitted(self, prompts: list[Prompt], config: base_rollout.RolloutConfig) -> base_rollout.RolloutConfig:
    """config with max_prompt_length raised to what the KV cache leaves when a prompt is longer."""
    longest = max(len(self.sampler.tokenize(p)) for p in prompts)
    if longest <= config.max_prompt_length:
      return config
    _check_fits(longest, config.max_tokens_to_generate, config.kv_cache_size)
    return dataclasses.replace(config, max_prompt_length=config.kv_cache_size - config.max_tokens_to_generate)


class BatchedRolloutEngine(base_rollout.BaseRollout):
  """Tunix rollout engine on a ContinuousBatcher with rollout_max_batch_size slots (see the module
  docstring), sampling from a DecodeCopy of the policy in matmul_dtype when set (rollout_dtype), and
  from its layers unrolled when unrolled_layers (rollout_layers). Passed as ClusterConfig.rollout_engine
  via functools.partial binding seed, max_batch_size, matmul_dtype, steps_per_dispatch and
  unrolled_layers."""

  def __init__(
    self,
    rollout_actor: Decoder,
    tokenizer,
    mesh: Mesh,
    rollout_config: base_rollout.RolloutConfig,
    seed: int,
    max_batch_size: int,
    matmul_dtype: str | None = None,
    steps_per_dispatch: int = 1,
    unrolled_layers: bool = True,
  ):
    self._model = _place_on_mesh(rollout_actor, mesh)
    if self._model.config.scan_layers:
      how = "from an unrolled copy" if unrolled_layers else "from the stacked arrays"
      log.info("The sampler decodes the scanned layers %s (rollout_layers)", how)
    self._tokenizer = tokenizer_adapter.TokenizerAdapter(tokenizer)
    self.temperature = rollout_config.temperature
    self.mesh = mesh
    self.keys = StepKeys(seed)
    self.batcher = ContinuousBatcher(
      self._model,
      rollout_config.kv_cache_size,
      max_batch_size,
      version=lambda: self.keys.step_source(),
      matmul_dtype=matmul_dtype,
      steps_per_dispatch=steps_per_dispatch,
      unrolled_layers=unrolled_layers,
    )

  @property
  def version(self) -> int:
    return self.keys.step_source()

  def prefix_reuse(self) -> float | None:
    """None before the first prompt."""
    prompt = self.batcher.prompt_tokens
    return self.batcher.reused_tokens / prompt if prompt else None

  def decode_rate(self) -> tuple[float, float] | None:
    return self.batcher.decode_rate()

  def _tokenize(self, prompt: Prompt) -> np.ndarray:
    return tokenized(self._tokenizer, prompt)

  def generate(
    self, prompts: list[Prompt] | str, rollout_config: base_rollout.RolloutConfig, **kwargs
  ) -> VersionedOutput:
    """One completion per prompt, drawn with rollout_config.seed (a key, or an int made one; prompt i
    draws with fold_in(key, i)), else with keys.next() unless greedy; with each token's weights
    version in the output's `versions`."""
    if isinstance(prompts, str):  # the agentic learner passes its one rendered conversation as a str
      prompts = [prompts]
    ids = [self._tokenize(p) for p in prompts]
    budget = rollout_config.max_tokens_to_generate
    longest = max(len(i) for i in ids)
    _check_fits(longest, budget, self.batcher.cache_size)
    key = rollout_config.seed
    if key is None and rollout_config.temperature:
      key = self.keys.next()
    elif isinstance(key, int):
      key = jax.random.PRNGKey(key)
    params = SamplingParams(
      max_new_tokens=budget,
      temperature=float(rollout_config.temperature or 0.0),
      top_p=1.0 if rollout_config.top_p is None else float(rollout_config.top_p),
      top_k=rollout_config.top_k,
      eos_ids=tuple(dict.fromkeys([*(rollout_config.eos_tokens or [self.eos_id()]), self.pad_id()])),
    )
    futures = self.batcher.submit_many(
      ids, params, [None if key is None else jax.random.fold_in(key, i) for i in range(len(ids))]
    )
    done = [f.result() for f in futures]
    width = max(rollout_config.max_prompt_length, longest)
    padded = np.full((len(ids), width), self.pad_id(), np.int32)
    for row, p in zip(padded, ids):
      row[width - len(p) :] = p
    return VersionedOutput(
      text=[self._tokenizer.decode((c.tokens[:-1] if c.stopped else c.tokens).tolist()) for c in done],
      logits=None,
      tokens=[c.tokens for c in done],
      left_padded_prompt_tokens=padded,
      logprobs=[c.logprobs for c in done] if rollout_config.return_logprobs else None,
      versions=[c.versions for c in done],
    )

  def get_per_token_logps(self, prompt_tokens: jax.Array, completion_tokens: jax.Array) -> jax.Array:
    return per_token_logps(
      self._model, prompt_tokens, completion_tokens, self.pad_id(), self.eos_id(), self.temperature
    )

  def update_params(self, params, filter_types=None) -> None:
    """New weights from the next decode chunk on: the batcher is paused between chunks while they are
    replaced, and requests in flight go on with them (none is dropped). On a shared trainer/sampler
    mesh Tunix updates the model itself, which the batcher reads between chunks."""
    with jax.transfer_guard("allow"):
      placed = _placed_like(self._model, params, filter_types)  # copied while decoding goes on
      with self.batcher.paused():
        nnx.update(self._model, placed)
        self.batcher.weights_changed()

  def pad_id(self) -> int:
    return self._tokenizer.pad_id()

  def eos_id(self) -> int:
    return self._tokenizer.eos_id()

  def model(self) -> nnx.Module:
    return self._model
