"""decoder_family=gemma3 equals Hugging Face transformers' Gemma3ForCausalLM (float32, every matmul at
float32 precision, the tolerance of test_hf_parity.py) on checkpoints transformers itself writes:
sequences longer than the sliding window, one KV head, tied embeddings, query_pre_attn_scalar other
than head_dim, linear RoPE scaling of the global layers, with and without scan_layers and the KV cache,
left-padded batches and the continuous batcher's rows at different positions; our export loads back
into transformers with the same logits; and the config keys are refused where they do not apply."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from maxtext.checkpoint_conversion import hf_config, to_huggingface
from maxtext.inference.continuous_batching import ContinuousBatcher, SamplingParams
from maxtext.models import builder, decoder, load
from maxtext.utils import errors
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config
from tests.unit.test_hf_parity import hf_greedy, load_ours, our_greedy

WINDOW, VOCAB = 6, 256


def write_hf_gemma3(path, seed=0):
  """A random Gemma3ForCausalLM (norm weights random too: HF starts them at zero) saved at path.
  Layers 0, 1, 3 and 4 are sliding-window layers, 2 and 5 global."""
  torch.manual_seed(seed)
  config = transformers.Gemma3TextConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    query_pre_attn_scalar=24,
    sliding_window=WINDOW,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    rope_parameters={
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    },
    max_position_embeddings=512,
    initializer_range=0.2,
    tie_word_embeddings=True,
    pad_token_id=0,
  )
  model = transformers.Gemma3ForCausalLM(config).to(torch.float32).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.normal_(0.0, 0.5)
  model.save_pretrained(path)
  return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("gemma3")
  return path, write_hf_gemma3(path)


def _causal(b, t):
  return jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)


def test_the_checkpoints_config_reads_as_gemma3_keys(hf_dir):
  path, _ = hf_dir
  cfg, ours = load_ours(path)
  m = cfg.model
  assert (m.decoder_family, m.sliding_window_size, m.sliding_window_pattern) == ("gemma3", WINDOW, 3)
  assert (m.rope_max_timescale, dict(m.rope_scaling or {}), m.rope_local_max_timescale) == (1e6, {"factor": 8.0}, 1e4)
  assert (m.query_pre_attn_scalar, m.use_qk_norm, m.logits_via_embedding, m.num_kv_heads) == (24, True, True, 1)
  assert ours.config.global_layers == (False, False, True, False, False, True)
  assert "lm_head" not in builder.to_arrays(ours)


@pytest.mark.parametrize("scan", [pytest.param("false", marks=pytest.mark.slow), "true"])
def test_logits_and_greedy_tokens_match_transformers(hf_dir, scan):
  path, hf = hf_dir
  _, ours = load_ours(path, f"scan_layers={scan}")
  tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 24))  # four windows long
  with torch.no_grad():
    ref = hf(torch.tensor(tokens)).logits.numpy()
  t = tokens.shape[1]
  got, _ = ours(jnp.asarray(tokens), jnp.broadcast_to(jnp.arange(t), (2, t)), None, _causal(2, t))
  assert np.abs(np.asarray(got) - ref).max() <= 1e-4
  prompt = tokens[:, :8]  # prefill past the window, then 32 decode steps through the KV cache
  with torch.no_grad():
    np.testing.assert_array_equal(our_greedy(ours, prompt, 32), hf_greedy(hf, prompt, 32))


def _left_padded(lengths, width, seed=1):
  rng = np.random.default_rng(seed)
  tokens = np.zeros((len(lengths), width), np.int64)
  for row, n in enumerate(lengths):
    tokens[row, width - n :] = rng.integers(1, VOCAB, n)
  return tokens, tokens != 0


@pytest.mark.parametrize("scan", ["false", "true"])
def test_left_padded_batch_through_the_kv_cache_matches_transformers(hf_dir, scan):
  """Prompts left-padded to one width, positions counted over each row's real tokens (as Tunix's
  sampler builds them): prefill logits, then greedy decode steps that cross the window."""
  path, hf = hf_dir
  _, ours = load_ours(path, f"scan_layers={scan}")
  tokens, valid = _left_padded((14, 5, 9), 14)
  b, t, n = *tokens.shape, 12
  size = t + n
  positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
  with torch.no_grad():
    ref = hf(
      torch.tensor(tokens), attention_mask=torch.tensor(valid.astype(np.int64)), position_ids=torch.tensor(positions)
    ).logits.numpy()
    want = hf.generate(
      torch.tensor(tokens),
      attention_mask=torch.tensor(valid.astype(np.int64)),
      max_new_tokens=n,
      min_new_tokens=n,
      do_sample=False,
      eos_token_id=None,
      pad_token_id=0,
    )[:, t:].numpy()

  cache = ours.init_cache(b, size, jnp.float32)
  keys = np.pad(valid, ((0, 0), (0, n)), constant_values=True)  # the prompts' pads are never attended
  mask = np.tril(np.ones((t, size), bool)) & keys[:, None, :]
  logits, cache = ours(jnp.asarray(tokens), jnp.asarray(positions), cache, jnp.asarray(mask))
  assert np.abs(np.asarray(logits) - ref)[valid].max() <= 1e-4
  got, last = [], positions[:, -1]
  for i in range(t, size):
    got.append(np.asarray(jnp.argmax(logits[:, -1], axis=-1)))
    last = last + 1
    mask = jnp.asarray((np.arange(size) <= i) & keys)[:, None, :]
    logits, cache = ours(jnp.asarray(got[-1])[:, None], jnp.asarray(last)[:, None], cache, mask)
  np.testing.assert_array_equal(np.stack(got, axis=1), want)


def test_the_batchers_rows_at_different_positions_decode_transformers_tokens(hf_dir):
  """The continuous batcher (chunked prefill, rows at different positions, a prefix copied between
  slots) gives each prompt transformers' greedy tokens."""
  path, hf = hf_dir
  _, ours = load_ours(path)
  prompts = [np.random.default_rng(i).integers(1, VOCAB, size=n).tolist() for i, n in enumerate((3, 17, 9, 12, 17))]
  prompts[4][:12] = prompts[3]
  batcher = ContinuousBatcher(ours, cache_size=48, max_batch_size=4, prefill_chunk=8)
  futures = [batcher.submit(p, SamplingParams(10, temperature=0.0)) for p in prompts]
  got = [f.result(timeout=120).tokens.tolist() for f in futures]
  batcher.close()
  with torch.no_grad():
    want = [hf_greedy(hf, [p], 10)[0].tolist() for p in prompts]
  assert got == want


def _tiny(*overrides):
  cfg = make_config("model_name=gemma3-tiny", *overrides)
  return cfg, load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])


def _randomize_norms(model):
  """Norm scales away from their zero init, so 1 + w is exercised."""
  rng = np.random.default_rng(3)
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    if path[-1] == "scale":
      var.set_value(jnp.asarray(rng.normal(0, 0.5, var.get_value().shape), var.get_value().dtype))


@pytest.mark.slow  # make test: test_scan_layers.py on qwen3 and llama, the scanned gemma3 against transformers
def test_scanned_decoder_equals_unrolled_in_logits_cache_decode_and_gradients():
  _, unrolled = _tiny("scan_layers=false")
  _randomize_norms(unrolled)
  cfg = make_config("model_name=gemma3-tiny", "scan_layers=true")
  mesh = create_meshes(cfg.mesh, agentic=False)[0]
  scanned = builder.from_arrays(decoder.ModelConfig.from_config(cfg.model), mesh, builder.to_arrays(unrolled), "test")
  assert scanned.layers.post_attn_norm.scale[...].shape == (4, 64)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 20), 0, 1024)
  positions, causal = jnp.broadcast_to(jnp.arange(20), (2, 20)), _causal(2, 20)
  want, got = (m(tokens, positions, None, causal)[0] for m in (unrolled, scanned))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(
    our_greedy(scanned, np.asarray(tokens[:, :10]), 12), our_greedy(unrolled, np.asarray(tokens[:, :10]), 12)
  )

  def grads(model):
    loss = lambda m: jax.nn.log_softmax(m(tokens, positions, None, causal)[0]).mean()
    return builder.per_layer({builder.param_name(p): v[...] for p, v in nnx.to_flat_state(nnx.grad(loss)(model))})

  want_g, got_g = grads(unrolled), grads(scanned)
  assert sorted(want_g) == sorted(got_g) and "layers.3.post_mlp_norm.scale" in got_g
  for name in want_g:
    np.testing.assert_allclose(got_g[name], want_g[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_lora_adapters_on_the_same_projections_with_scan_layers():
  lora = ("lora_rank=4", "lora_alpha=8")
  _, unrolled = _tiny(*lora, "scan_layers=false")
  _, scanned = _tiny(*lora, "scan_layers=true")
  adapters = builder.adapters(unrolled)
  weights = [f"attn.{c}_proj" for c in "qkvo"] + [f"mlp.{w}_proj" for w in ("gate", "up", "down")]
  assert sorted(adapters) == sorted(f"layers.{i}.{w}_lora_{ab}" for i in range(4) for w in weights for ab in "ab")
  rng = np.random.default_rng(0)
  trained = {n: rng.normal(0, 0.1, a.shape).astype(a.dtype) for n, a in adapters.items()}
  builder.set_adapters(unrolled, trained, "per-layer")
  builder.set_adapters(scanned, trained, "per-layer")
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 1024)
  args = (tokens, jnp.broadcast_to(jnp.arange(16), (2, 16)), None, _causal(2, 16))
  np.testing.assert_allclose(scanned(*args)[0], unrolled(*args)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scan", ["false", "true"])
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, scan):
  cfg, ours = _tiny(f"scan_layers={scan}", "matmul_precision=highest")
  _randomize_norms(ours)
  to_huggingface.export(ours, cfg.model, None, str(tmp_path))
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).to(torch.float32).eval()
  assert isinstance(hf, transformers.Gemma3ForCausalLM)
  assert hf.config.layer_types == ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
  tokens = np.random.default_rng(0).integers(0, 1024, (2, 20))
  with torch.no_grad():
    ref = hf(torch.tensor(tokens)).logits.numpy()
  got, _ = ours(jnp.asarray(tokens), jnp.broadcast_to(jnp.arange(20), (2, 20)), None, _causal(2, 20))
  assert np.abs(np.asarray(got) - ref).max() <= 1e-4
  # and back: the exported checkpoint's config reads as gemma3-tiny's keys, its weights as ours
  back_cfg, back = load_ours(tmp_path)
  for key in hf_config.ARCHITECTURE_KEYS:
    assert getattr(back_cfg.model, key) == getattr(cfg.model, key), key
  for name, value in builder.to_arrays(ours).items():
    np.testing.assert_array_equal(builder.to_arrays(back)[name], value, err_msg=name)


def test_a_transformers_4_hub_config_reads_as_the_model_yaml(tmp_path):
  """gemma-3-4b-it's text config as the Hub's transformers-4 config.json spells it (rope_theta,
  rope_local_base_freq, rope_scaling, sliding_window_pattern) gives gemma3-4b.yml's keys."""
  (tmp_path / "config.json").write_text(
    json.dumps(
      {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-6,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "rope_theta": 1000000.0,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
      }
    )
  )
  arch = hf_config.architecture(str(tmp_path))
  yml = make_config("model_name=gemma3-4b", "random_weights=true").model
  assert arch == {key: (dict(v) if key == "rope_scaling" else v) for key in arch for v in [getattr(yml, key)]}


def test_softcapping_and_other_activations_are_refused(tmp_path):
  base = {"model_type": "gemma3_text", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8}
  for extra, match in (
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
    ({"hidden_activation": "gelu"}, "hidden_activation=gelu"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "do not repeat one pattern"),
  ):
    (tmp_path / "config.json").write_text(json.dumps({**base, "intermediate_size": 16, **extra}))
    with pytest.raises(errors.InputError, match=match):
      hf_config.architecture(str(tmp_path))


def test_gemma3_keys_are_refused_for_other_families_and_needed_by_gemma3():
  with pytest.raises(errors.ConfigError, match=r"sliding_window_size=4: only decoder_family=gemma3.*'qwen3'"):
    make_config("model_name=qwen3-tiny", "sliding_window_size=4")
  with pytest.raises(errors.ConfigError, match=r"query_pre_attn_scalar=0: decoder_family=gemma3 needs it"):
    make_config("model_name=gemma3-tiny", "query_pre_attn_scalar=0")
  with pytest.raises(errors.ConfigError, match=r"use_qk_norm=False: decoder_family=gemma3 always"):
    make_config("model_name=gemma3-tiny", "use_qk_norm=false")
  with pytest.raises(errors.ConfigError, match=r"rope_scaling=.*linear"):
    make_config("model_name=gemma3-tiny", "rope_scaling={factor: 8.0, low_freq_factor: 1.0}")


def test_sliding_window_mask_counts_attended_keys_not_slots():
  """A row whose attended keys lie after padding slots: the window keeps its last `window` of them."""
  mask = jnp.asarray([[[False, False, True, True, True, True, False]]])  # query at its 4th real token
  np.testing.assert_array_equal(
    decoder.sliding_window_mask(mask, 2), [[[False, False, False, False, True, True, False]]]
  )
