"""scan_layers=true (the decoder layers as one scanned layer over stacked parameters) computes what
the unrolled decoder computes from the same weights, and users see per-layer names either way:
random init, checkpoint conversion (HF and Orbax, written in either layout), LoRA adapters and the
continuous batcher's cache."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl.rollout import base_rollout

from maxtext.checkpoint_conversion import orbax_checkpoint, to_huggingface
from maxtext.inference.continuous_batching import ContinuousBatcher, SamplingParams
from maxtext.integration.tunix.rollout import RolloutEngine
from maxtext.models import builder, load
from maxtext.models.decoder import DecodeCopy, Decoder, ModelConfig, cache_length, cache_rows
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import errors
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

TINY = ("model_name=qwen3-tiny", "vocab_size=1024")


def _model(*overrides):
  cfg = make_config(*TINY, *overrides)
  return cfg, load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])


@pytest.fixture(scope="module")
def models():
  """(unrolled, scanned) qwen3-tiny decoders from the same seed."""
  return _model("scan_layers=false")[1], _model("scan_layers=true")[1]


def _inputs(b=2, t=12):
  tokens = jax.random.randint(jax.random.PRNGKey(1), (b, t), 0, 1024)
  return tokens, jnp.broadcast_to(jnp.arange(t), (b, t)), jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)


def _jitted(model):
  """The model's call, compiled: model(tokens, positions, cache, mask) -> (logits, cache)."""
  graphdef, state = nnx.split(model)
  call = jax.jit(lambda s, *args: nnx.merge(graphdef, s)(*args))
  return lambda *args: call(state, *args)


def _greedy(model, prompt, n):
  """Greedy decode of prompt [B, T] through the KV cache, one position per step after the prefill."""
  b, t = prompt.shape
  size, call = t + n, _jitted(model)
  cache = model.init_cache(b, size, jnp.float32)
  mask = jnp.pad(jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0), ((0, 0), (0, 0), (0, size - t)))
  logits, cache = call(prompt, jnp.broadcast_to(jnp.arange(t), (b, t)), cache, mask)
  out = []
  for i in range(t, size):
    out.append(jnp.argmax(logits[:, -1], axis=-1))
    mask = jnp.broadcast_to(jnp.arange(size) <= i, (b, 1, size))
    logits, cache = call(out[-1][:, None], jnp.full((b, 1), i, jnp.int32), cache, mask)
  assert cache_rows(cache) == b and cache_length(cache) == size
  return np.stack(out, axis=1)


def _assert_same_arrays(a: dict, b: dict, **tolerance):
  assert sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_allclose(np.asarray(a[name]), np.asarray(b[name]), err_msg=name, **tolerance)


def test_a_seed_gives_the_same_weights_stacked_under_per_layer_names(models):
  unrolled, scanned = models
  assert scanned.layers.attn.q_proj[...].shape == (2, *unrolled.layers[0].attn.q_proj[...].shape)
  _assert_same_arrays(builder.to_arrays(unrolled), builder.to_arrays(scanned), rtol=0, atol=0)
  # The stacked axis is named 'layers' and sharded over no mesh axis.
  spec = nnx.get_partition_spec(nnx.state(scanned))["layers"]["mlp"]["down_proj"].get_value()
  assert scanned.layers.mlp.down_proj.get_metadata()["out_sharding"] == ("layers", "mlp", "embed")
  assert tuple(spec) == (None, "tensor", "fsdp")


def test_logits_kv_cache_decode_and_gradients_equal_the_unrolled_decoders(models):
  unrolled, scanned = models
  tokens, positions, causal = _inputs()
  want, _ = _jitted(unrolled)(tokens, positions, None, causal)
  got, no_cache = _jitted(scanned)(tokens, positions, None, causal)
  assert no_cache is None
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

  cache = scanned.init_cache(2, 40, jnp.float32)
  assert set(cache) == {"layers"} and cache["layers"]["k"].shape[:2] == (2, 2)  # rows first, then layers
  assert cache_length(cache) == 40 and cache_rows(cache) == 2
  np.testing.assert_array_equal(_greedy(scanned, tokens[:, :8], 24), _greedy(unrolled, tokens[:, :8], 24))

  def grads(model):
    loss = lambda m: jax.nn.log_softmax(m(tokens, positions, None, causal)[0]).mean()
    graphdef, state = nnx.split(model)
    return jax.jit(lambda s: nnx.grad(loss)(nnx.merge(graphdef, s)))(state)

  per_layer = lambda g: builder.per_layer({builder.param_name(p): v[...] for p, v in nnx.to_flat_state(g)})
  _assert_same_arrays(per_layer(grads(unrolled)), per_layer(grads(scanned)), rtol=1e-5, atol=1e-7)


def test_the_batcher_decodes_the_same_tokens_from_a_stacked_cache(models):
  prompts = [np.random.default_rng(i).integers(1, 1024, size=n).tolist() for i, n in enumerate((3, 17, 9, 12, 17))]
  prompts[4][:12] = prompts[3]  # a prompt that starts with another's (its prefix copied between slots)
  results = []
  for model in models:
    batcher = ContinuousBatcher(model, cache_size=48, max_batch_size=4, prefill_chunk=8)  # rows grow 1 -> 4
    futures = [batcher.submit(p, SamplingParams(6, temperature=0.0)) for p in prompts]
    results.append([f.result(timeout=120).tokens.tolist() for f in futures])
    batcher.close()
  assert results[0] == results[1]


def test_tunix_samplers_greedy_tokens_are_the_same_from_a_stacked_cache(qwen3_tokenizer):
  """Tunix's sampler (rollout_engine=vanilla) makes the cache with init_cache and passes it back."""
  config = base_rollout.RolloutConfig(
    max_tokens_to_generate=8, max_prompt_length=16, kv_cache_size=24, temperature=0.0, top_p=None, top_k=None
  )
  prompts = ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "What is 2 + 3?"]
  tokens = []
  for scan in ("false", "true"):
    cfg = make_config("model_name=qwen3-tiny", f"scan_layers={scan}")
    mesh, _ = create_meshes(cfg.mesh, agentic=False)
    engine = RolloutEngine(load.load_model(cfg.model, mesh), qwen3_tokenizer, mesh, config, seed=0)
    tokens.append([t.tolist() for t in engine.generate(prompts, config).tokens])
  assert tokens[0] == tokens[1] and all(len(t) == 8 for t in tokens[1])


def test_the_bfloat16_copy_of_a_scanned_decoder_is_the_unrolled_ones_with_norm_scales_in_float32(models):
  copies = [DecodeCopy(m, jnp.bfloat16) for m in models]
  state = copies[1].state()
  assert state["layers"][1]["attn"]["q_proj"][...].dtype == jnp.bfloat16
  assert state["layers"][1]["attn_norm"]["scale"][...].dtype == jnp.float32
  assert copies[0].nbytes == copies[1].nbytes
  assert copies[1].nbytes - copies[1].added_bytes == 64 * 4  # the final norm's scale, shared, not copied
  tokens, positions, causal = _inputs()
  want, got = (nnx.merge(c.graphdef, c.state())(tokens, positions, None, causal)[0] for c in copies)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("written_scanned", [False, True])
def test_an_orbax_checkpoint_of_either_layout_loads_into_either_decoder(tmp_path, models, written_scanned):
  source = models[int(written_scanned)]
  orbax_checkpoint.save_params(str(tmp_path), source)
  saved = orbax_checkpoint.restore_arrays(str(tmp_path))
  assert ("layers.attn.q_proj" in saved) == written_scanned
  assert orbax_checkpoint.stacked_layers(str(tmp_path)) == written_scanned
  for scan in ("false", "true"):
    _, loaded = _model(f"load_parameters_path={tmp_path}", f"scan_layers={scan}")
    _assert_same_arrays(builder.to_arrays(loaded), builder.to_arrays(source), rtol=0, atol=0)


def test_hf_export_of_a_scanned_decoder_round_trips(tmp_path, models, qwen3_tokenizer):
  _, scanned = models
  cfg, _ = _model("scan_layers=true")
  to_huggingface.export(scanned, cfg.model, qwen3_tokenizer, str(tmp_path))
  for scan in ("false", "true"):
    _, loaded = _model(f"load_parameters_path={tmp_path}", f"scan_layers={scan}")
    _assert_same_arrays(builder.to_arrays(loaded), builder.to_arrays(scanned), rtol=0, atol=0)


def test_lora_adapters_are_stacked_per_weight_and_named_per_layer():
  lora = ("lora_rank=4", "lora_alpha=8")
  _, unrolled = _model(*lora, "scan_layers=false")
  _, scanned = _model(*lora, "scan_layers=true")
  adapters = builder.adapters(scanned)
  assert "layers.1.attn.q_proj_lora_a" in adapters and scanned.layers.attn.q_proj_lora_a[...].shape[0] == 2
  _assert_same_arrays(builder.adapters(unrolled), adapters, rtol=0, atol=0)
  # Trained adapters (B no longer zero), set per layer or stacked (as a scanned run's checkpoint holds
  # them), merge into the same exported weights and logits.
  rng = np.random.default_rng(0)
  trained = {n: rng.normal(0, 0.1, a.shape).astype(a.dtype) for n, a in adapters.items()}
  builder.set_adapters(unrolled, trained, "per-layer")
  stacked = {
    f"layers.{rest}": np.stack([trained[f"layers.{i}.{rest}"] for i in range(2)])
    for rest in {n.split(".", 2)[2] for n in trained}
  }
  builder.set_adapters(scanned, stacked, "stacked")
  _assert_same_arrays(builder.adapters(scanned), trained, rtol=0, atol=0)
  _assert_same_arrays(builder.to_arrays(scanned), builder.to_arrays(unrolled), rtol=1e-6, atol=1e-6)
  tokens, positions, causal = _inputs()
  np.testing.assert_allclose(
    _jitted(scanned)(tokens, positions, None, causal)[0],
    _jitted(unrolled)(tokens, positions, None, causal)[0],
    rtol=1e-5,
    atol=1e-5,
  )


def test_a_lora_path_selecting_some_layers_only_is_refused_with_scan_layers(capsys):
  """Some layers' adapters need unrolled layers; the default (scan_layers=true) refuses them at config
  time, before any data or weights load, in one line naming both keys and the way out (and the
  decoder itself, built from a ModelConfig directly)."""
  some = r"layers\.0\.attn\.q_proj"
  refusal = r"lora_module_path=.*selects q_proj of 1 of the 2 layers; with scan_layers=true.*set scan_layers=false"
  cfg, unrolled = _model("lora_rank=4", f"lora_module_path={some}", "scan_layers=false")
  assert list(builder.adapters(unrolled)) == ["layers.0.attn.q_proj_lora_a", "layers.0.attn.q_proj_lora_b"]
  assert make_config(*TINY).model.scan_layers
  with pytest.raises(errors.ConfigError, match=refusal) as e:
    make_config(*TINY, "lora_rank=4", f"lora_module_path={some}")
  capsys.readouterr()
  assert train_rl.main(["train_rl", "rl.yml", *TINY, "lora_rank=4", f"lora_module_path={some}"]) == 2
  assert capsys.readouterr().err.splitlines() == [f"config error: {e.value}"]
  scanned = dataclasses.replace(ModelConfig.from_config(cfg.model), scan_layers=True)
  with pytest.raises(ValueError, match=refusal):
    nnx.eval_shape(lambda: Decoder(scanned, rngs=nnx.Rngs(0)))


def test_logical_axis_rules_without_the_layers_axis_are_refused_with_scan_layers():
  rules = 'logical_axis_rules=[["vocab",["tensor"]],["embed",["fsdp"]],["mlp",["tensor"]],["q_heads",["tensor"]],'
  rules += '["kv_heads",["tensor"]],["heads",["tensor"]],["kv",[]],["norm",[]]]'
  make_config(*TINY, rules, "scan_layers=false")  # unrolled layers need no rule for it
  with pytest.raises(errors.ConfigError, match=r"logical_axis_rules: no rule for 'layers'.*scan_layers=true"):
    make_config(*TINY, rules)  # the default scans
