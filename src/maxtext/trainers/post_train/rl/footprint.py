"""The memory a run is expected to need, from its config and the process as it stands before loading
anything, logged at start so a user knows whether it fits; and the process's peak memory, logged at
the end beside the estimate.

Counted: the weights; a learned reward model's weights (reward_model.*); the KL reference's copy
(none without a KL penalty, rl.grpo_beta=0 and rl.kl_in_reward_coef=0; none with LoRA, whose
reference is the frozen base); where agentic GRPO's trainer recomputes the old policy's log-probs
(the vanilla engine, or rl.sampler_is=token), Tunix's per-step snapshot of the policy
(RLCluster.sync_weights keeps the weights of the samples' policy in host memory; the learners drop it
where they never read it); AdamW's two moments, the gradient and, with
train_micro_batch_size set, the gradient accumulator, each of the trained weights (all of them, or
the LoRA adapters); the sampler's KV cache at its most rows, and its copy of the weights
(decoder.DecodeCopy: with rollout_dtype=bfloat16 every weight in bfloat16, the output layer stored
apart from a tied embedding; else with scan_layers sampled unrolled (rollout_layers) the layers'
weights as they are; the standard learner samples and trains in turn, so there only what the copy
exceeds the training step's temporaries by); and the training step's largest
temporaries for one micro-batch: the output layer's, a vocabulary slice's float32 logits at a time
(models/token_logps.py: logits, probabilities and their gradient) and its weights' gradient, and the
activations the backward pass keeps (with remat_policy=full only each layer's input, plus one
layer's), of each group's prompt once and every completion (models/shared_prefix.py); the process
before loading (Python, JAX's runtime, the libraries: its resident memory when the estimate is made);
the workers of rl.agent=FILE:FN (rl.max_concurrency at once, each as much as one measured at start
with the agent's file loaded); and the compiled programs, which XLA:CPU unrolls layer by layer (a
per-layer size, docs/decisions.md, "Compiled-program memory in the estimate"; with scan_layers one
layer's, the programs holding one scanned layer, but for the sampler's prefill and decode where they
run unrolled layers (rollout_layers): two of the five programs' share of every layer). Not counted:
the optimizer update's own temporaries and the allocator's overheads, which the end-of-run line shows
against the estimate (the trainer's own peak: benchmarks/agent_memory.py measures an agent run's whole process tree).

A start whose estimate exceeds the memory it has is refused (`check_fits`): on CPU the whole estimate
against the host's memory (its physical memory, or a smaller cgroup limit); on accelerators that
report their memory, the parts they hold against all of theirs together (the most any layout has)
and the parts the host holds against the host's. The refusal names the biggest item and the keys
that shrink it; run.ignore_memory_estimate=true starts anyway.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource

import jax

from maxtext.configs.run_config import RunConfig
from maxtext.configs.sections import ModelSection
from maxtext.models import token_logps
from maxtext.models.decoder import ModelConfig
from maxtext.utils import errors, worker_pool

log = logging.getLogger(__name__)

GB = 1e9
# Compiled programs per decoder layer (training step, update, prefill, decode, log-probs).
_PROGRAM_BYTES_PER_LAYER = 17e6
_SAMPLER_PROGRAMS = 2 / 5  # prefill and decode, of those five: their share of _PROGRAM_BYTES_PER_LAYER
# Projections that can take LoRA adapters: name -> (inputs, outputs) in terms of the architecture.
_PROJECTIONS = {
  "attn.q_proj": lambda c: (c.emb_dim, c.num_query_heads * c.head_dim),
  "attn.k_proj": lambda c: (c.emb_dim, c.num_kv_heads * c.head_dim),
  "attn.v_proj": lambda c: (c.emb_dim, c.num_kv_heads * c.head_dim),
  "attn.o_proj": lambda c: (c.num_query_heads * c.head_dim, c.emb_dim),
  "mlp.gate_proj": lambda c: (c.emb_dim, c.mlp_dim),
  "mlp.up_proj": lambda c: (c.emb_dim, c.mlp_dim),
  "mlp.down_proj": lambda c: (c.mlp_dim, c.emb_dim),
}


def _reads_policy_snapshot(cfg: RunConfig) -> bool:
  """Whether the learner keeps Tunix's host snapshot of the policy: agentic GRPO where its trainer
  recomputes the old policy's log-probs (not the batched engine's sampler log-probs, or with
  rl.sampler_is=token), as integration/tunix/agentic.py's _trainer_recomputes decides."""
  return cfg.agentic.use_agentic_rollout and (
    cfg.sampling.rollout_engine != "batched" or cfg.algorithm.sampler_is == "token"
  )


def parameter_count(model: ModelSection) -> int:
  """Weights of the decoder (without LoRA adapters)."""
  e, layers = model.emb_dim, model.num_decoder_layers
  per_layer = sum(i * o for i, o in (f(model) for f in _PROJECTIONS.values()))
  head = 0 if model.logits_via_embedding else e * model.vocab_size
  return model.vocab_size * e + layers * per_layer + _norm_scale_count(model) + head


def _reward_model_bytes(cfg: RunConfig, weight_bytes: int) -> int:
  """The weights of reward_model.load_parameters_path's reward model (its own architecture, without an
  output layer); 0 without one."""
  from maxtext.models.load import reward_model_section

  path = cfg.reward_model.load_parameters_path
  if not path:
    return 0
  section = dataclasses.replace(reward_model_section(path, cfg.model), logits_via_embedding=True)
  return parameter_count(section) * weight_bytes


def _norm_scale_count(model: ModelSection) -> int:
  """The decoder's norm scales (its only vectors): two RMSNorms per layer (four for gemma3, and q/k
  norms with use_qk_norm) and the final one."""
  per_layer = (4 if model.decoder_family == "gemma3" else 2) * model.emb_dim + (
    2 * model.head_dim if model.use_qk_norm else 0
  )
  return model.num_decoder_layers * per_layer + model.emb_dim


def adapter_count(model: ModelSection) -> int:
  """LoRA adapter parameters (A and B of every weight lora_module_path names); 0 without LoRA."""
  mcfg = ModelConfig.from_config(model)
  return sum(
    model.lora_rank * sum(f(model))
    for layer in range(model.num_decoder_layers)
    for name, f in _PROJECTIONS.items()
    if mcfg.adapts(f"layers.{layer}.{name}")
  )


def _sampler_rows(cfg: RunConfig) -> int:
  """The most sequences the sampler decodes at once (training rollouts or evaluation)."""
  agentic, sampling = cfg.agentic, cfg.sampling
  demand = (
    agentic.max_concurrency if agentic.use_agentic_rollout else cfg.train.batch_size * cfg.algorithm.num_generations
  )
  if cfg.eval.num_test_batches:
    demand = max(demand, cfg.eval.eval_batch_size)
  return min(demand, sampling.rollout_max_batch_size) if sampling.rollout_engine == "batched" else demand


def _activation_values_per_token(model: ModelSection, length: int) -> int:
  """Values the backward pass keeps per token and layer without remat: norm inputs and outputs,
  q/k/v, attention scores and probabilities over the sequence, attention output, the MLP's gate, up
  and product (its activation is recomputed: models/decoder.py's _swiglu), and the residual stream."""
  hq_d, hkv_d = model.num_query_heads * model.head_dim, model.num_kv_heads * model.head_dim
  values = 6 * model.emb_dim + 2 * hq_d + 2 * hkv_d + 2 * model.num_query_heads * length + 3 * model.mlp_dim
  if model.decoder_family == "gemma3":  # the post-norms' inputs and outputs, and GeGLU's autodiff intermediates
    values += 4 * model.emb_dim + 2 * model.mlp_dim
  return values


def _unrolled_sampler(cfg: RunConfig) -> bool:
  """Whether the batched engine samples a scanned model from its layers unrolled."""
  from maxtext.inference.continuous_batching import unrolled_layers

  return (
    cfg.model.scan_layers and cfg.sampling.rollout_engine == "batched" and unrolled_layers(cfg.sampling.rollout_layers)
  )


def _sampler_copy_bytes(cfg: RunConfig, n: int, lora: int, weight_bytes: int) -> int:
  """What decoder.DecodeCopy adds for the batched engine's sampler of a model of n values and lora
  adapter values: with rollout_dtype=bfloat16 its matrices in bfloat16 (a tied embedding twice: as
  itself and as the output layer), the layers' norm scales as they are (float32; the final norm's is
  shared); else with scan_layers sampled unrolled the layers' weights and adapters as they are (the
  embedding, final norm and output layer shared); else nothing (the sampler reads the model's own
  weights)."""
  model, sampling = cfg.model, cfg.sampling
  if sampling.rollout_engine != "batched":
    return 0
  if sampling.rollout_dtype == "bfloat16":
    vectors = _norm_scale_count(model)
    head = model.vocab_size * model.emb_dim if model.logits_via_embedding else 0
    return 2 * (n + lora + head - vectors) + 4 * (vectors - model.emb_dim)
  if _unrolled_sampler(cfg):
    outside = model.vocab_size * model.emb_dim * (1 if model.logits_via_embedding else 2) + model.emb_dim
    return (n - outside) * weight_bytes + lora * 4
  return 0


@dataclasses.dataclass(frozen=True)
class Footprint:
  parts: dict[str, float]  # name -> bytes
  shrinks: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> the keys that shrink it
  on_host: frozenset[str] = frozenset()  # the parts held in host memory where accelerators run the model

  @property
  def total(self) -> float:
    return sum(self.parts.values())

  def table(self) -> str:
    rows = [f"  {name:<48} {size / GB:7.2f} GB" for name, size in self.parts.items()]
    return "\n".join([*rows, f"  {'total':<48} {self.total / GB:7.2f} GB"])


def estimate(cfg: RunConfig, process_bytes: float = 0.0, agent_worker_bytes: float = 0.0) -> Footprint:
  """The run's expected memory, part by part (the whole config: every section shapes some part);
  process_bytes: the process's resident memory before loading anything; agent_worker_bytes: the
  memory of one of rl.agent's worker processes, measured (UserAgent.worker_bytes; 0 without them),
  of which rl.max_concurrency run at once."""
  model, sampling, train = cfg.model, cfg.sampling, cfg.train
  weight_bytes = 2 if model.weight_dtype == "bfloat16" else 4
  act_bytes = 2 if model.dtype == "bfloat16" else 4
  n = parameter_count(model)
  lora = adapter_count(model)
  trained, trained_bytes = (lora, 4) if lora else (n, weight_bytes)  # adapters are float32
  prompts = train.train_micro_batch_size or train.batch_size
  sequences = prompts * cfg.algorithm.num_generations
  length = sampling.max_target_length
  tokens = prompts * sampling.max_prompt_length + sequences * sampling.max_response_length
  scored = sampling.max_response_length  # positions whose log-probs the loss reads
  width = token_logps.vocab_slice(sequences * scored, model.vocab_size)
  per_token = (
    model.num_decoder_layers * model.emb_dim + _activation_values_per_token(model, length)
    if model.remat_policy == "full"
    else model.num_decoder_layers * _activation_values_per_token(model, length)
  )
  kv = 2 * model.num_decoder_layers * model.num_kv_heads * model.head_dim * act_bytes
  rows = _sampler_rows(cfg)
  output_layer = 3 * sequences * scored * width * 4 + model.vocab_size * model.emb_dim * 4
  activations = tokens * per_token * act_bytes
  temporaries = output_layer + activations
  copy = _sampler_copy_bytes(cfg, n, lora, weight_bytes)
  layers = model.num_decoder_layers
  # Layers' worth of compiled programs: one scanned layer, plus the sampler's unrolled ones; else every layer.
  compiled_layers = 1 + _SAMPLER_PROGRAMS * layers if _unrolled_sampler(cfg) else 1 if model.scan_layers else layers
  # name -> (bytes, the keys that shrink it, whether the host holds it where accelerators run the model)
  items: dict[str, tuple[float, str, bool]] = {
    f"weights ({n / 1e6:.1f}M x {weight_bytes} B" + (f", adapters {lora / 1e6:.2f}M x 4 B)" if lora else ")"): (
      n * weight_bytes + lora * 4,
      "model_name (a smaller model), weight_dtype=bfloat16",
      False,
    ),
    "KL reference copy": (
      n * weight_bytes if cfg.algorithm.reference and not lora else 0,
      "rl.grpo_beta=0, rl.kl_in_reward_coef=0, lora_rank",
      False,
    ),
    "policy snapshot (Tunix, host; agentic)": (
      n * weight_bytes + lora * 4 if _reads_policy_snapshot(cfg) else 0,
      "rollout_engine=batched without rl.sampler_is",
      True,
    ),
    f"AdamW moments ({'adapters' if lora else 'all weights'})": (
      2 * trained * trained_bytes,
      "lora_rank, weight_dtype=bfloat16",
      False,
    ),
    "gradient": (trained * trained_bytes, "lora_rank, weight_dtype=bfloat16", False),
    "gradient accumulator": (
      trained * trained_bytes if train.train_micro_batch_size else 0,
      "train_micro_batch_size=0, lora_rank",
      False,
    ),
    "PPO's critic (weights, AdamW moments, gradient)": (
      (0 if lora else n * weight_bytes) + 4 * trained * trained_bytes if cfg.algorithm.algorithm == "ppo" else 0,
      "rl.algorithm=grpo, lora_rank (the critic shares the base), weight_dtype=bfloat16",
      False,
    ),
    "reward model (weights)": (
      _reward_model_bytes(cfg, weight_bytes),
      "reward_model.load_parameters_path (a smaller reward model), weight_dtype=bfloat16",
      False,
    ),
    f"sampler KV cache ({rows} rows x {sampling.kv_cache_size})": (
      rows * sampling.kv_cache_size * kv,
      "rollout_max_batch_size, rl.max_concurrency, batch_size, rl.num_generations, eval_batch_size, "
      "max_prompt_length, max_response_length",
      False,
    ),
    f"output layer, micro-batch of {sequences} x {scored}": (
      output_layer,
      "train_micro_batch_size, rl.num_generations, max_response_length",
      False,
    ),
    f"activations of {tokens} tokens (remat {model.remat_policy})": (
      activations,
      "train_micro_batch_size, remat_policy=full, rl.num_generations, max_prompt_length, max_response_length",
      False,
    ),
    "sampler's copy (rollout_dtype=bfloat16, or rollout_layers=unrolled)": (
      copy if cfg.agentic.use_agentic_rollout else max(0, copy - temporaries),
      "rollout_dtype=model, rollout_layers=stacked",
      False,
    ),
    "compiled programs": (
      _PROGRAM_BYTES_PER_LAYER * compiled_layers,
      "scan_layers=true",
      True,
    ),
    "the process before loading (runtime, libraries)": (process_bytes, "no key", True),
    "rl.agent's workers"
    + (
      f" ({cfg.agentic.max_concurrency} x {agent_worker_bytes / 1e6:.0f} MB, one measured)"
      if agent_worker_bytes
      else ""
    ): (
      cfg.agentic.max_concurrency * agent_worker_bytes,
      "rl.max_concurrency",
      True,
    ),
  }
  return Footprint(
    {name: size for name, (size, _, _) in items.items()},
    {name: keys for name, (_, keys, _) in items.items()},
    frozenset(name for name, (_, _, host) in items.items() if host),
  )


def checkpoint_bytes(cfg: RunConfig) -> int:
  """Bytes of one of the run's checkpoints: the trained parameters (all weights, or the LoRA
  adapters, which are float32) and AdamW's two moments of each, in the parameters' dtype; twice that
  with PPO's critic."""
  model = cfg.model
  lora = adapter_count(model)
  trained, trained_bytes = (lora, 4) if lora else (parameter_count(model), 2 if model.weight_dtype == "bfloat16" else 4)
  return 3 * trained * trained_bytes * (2 if cfg.algorithm.algorithm == "ppo" else 1)


def peak_rss_bytes() -> float:
  """The process's peak resident memory so far: Linux's VmHWM (getrusage's ru_maxrss would keep a
  parent's larger peak across exec), else ru_maxrss (bytes on macOS)."""
  if os.path.exists("/proc/self/status"):
    with open("/proc/self/status", encoding="ascii") as f:
      return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def rss_bytes() -> float:
  """The process's resident memory now (Linux's VmRSS; 0 where there is no /proc)."""
  return worker_pool.resident_bytes(os.getpid())


def log_estimate(cfg: RunConfig, agent_worker_bytes: float = 0.0) -> Footprint:
  footprint = estimate(cfg, rss_bytes(), agent_worker_bytes)
  log.info("Expected peak memory:\n%s", footprint.table())
  return footprint


def host_memory_bytes() -> float:
  """The host's memory: its physical memory, or the cgroup's limit where that is smaller (a container)."""
  limits = [float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))]
  for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
    try:
      with open(path, encoding="ascii") as f:
        text = f.read().strip()
    except OSError:
      continue
    if text.isdigit():
      limits.append(float(text))
  return min(limits)


def device_memory_bytes() -> float | None:
  """The memory of this process's accelerators together, where each reports it (JAX's bytes_limit);
  None on CPU, whose memory is the host's."""
  stats = [device.memory_stats() for device in jax.local_devices()]
  if not stats or any(not s or "bytes_limit" not in s for s in stats):
    return None
  return float(sum(s["bytes_limit"] for s in stats))


def check_fits(footprint: Footprint, go_on: bool, host: float, devices: float | None) -> None:
  """Refuses (an InputError naming the biggest item of the estimate and the keys that shrink it) a
  start whose estimate exceeds the memory it has: the whole estimate the host's `host` bytes, where
  `devices` is None (CPU); else the parts the accelerators hold their `devices` bytes together, or the
  parts the host holds its memory. With `go_on` (run.ignore_memory_estimate) it only warns."""
  if devices is None:
    held = {"the host's": (footprint.parts, host)}
  else:
    held = {
      "the accelerators'": ({k: v for k, v in footprint.parts.items() if k not in footprint.on_host}, devices),
      "the host's": ({k: v for k, v in footprint.parts.items() if k in footprint.on_host}, host),
    }
  for whose, (parts, memory) in held.items():
    need = sum(parts.values())
    if need <= memory:
      continue
    biggest = max(parts, key=parts.__getitem__)
    message = (
      f"expected peak memory {need / GB:.1f} GB exceeds {whose} {memory / GB:.1f} GB; the biggest item is "
      f"{biggest} at {parts[biggest] / GB:.1f} GB (shrunk by: {footprint.shrinks[biggest]})"
    )
    if go_on:
      log.warning("%s; starting anyway (ignore_memory_estimate=true)", message)
      continue
    raise errors.InputError(f"{message}; or set ignore_memory_estimate=true to start anyway")


def log_peak(footprint: Footprint) -> None:
  log.info("Peak memory (RSS) %.2f GB; estimated at start %.2f GB", peak_rss_bytes() / GB, footprint.total / GB)
