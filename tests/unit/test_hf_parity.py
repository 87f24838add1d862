"""Our decoder equals Hugging Face transformers on HF checkpoints that transformers itself writes.

Our model is built with matmul_precision=highest, so its float32 matmuls are float32 on any device
and the float32 tolerances hold on a GPU too (whose default is TF32-class, docs/architecture.md,
"Numerics per device"); on CPU the default is already float32-exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from maxtext.configs.pyconfig import ConfigError
from maxtext.models import decoder, load
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

# Several shapes: GQA and MHA, tied and untied heads, head_dim != hidden / heads, Llama-3 RoPE scaling.
SHAPES = {
  "qwen3-gqa-tied-headdim": (
    transformers.Qwen3Config,
    dict(
      hidden_size=48,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=16,
      intermediate_size=96,
      num_hidden_layers=2,
      tie_word_embeddings=True,
      rope_theta=1e6,
    ),
  ),
  "qwen3-mqa-untied": (
    transformers.Qwen3Config,
    dict(
      hidden_size=64,
      num_attention_heads=4,
      num_key_value_heads=1,
      head_dim=32,
      intermediate_size=80,
      num_hidden_layers=3,
      tie_word_embeddings=False,
    ),
  ),
  "llama-mha-tied": (
    transformers.LlamaConfig,
    dict(
      hidden_size=64,
      num_attention_heads=4,
      num_key_value_heads=4,
      intermediate_size=128,
      num_hidden_layers=2,
      tie_word_embeddings=True,
      rms_norm_eps=1e-5,
      rope_theta=1e5,
    ),
  ),
  "llama3-rope-scaling-untied": (
    transformers.LlamaConfig,
    dict(
      hidden_size=64,
      num_attention_heads=8,
      num_key_value_heads=2,
      intermediate_size=96,
      num_hidden_layers=2,
      tie_word_embeddings=False,
      rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 5e5,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
      },
    ),
  ),
}


def write_hf_model(path, shape, dtype=torch.float32, seed=0, **extra):
  cls, kwargs = SHAPES[shape]
  torch.manual_seed(seed)
  config = cls(vocab_size=256, max_position_embeddings=512, initializer_range=0.2, **kwargs, **extra)
  model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
  model.save_pretrained(path)
  return model


def hf_greedy(model, prompt, n):
  out = model.generate(
    torch.tensor(prompt), max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
  )
  return out[:, len(prompt[0]) :].numpy()


def our_greedy(m, prompt, n):
  """Greedy decode through the KV cache the sampler uses."""
  tokens = jnp.asarray(prompt)
  b, t = tokens.shape
  size = t + n
  cache = m.init_cache(b, size, jnp.float32)
  mask = jnp.pad(jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0), ((0, 0), (0, 0), (0, size - t)))
  logits, cache = m(tokens, jnp.broadcast_to(jnp.arange(t), (b, t)), cache, mask)
  out = []
  for i in range(t, size):
    nxt = jnp.argmax(logits[:, -1], axis=-1)
    out.append(nxt)
    mask = jnp.broadcast_to(jnp.arange(size) <= i, (b, 1, size))
    logits, cache = m(nxt[:, None], jnp.full((b, 1), i), cache, mask)
  return np.stack(out, axis=1)


def load_ours(path, *overrides):
  """Our model of the HF checkpoint at path, every matmul at float32 precision."""
  cfg = make_config(
    f"load_parameters_path={path}",
    "max_prompt_length=16",
    "max_response_length=48",
    "matmul_precision=highest",
    *overrides,
  )
  mesh, _ = create_meshes(cfg.mesh, agentic=False)
  return cfg, load.load_model(cfg.model, mesh)


# Each shape once in make test, scanned or not; the other of each in make test-slow.
_FAST_SCAN = {"qwen3-mqa-untied": "false"}


@pytest.mark.parametrize(
  "shape, scan",
  [
    (shape, scan) if scan == _FAST_SCAN.get(shape, "true") else pytest.param(shape, scan, marks=pytest.mark.slow)
    for shape in sorted(SHAPES)
    for scan in ("false", "true")
  ],
)
def test_logits_and_greedy_tokens_match_transformers(tmp_path, shape, scan):
  hf = write_hf_model(tmp_path, shape)
  cfg, ours = load_ours(tmp_path, f"scan_layers={scan}")
  assert cfg.model.decoder_family == SHAPES[shape][0].model_type
  assert ours.config.precision == jax.lax.Precision.HIGHEST
  tokens = np.random.default_rng(0).integers(0, 256, (2, 24))
  with torch.no_grad():
    ref = hf(torch.tensor(tokens)).logits.numpy()
  t = tokens.shape[1]
  got, _ = ours(
    jnp.asarray(tokens),
    jnp.broadcast_to(jnp.arange(t), (2, t)),
    None,
    jnp.tril(jnp.ones((t, t), bool))[None].repeat(2, 0),
  )
  assert np.abs(np.asarray(got) - ref).max() <= 1e-4
  prompt = tokens[:, :8]
  with torch.no_grad():
    np.testing.assert_array_equal(our_greedy(ours, prompt, 32), hf_greedy(hf, prompt, 32))


@pytest.mark.parametrize("scan", ["false", "true"])
@pytest.mark.parametrize("shape", ["qwen3-gqa-tied-headdim", "llama3-rope-scaling-untied"])
def test_bfloat16_matmul_copy_is_transformers_with_rounded_linear_inputs_and_near_float32(tmp_path, shape, scan):
  """decoder.DecodeCopy (the rollout_dtype=bfloat16 sampler's model): its logits equal transformers'
  float32 model whose embedding and linear weights, and every linear layer's input, are rounded to
  bfloat16; and they stay near the float32 model's (the samples' shift from the trainer's policy)."""
  hf = write_hf_model(tmp_path, shape)
  _, ours = load_ours(tmp_path, f"scan_layers={scan}")
  copy = decoder.DecodeCopy(ours, jnp.bfloat16)
  tokens = np.random.default_rng(0).integers(0, 256, (2, 24))
  t = tokens.shape[1]
  args = (
    jnp.asarray(tokens),
    jnp.broadcast_to(jnp.arange(t), (2, t)),
    None,
    jnp.tril(jnp.ones((t, t), bool))[None].repeat(2, 0),
  )
  got = np.asarray(nnx.merge(copy.graphdef, copy.state())(*args)[0])
  assert copy.state()["embed"][...].dtype == jnp.bfloat16
  with torch.no_grad():
    full = hf(torch.tensor(tokens)).logits.numpy()
    to_bf16 = lambda x: x.to(torch.bfloat16).to(torch.float32)
    for module in hf.modules():
      if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        module.weight.copy_(to_bf16(module.weight))
      if isinstance(module, torch.nn.Linear):
        module.register_forward_pre_hook(lambda _, inputs: tuple(to_bf16(x) for x in inputs))
    rounded = hf(torch.tensor(tokens)).logits.numpy()
  # Float32 differences of 1e-7 before a rounding can move an input by a bfloat16 step (which the
  # Llama-3 RoPE shape shows), so the match is asked of the mean: within 5% of rounding's own effect.
  assert np.abs(got - rounded).mean() <= 0.05 * np.abs(rounded - full).mean()
  logp_full, logp_got = (np.asarray(jax.nn.log_softmax(x, axis=-1)) for x in (full, got))
  kl = (np.exp(logp_full) * (logp_full - logp_got)).sum(-1)
  assert 0 < np.abs(got - full).max() <= 0.1 * np.abs(full).max() and kl.max() <= 1e-2, (
    np.abs(got - full).max(),
    kl.max(),
  )


def test_sharded_safetensors_index_loads(tmp_path):
  hf = write_hf_model(tmp_path, "qwen3-mqa-untied")
  hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
  _, a = load_ours(tmp_path)
  _, b = load_ours(tmp_path / "sharded")
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_bf16_checkpoint_loads_in_weight_dtype(tmp_path):
  hf = write_hf_model(tmp_path, "llama-mha-tied", dtype=torch.bfloat16)
  _, ours = load_ours(tmp_path, "weight_dtype=bfloat16")
  assert ours.embed[...].dtype == jnp.bfloat16
  expected = hf.model.embed_tokens.weight.detach().float().numpy()
  np.testing.assert_array_equal(np.asarray(ours.embed[...], np.float32), expected)


def test_conflicting_model_yaml_names_the_fields(tmp_path):
  write_hf_model(tmp_path, "qwen3-gqa-tied-headdim")
  with pytest.raises(ConfigError, match=r"model_name=qwen3-tiny does not match .*emb_dim=.*config.json has 48"):
    make_config("model_name=qwen3-tiny", f"load_parameters_path={tmp_path}")


def test_unsupported_hf_model_type_is_an_error(tmp_path):
  (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
  with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
    make_config(f"load_parameters_path={tmp_path}")
