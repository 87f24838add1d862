"""The memory estimate logged at start: its parts against the real objects (the decoder's parameters
and adapters, optax's AdamW state, the decoder's KV cache) and its training-step temporaries against
XLA's own figure for a compiled forward and backward pass."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from maxtext.integration.tunix import scoring
from maxtext.models import builder
from maxtext.models.decoder import MatmulCopy, ModelConfig
from maxtext.models.shared_prefix import SharedPrefix
from maxtext.trainers.post_train.rl import footprint
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


@pytest.mark.parametrize("args", [("model_name=qwen3-tiny",), ("model_name=llama-tiny", "lora_rank=4")])
def test_the_samplers_bfloat16_copy_is_the_matmul_copys_size(args):
  cfg = make_config(*args)
  mesh = create_meshes(cfg.mesh, agentic=False)[0]
  base = builder.init_random(ModelConfig.from_config(make_config(args[0]).model), mesh, 0)
  model = builder.with_lora(base, ModelConfig.from_config(cfg.model), 0) if cfg.model.lora_rank else base
  part = "sampler's bfloat16 copy (rollout_dtype)"
  copy = MatmulCopy(model, jnp.bfloat16).nbytes
  assert (
    footprint.estimate(make_config(*args, "rollout_dtype=bfloat16", "rl.use_agentic_rollout=true")).parts[part] == copy
  )
  # The standard learner samples, then trains: the copy and the training temporaries never coexist.
  parts = footprint.estimate(make_config(*args, "rollout_dtype=bfloat16", "rl.use_agentic_rollout=false")).parts
  temporaries = sum(v for k, v in parts.items() if k.startswith(("output layer", "activations")))
  assert parts[part] == max(0, copy - temporaries)
  assert footprint.estimate(make_config(*args, "rl.use_agentic_rollout=true")).parts[part] == 0


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


def test_scanned_layers_count_one_layers_compiled_programs():
  programs = lambda scan: footprint.estimate(make_config("model_name=qwen3-tiny", f"scan_layers={scan}")).parts[
    "compiled programs"
  ]
  assert programs("true") == programs("false") / 2  # qwen3-tiny's 2 layers


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
    "cfg = make_config(); before = footprint.log_estimate(cfg).total; "
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
