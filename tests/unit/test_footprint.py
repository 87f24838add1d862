"""The memory estimate logged at start: its parts against the real objects (the decoder's parameters
and adapters, optax's AdamW state, the decoder's KV cache) and its training-step temporaries against
XLA's own figure for a compiled forward and backward pass; and the refusal of a start it says would
not fit."""

import logging
import subprocess
import sys

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from maxtext.configs import pyconfig
from maxtext.integration.tunix import scoring
from maxtext.models import builder
from maxtext.models.decoder import DecodeCopy, ModelConfig
from maxtext.models.shared_prefix import SharedPrefix
from maxtext.trainers.post_train.rl import footprint
from maxtext.utils import errors
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config


def _nbytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree))


@pytest.mark.parametrize(
  "args",
  [
    ("model_name=qwen3-tiny",),
    ("model_name=llama-tiny",),
    ("model_name=qwen3-tiny", "lora_rank=4"),
    # some layers' adapters: unrolled layers only (the others scanned, the default)
    (
      "model_name=llama-tiny",
      "scan_layers=false",
      "lora_rank=3",
      r"lora_module_path=layers\.1\.(attn\.o_proj|mlp\.up_proj)",
    ),
  ],
)
def test_parameters_adapters_and_optimizer_state_match_the_real_ones(args):
  cfg = make_config(*args)
  mesh = create_meshes(cfg.mesh, agentic=False)[0]
  base_cfg = make_config(*(a for a in args if a.startswith(("model_name=", "scan_layers="))))
  base = builder.init_random(ModelConfig.from_config(base_cfg.model), mesh, 0)
  model = builder.with_lora(base, ModelConfig.from_config(cfg.model), 0) if cfg.model.lora_rank else base
  weights = nnx.state(model, nnx.Not(nnx.LoRAParam))
  adapters = nnx.state(model, nnx.LoRAParam)
  assert footprint.parameter_count(cfg.model) == sum(x.size for x in jax.tree.leaves(weights))
  assert footprint.adapter_count(cfg.model) == sum(x.size for x in jax.tree.leaves(adapters))
  parts = footprint.estimate(cfg).parts
  trained = adapters if cfg.model.lora_rank else weights
  moments = [v for k, v in parts.items() if k.startswith("AdamW moments")][0]
  assert moments == _nbytes(optax.adamw(1e-3).init(trained)) - 4  # less AdamW's step count
  assert parts["gradient"] == _nbytes(trained)
  assert [v for k, v in parts.items() if k.startswith("weights")][0] == _nbytes(weights) + _nbytes(adapters)


def test_kl_reference_copy_only_for_full_fine_tuning_with_kl():
  copy = lambda *a: footprint.estimate(make_config("model_name=qwen3-tiny", *a)).parts["KL reference copy"]
  assert copy("rl.grpo_beta=0") == 0
  assert copy("rl.grpo_beta=0.04") == footprint.parameter_count(make_config("model_name=qwen3-tiny").model) * 4
  assert copy("rl.grpo_beta=0.04", "lora_rank=8") == 0  # the frozen base is the reference


def test_policy_snapshot_only_where_the_agentic_trainer_recomputes_log_probs():
  snapshot = lambda *a: footprint.estimate(make_config("model_name=qwen3-tiny", *a)).parts[
    "policy snapshot (Tunix, host; agentic)"
  ]
  weights = footprint.parameter_count(make_config("model_name=qwen3-tiny").model) * 4
  assert snapshot("rl.use_agentic_rollout=false") == 0
  assert snapshot("rl.use_agentic_rollout=true", "rollout_engine=batched") == 0  # the sampler's log-probs
  assert snapshot("rl.use_agentic_rollout=true", "rollout_engine=vanilla") == weights
  assert snapshot("rl.use_agentic_rollout=true", "rollout_engine=batched", "rl.sampler_is=token") == weights


@pytest.mark.parametrize(
  "args",
  [
    ("model_name=qwen3-tiny", "rollout_dtype=bfloat16"),
    ("model_name=llama-tiny", "lora_rank=4", "rollout_dtype=bfloat16"),
    ("model_name=qwen3-tiny", "rollout_layers=unrolled"),  # float32 rollouts from scanned layers, unrolled
    ("model_name=llama-tiny", "lora_rank=4", "rollout_layers=unrolled"),
  ],
)
def test_the_samplers_copy_is_what_the_decode_copy_adds(args):
  cfg = make_config(*args)
  mesh = create_meshes(cfg.mesh, agentic=False)[0]
  base = builder.init_random(ModelConfig.from_config(make_config(args[0]).model), mesh, 0)
  model = builder.with_lora(base, ModelConfig.from_config(cfg.model), 0) if cfg.model.lora_rank else base
  assert model.config.scan_layers == cfg.model.scan_layers
  part = "sampler's copy (rollout_dtype=bfloat16, or rollout_layers=unrolled)"
  dtype = jnp.bfloat16 if cfg.sampling.rollout_dtype == "bfloat16" else None
  copy = DecodeCopy(model, dtype).added_bytes
  assert footprint.estimate(make_config(*args, "rl.use_agentic_rollout=true")).parts[part] == copy > 0
  # The standard learner samples, then trains: the copy and the training temporaries never coexist.
  parts = footprint.estimate(make_config(*args, "rl.use_agentic_rollout=false")).parts
  temporaries = sum(v for k, v in parts.items() if k.startswith(("output layer", "activations")))
  assert parts[part] == max(0, copy - temporaries)
  for own in ("scan_layers=false", "rollout_layers=stacked", "rollout_layers=auto"):  # auto: stacked on a CPU
    cfg = make_config(*args[:-1], own, "rl.use_agentic_rollout=true")
    assert footprint.estimate(cfg).parts[part] == 0  # the sampler reads the model's own weights


@pytest.mark.parametrize("scan", ["false", "true"])
def test_kv_cache_is_the_decoders_cache_at_the_samplers_most_rows(scan):
  cfg = make_config(
    "model_name=qwen3-tiny",
    "batch_size=4",
    "rl.num_generations=4",
    "rollout_max_batch_size=8",
    "num_test_batches=0",
    f"scan_layers={scan}",
  )
  model = builder.init_random(ModelConfig.from_config(cfg.model), create_meshes(cfg.mesh, agentic=False)[0], 0)
  cache = model.init_cache(8, cfg.sampling.kv_cache_size, jnp.float32)  # min(4 x 4 prompts' samples, 8 slots)
  expected = sum(layer["k"].nbytes + layer["v"].nbytes for layer in cache.values())
  parts = footprint.estimate(cfg).parts
  assert parts[f"sampler KV cache (8 rows x {cfg.sampling.kv_cache_size})"] == expected
  assert footprint.parameter_count(cfg.model) == sum(x.size for x in jax.tree.leaves(nnx.state(model)))


def test_scanned_layers_count_one_layers_compiled_programs_and_the_samplers_unrolled_ones():
  programs = lambda *a: footprint.estimate(make_config("model_name=qwen3-tiny", *a)).parts["compiled programs"]
  per_layer = programs("scan_layers=false") / 2  # qwen3-tiny's 2 layers, every program unrolled
  assert programs("scan_layers=true", "rollout_layers=stacked") == per_layer
  unrolled = programs("scan_layers=true", "rollout_layers=unrolled")
  assert unrolled == pytest.approx(per_layer * (1 + 2 * 2 / 5))  # prefill and decode: 2 of 5 programs


@pytest.mark.parametrize("remat", ["none", "full"])
def test_training_temporaries_are_within_a_factor_of_two_of_xlas(remat):
  """output layer + activations + gradient against the temporaries XLA allocates for the gradient of the
  sampled tokens' mean log-probability over one micro-batch (what the GRPO loss differentiates):
  scored with each group's prompt once, as both learners do."""
  cfg = make_config(
    "model_name=llama-tiny",
    "vocab_size=4096",
    "emb_dim=256",
    "mlp_dim=1024",
    "num_decoder_layers=4",
    "num_query_heads=8",
    "num_kv_heads=2",
    "head_dim=32",
    "batch_size=2",
    "rl.num_generations=4",
    "train_micro_batch_size=1",
    "max_prompt_length=96",
    "max_response_length=32",
    f"remat_policy={remat}",
  )
  model = SharedPrefix(
    builder.init_random(ModelConfig.from_config(cfg.model), create_meshes(cfg.mesh, agentic=False)[0], 0),
    cfg.sampling.max_prompt_length,
    cfg.algorithm.num_generations,
  )
  graphdef, params = nnx.split(model)
  sequences, length = cfg.algorithm.num_generations, cfg.sampling.max_target_length
  tokens = jnp.zeros((sequences, length), jnp.int32)

  prompt = cfg.sampling.max_prompt_length

  def loss(p):  # pad id -1: every token is real
    logps, _ = scoring.completion_logps(nnx.merge(graphdef, p), tokens[:, :prompt], tokens[:, prompt:], -1, 1, 1.0)
    return logps.mean()

  compiled = jax.jit(jax.grad(loss)).lower(params).compile()
  xla = compiled.memory_analysis().temp_size_in_bytes + compiled.memory_analysis().output_size_in_bytes
  parts = footprint.estimate(cfg).parts
  ours = sum(v for k, v in parts.items() if k.startswith(("output layer", "activations", "gradient")))
  ours -= parts["gradient accumulator"]
  print(f"estimate {ours / 1e6:.1f} MB, XLA {xla / 1e6:.1f} MB")
  assert xla / 2 <= ours <= 2 * xla


def test_peak_memory_is_the_processes_own_not_its_parents():
  parent = bytearray(2 * 10**9)  # getrusage's ru_maxrss would hand this parent's peak to the child across exec
  code = (
    "import sys; from maxtext.trainers.post_train.rl import footprint; before = footprint.peak_rss_bytes(); "
    "x = bytearray(500 * 10**6); print(before, footprint.peak_rss_bytes())"
  )
  before, after = map(
    float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
  )
  assert before < 1.5e9 and 0.45e9 < after - before < 0.6e9
  del parent


def test_the_process_part_is_its_resident_memory_when_the_estimate_is_made():
  code = (
    "from maxtext.trainers.post_train.rl import footprint; from tests.conftest import make_config; "
    # The first estimate imports modules it reads (models.load, Orbax): resident memory of their own.
    "cfg = make_config(); footprint.log_estimate(cfg); before = footprint.log_estimate(cfg).total; "
    "x = bytearray(400 * 10**6); x[::4096] = bytes(len(x[::4096])); "
    "print(before, footprint.log_estimate(cfg).total)"
  )
  before, after = map(
    float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
  )
  assert 0.38e9 < after - before < 0.45e9  # the touched 400 MB, and nothing else of the estimate moved


def test_a_checkpoint_is_parameters_and_two_optimizer_moments():
  """qwen3-tiny's checkpoint took 118,004,016 bytes on disk (arrays and Orbax's metadata)."""
  assert footprint.checkpoint_bytes(make_config("model_name=qwen3-tiny")) == 117_871_872
  lora = make_config("model_name=qwen3-tiny", "lora_rank=4")
  assert footprint.checkpoint_bytes(lora) == 3 * 4 * footprint.adapter_count(lora.model)


# A start no host holds: qwen3-tiny with 4096 prompts x 64 samples of 512 tokens a step (9 TB).
HUGE = ("model_name=qwen3-tiny", "batch_size=4096", "rl.num_generations=64", "max_response_length=512")
GB = 1e9


def test_a_start_beyond_the_hosts_memory_is_refused_naming_the_biggest_item():
  estimate = footprint.estimate(make_config(*HUGE))
  with pytest.raises(errors.InputError) as raised:
    footprint.check_fits(estimate, False, host=24 * GB, devices=None)
  [activations] = [name for name in estimate.parts if name.startswith("activations")]
  assert max(estimate.parts.values()) == estimate.parts[activations]
  assert str(raised.value) == (
    f"expected peak memory {estimate.total / GB:.1f} GB exceeds the host's 24.0 GB; the biggest item is "
    f"{activations} at {estimate.parts[activations] / GB:.1f} GB (shrunk by: train_micro_batch_size, "
    "remat_policy=full, rl.num_generations, max_prompt_length, max_response_length); or set "
    "ignore_memory_estimate=true to start anyway"
  )


def test_ignore_memory_estimate_starts_anyway_with_a_warning(caplog):
  cfg = make_config(*HUGE, "ignore_memory_estimate=true")
  assert cfg.run.ignore_memory_estimate
  with caplog.at_level(logging.WARNING, logger=footprint.__name__):
    footprint.check_fits(footprint.estimate(cfg), cfg.run.ignore_memory_estimate, host=24 * GB, devices=None)
  assert "exceeds the host's 24.0 GB" in caplog.text and "starting anyway (ignore_memory_estimate=true)" in caplog.text


def test_on_accelerators_their_parts_are_held_against_their_memory_and_the_hosts_against_the_host():
  """qwen3-0.6b's training state (weights, reference, moments and gradient: 12 GB in float32) on an
  8 GB accelerator does not fit, on an 80 GB one it does; the 2 GB process does not fit a 1 GB host."""
  estimate = footprint.estimate(make_config("model_name=qwen3-0.6b", "random_weights=true"), process_bytes=2 * GB)
  with pytest.raises(errors.InputError, match=r"exceeds the accelerators' 8.0 GB; the biggest item is activations"):
    footprint.check_fits(estimate, False, host=64 * GB, devices=8 * GB)
  footprint.check_fits(estimate, False, host=64 * GB, devices=80 * GB)
  with pytest.raises(errors.InputError, match=r"exceeds the host's 1.0 GB; the biggest item is the process before"):
    footprint.check_fits(estimate, False, host=1 * GB, devices=80 * GB)


@pytest.mark.parametrize("yaml", ["rl_times_table.yml", "rl.yml"])
def test_the_default_demo_and_the_recipe_fit_a_24_gb_laptop(yaml):
  """`make run` (rl_times_table.yml, SmolLM2-135M) and rl.yml, with the process as big as it is here."""
  footprint.check_fits(
    footprint.estimate(pyconfig.initialize(["x", yaml]), footprint.rss_bytes()), False, 24 * GB, None
  )


def test_the_hosts_memory_is_its_own_or_its_containers():
  import os

  physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  assert 0 < footprint.host_memory_bytes() <= physical
  assert footprint.device_memory_bytes() is None  # the suite runs on CPU, whose memory is the host's


def test_rl_agent_s_workers_count_rl_max_concurrency_times_one_measured_worker():
  """An rl.agent=FILE:FN run holds up to rl.max_concurrency worker processes, each the agent's file
  loaded: one is started and measured (the calculator agent: the openai client, tens of MB; a worker
  that imported the trainer's modules would be hundreds) and counted that many times; none with http."""
  from maxtext.integration.tunix import user_agent

  cfg = make_config(
    "rl.use_agentic_rollout=true", "rl.agent=src/maxtext/agents/calculator.py:run", "rl.max_concurrency=8"
  )
  agent = user_agent.load(cfg.agent)
  one = agent.worker_bytes()
  assert 10e6 < one < 150e6
  parts = footprint.estimate(cfg, 0.0, one).parts
  (workers,) = [v for k, v in parts.items() if k.startswith("rl.agent's workers (8 x")]
  assert workers == 8 * one
  http = make_config("rl.use_agentic_rollout=true", "rl.agent=http")
  assert user_agent.load(http.agent).worker_bytes() == 0.0
