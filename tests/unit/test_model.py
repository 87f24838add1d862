"""Decoder numerics: KV-cache decoding equals a full forward pass; GGUF files load exactly."""

import dataclasses
import os
import re

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from maxtext.checkpoint_conversion import gguf_reader, orbax_checkpoint
from maxtext.models import builder, decoder, hf_layout, load
from maxtext.models.decoder import ModelConfig
from maxtext.utils import errors
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config


def _model(*overrides):
  cfg = make_config(*overrides)
  mesh, _ = create_meshes(cfg.mesh, agentic=False)
  return cfg, mesh, load.load_model(cfg.model, mesh)


@pytest.mark.parametrize("model", ["qwen3-tiny", "llama-tiny", "gemma3-tiny"])
def test_prefill_plus_decode_equals_full_forward(model):
  _, _, m = _model(f"model_name={model}")
  b, t, prefill, cache_size = 2, 12, 5, 20
  tokens = jax.random.randint(jax.random.PRNGKey(1), (b, t), 0, 1000)
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  causal = jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)
  full, no_cache = m(tokens, positions, None, causal)
  assert no_cache is None

  cache = m.init_cache(b, cache_size, jnp.float32)
  mask = jnp.pad(causal[:, :prefill, :prefill], ((0, 0), (0, 0), (0, cache_size - prefill)))
  logits, cache = m(tokens[:, :prefill], positions[:, :prefill], cache, mask)
  steps = [logits]
  for i in range(prefill, t):
    mask = jnp.broadcast_to(jnp.arange(cache_size) <= i, (b, 1, cache_size))
    logits, cache = m(tokens[:, i : i + 1], positions[:, i : i + 1], cache, mask)
    steps.append(logits)
  # unrolled: {layer_i: ...}, scanned (the default): one stacked {layers: ...}; every row at t in each
  assert list(cache) == (["layers"] if m.config.scan_layers else [f"layer_{i}" for i in range(m.config.num_layers)])
  assert all(np.asarray(layer["end_index"]).tolist() == [t] * b for layer in cache.values())
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)
  # A prefill asking for the last position's logits only (Tunix's sampler does) gets that row.
  last, _ = m(
    tokens,
    positions,
    m.init_cache(b, cache_size, jnp.float32),
    mask_for(causal, cache_size),
    decode_only_last_token=True,
  )
  assert last.shape == (b, 1, full.shape[-1])
  np.testing.assert_allclose(last, full[:, -1:], atol=1e-5)


def mask_for(causal, cache_size):
  """A causal mask [B, T, T] padded to a cache of cache_size positions."""
  return jnp.pad(causal, ((0, 0), (0, 0), (0, cache_size - causal.shape[-1])))


def test_left_padding_does_not_change_logits():
  _, _, m = _model("model_name=llama-tiny")
  tokens = jnp.array([[5, 6, 7, 8]])
  pos = jnp.arange(4)[None]
  ref, _ = m(tokens, pos, None, jnp.tril(jnp.ones((4, 4), bool))[None])
  padded = jnp.array([[0, 0, 5, 6, 7, 8]])
  valid = padded != 0
  mask = jnp.tril(jnp.ones((6, 6), bool))[None] & valid[:, None, :]
  out, _ = m(padded, jnp.array([[0, 0, 0, 1, 2, 3]]), None, mask)
  np.testing.assert_allclose(out[:, 2:], ref, atol=1e-5)


@pytest.mark.parametrize("scan", ["false", "true"])
def test_parameters_carry_logical_axes_resolved_to_the_mesh(scan):
  _, mesh, m = _model("model_name=qwen3-tiny", f"scan_layers={scan}")
  specs = nnx.get_partition_spec(nnx.state(m))
  # embed [vocab, embed] -> (tensor, fsdp) by base.yml's logical_axis_rules; stacked layers' leading
  # 'layers' axis on no mesh axis
  assert tuple(specs["embed"].get_value()) == ("tensor", "fsdp")
  if scan == "true":
    assert tuple(specs["layers"]["mlp"]["down_proj"].get_value()) == (None, "tensor", "fsdp")
  else:
    assert tuple(specs["layers"][0]["mlp"]["down_proj"].get_value()) == ("tensor", "fsdp")
  assert m.embed[...].sharding.mesh == mesh


def _llama_cpp_permute(w, n_head):
  """llama.cpp's convert_hf_to_gguf layout for q/k rows (the reference for our inverse)."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(path, cfg, hf):
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_block_count(cfg.model.num_decoder_layers)
  w.add_embedding_length(cfg.model.emb_dim)
  w.add_feed_forward_length(cfg.model.mlp_dim)
  w.add_head_count(cfg.model.num_query_heads)
  w.add_head_count_kv(cfg.model.num_kv_heads)
  w.add_vocab_size(cfg.model.vocab_size)
  names = {v: k for k, v in gguf_reader._GLOBAL_NAMES.items()}
  blocks = {v: k for k, v in gguf_reader._BLOCK_NAMES.items()}
  for name, arr in hf.items():
    if name in names:
      w.add_tensor(names[name], arr)
      continue
    layer, rest = name.split(".")[2], ".".join(name.split(".")[3:-1])
    if rest == "self_attn.q_proj":
      arr = _llama_cpp_permute(arr, cfg.model.num_query_heads)
    elif rest == "self_attn.k_proj":
      arr = _llama_cpp_permute(arr, cfg.model.num_kv_heads)
    w.add_tensor(f"blk.{layer}.{blocks[rest]}.weight", arr)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def _random_hf_llama(cfg, seed=0):
  rng = np.random.default_rng(seed)
  e, m, d = cfg.model.emb_dim, cfg.model.mlp_dim, cfg.model.head_dim
  hf = {
    "model.embed_tokens.weight": rng.normal(size=(cfg.model.vocab_size, e)),
    "model.norm.weight": 1 + 0.1 * rng.normal(size=e),
    "lm_head.weight": rng.normal(size=(cfg.model.vocab_size, e)) * 0.1,
  }
  for i in range(cfg.model.num_decoder_layers):
    p = f"model.layers.{i}."
    hf[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=e)
    hf[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=e)
    hf[p + "self_attn.q_proj.weight"] = rng.normal(size=(cfg.model.num_query_heads * d, e)) * 0.1
    hf[p + "self_attn.k_proj.weight"] = rng.normal(size=(cfg.model.num_kv_heads * d, e)) * 0.1
    hf[p + "self_attn.v_proj.weight"] = rng.normal(size=(cfg.model.num_kv_heads * d, e)) * 0.1
    hf[p + "self_attn.o_proj.weight"] = rng.normal(size=(e, cfg.model.num_query_heads * d)) * 0.1
    hf[p + "mlp.gate_proj.weight"] = rng.normal(size=(m, e)) * 0.1
    hf[p + "mlp.up_proj.weight"] = rng.normal(size=(m, e)) * 0.1
    hf[p + "mlp.down_proj.weight"] = rng.normal(size=(e, m)) * 0.1
  return {k: v.astype(np.float32) for k, v in hf.items()}


@pytest.mark.parametrize("scan", ["false", "true"])
def test_gguf_file_loads_with_rope_rows_restored(tmp_path, scan):
  cfg = make_config("model_name=llama-tiny", "vocab_size=256")
  hf = _random_hf_llama(cfg)
  path = tmp_path / "tiny.gguf"
  _write_tiny_gguf(path, cfg, hf)
  read = gguf_reader.read_hf_state_dict(str(path))
  assert set(read) == set(hf)
  for name, arr in hf.items():
    np.testing.assert_array_equal(read[name], arr, err_msg=name)

  cfg = make_config("model_name=llama-tiny", "vocab_size=256", f"load_parameters_path={path}", f"scan_layers={scan}")
  mesh, _ = create_meshes(cfg.mesh, agentic=False)
  loaded = load.load_model(cfg.model, mesh)
  mcfg = ModelConfig.from_config(cfg.model)
  expected = builder.from_arrays(mcfg, mesh, hf_layout.hf_to_maxtext(hf, mcfg), "reference")
  tokens = jnp.array([[1, 2, 3, 4, 5]])
  mask = jnp.tril(jnp.ones((5, 5), bool))[None]
  a, _ = loaded(tokens, jnp.arange(5)[None], None, mask)
  b, _ = expected(tokens, jnp.arange(5)[None], None, mask)
  np.testing.assert_array_equal(a, b)


def test_gguf_architecture_mismatch_names_fields(tmp_path):
  cfg = make_config("model_name=llama-tiny", "vocab_size=256")
  path = tmp_path / "tiny.gguf"
  _write_tiny_gguf(path, cfg, _random_hf_llama(cfg))
  with pytest.raises(ValueError, match="emb_dim=32 but the file has llama.embedding_length=64"):
    _model("model_name=llama-tiny", "vocab_size=256", "emb_dim=32", f"load_parameters_path={path}")


def test_missing_weights_file_is_a_clear_error():
  with pytest.raises(FileNotFoundError, match="nope.gguf: GGUF file not found"):
    _model("model_name=llama-tiny", "load_parameters_path=/tmp/nope.gguf")


def test_weights_or_adapters_with_other_names_are_refused_naming_the_file():
  cfg, mesh, m = _model("model_name=qwen3-tiny")
  arrays = builder.to_arrays(m)
  extra = {**{k: v for k, v in arrays.items() if k != "final_norm.scale"}, "layers.0.extra": np.zeros(2)}
  with pytest.raises(
    errors.InputError,
    match=r"^w\.safetensors: parameters do not match the qwen3 architecture; "
    r"missing \['final_norm\.scale'\], unexpected \['layers\.0\.extra'\]$",
  ):
    builder.from_arrays(ModelConfig.from_config(cfg.model), mesh, extra, "w.safetensors")
  _, _, lora = _model("model_name=qwen3-tiny", "lora_rank=4", "lora_alpha=8")
  adapters = builder.adapters(lora)
  dropped = sorted(adapters)[0]
  with pytest.raises(
    errors.InputError,
    match=rf"^a\.ckpt: LoRA adapters do not match lora_rank/lora_module_path; "
    rf"missing \['{re.escape(dropped)}'\], unexpected \[\]$",
  ):
    builder.set_adapters(lora, {k: v for k, v in adapters.items() if k != dropped}, "a.ckpt")


def test_model_without_default_weights_needs_a_path():
  with pytest.raises(ValueError, match="load_parameters_path: required for model_name=qwen3-0.6b"):
    _model("model_name=qwen3-0.6b")


def test_random_weights_give_any_model_its_shape_without_a_file():
  cfg, _, model = _model("model_name=qwen3-0.6b", "random_weights=true", "vocab_size=512", "num_decoder_layers=2")
  arrays = builder.to_arrays(model)
  assert arrays["embed"].shape == (512, 1024) and arrays["layers.1.mlp.gate_proj"].shape == (1024, 3072)
  assert arrays["layers.0.attn.k_proj"].shape == (1024, 8, 128) and "layers.2.attn.k_proj" not in arrays
  logits, _ = model(jnp.array([[1, 2, 3]]), jnp.arange(3)[None], None, jnp.tril(jnp.ones((1, 3, 3), bool)))
  assert logits.shape == (1, 3, 512) and np.isfinite(np.asarray(logits)).all()
  assert cfg.model.num_query_heads == 16 and cfg.model.head_dim == 128  # the rest of qwen3-0.6b's shape
  with pytest.raises(ValueError, match="random_weights=true and load_parameters_path=/tmp/w.gguf: expected one"):
    _model("model_name=qwen3-0.6b", "random_weights=true", "load_parameters_path=/tmp/w.gguf")


def test_relative_output_and_checkpoint_paths_are_under_the_working_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  cfg, _, model = _model("model_name=qwen3-tiny", "base_output_directory=outputs", "run_name=rel")
  assert cfg.run.run_dir == str(tmp_path / "outputs" / "rel")  # where train_rl's checkpoints go
  step_dir = orbax_checkpoint.save_params("converted", model)  # as to_maxtext base_output_directory=converted
  assert step_dir == str(tmp_path / "converted" / "0") and os.path.isdir(step_dir)
  arrays = orbax_checkpoint.restore_arrays("converted")
  np.testing.assert_array_equal(arrays["embed"], np.asarray(builder.to_arrays(model)["embed"]))


def _training_step(cfg, mesh, graphdef, tokens):
  """grad of the mean logit of the last 8 positions, as a jitted function of the model state."""
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  causal = jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)
  return jax.jit(
    lambda state: nnx.grad(lambda m: m(tokens, positions, None, causal)[0][:, -8:].mean())(nnx.merge(graphdef, state))
  )


@pytest.mark.parametrize("scan", ["false", "true"])
def test_remat_full_recomputes_layers_and_cuts_the_training_steps_memory(scan):
  """remat_policy=full keeps one layer's activations at a time: a training step of SmolLM2-135M's
    shape (8 layers, 8192-token vocabulary) on 4 x 256 tokens needs under a third of the XLA
  temporaries it needs without remat
    (compiled only, on abstract weights). This holds with the CPU scheduler maxtext selects on import
    (see maxtext/__init__.py); XLA's default one kept every layer's activations alive. Gradients are
    the same either way (tiny model, run). Both hold with the layers unrolled and scanned."""
  temps = {}
  for remat in ("none", "full"):
    cfg = make_config(
      "model_name=smollm2-135m",
      "num_decoder_layers=8",
      "vocab_size=8192",
      f"remat_policy={remat}",
      f"scan_layers={scan}",
    )
    mesh, _ = create_meshes(cfg.mesh, agentic=False)
    graphdef, abstract, _ = builder._abstract(ModelConfig.from_config(cfg.model), mesh)
    step = _training_step(cfg, mesh, graphdef, jnp.zeros((4, 256), jnp.int32))
    with jax.set_mesh(mesh):
      temps[remat] = step.lower(abstract).compile().memory_analysis().temp_size_in_bytes
  assert temps["full"] < temps["none"] / 3, temps
  cfg, mesh, model = _model("model_name=qwen3-tiny", "remat_policy=full", f"scan_layers={scan}")
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 16), 0, 1000)
  grads = _training_step(cfg, mesh, nnx.graphdef(model), tokens)(nnx.state(model))
  reference_cfg, _, reference = _model("model_name=qwen3-tiny", "remat_policy=none", f"scan_layers={scan}")
  expected = _training_step(reference_cfg, mesh, nnx.graphdef(reference), tokens)(nnx.state(reference))
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)


def test_swiglu_gradients_are_autodiffs_and_keep_one_array_per_layer_less():
  """decoder._swiglu's backward pass (gate and up kept, the sigmoid recomputed) against autodiff of
  silu(gate) * up, and the compiled gradient of a 4-layer MLP stack: one [tokens, mlp_dim] array
  per layer fewer among XLA's temporaries."""
  rng = np.random.default_rng(0)
  plain = lambda g, u: jax.nn.silu(g) * u
  gate, up, weights = (jnp.asarray(3 * rng.normal(size=(5, 7)), jnp.float32) for _ in range(3))
  for got, want in zip(
    jax.grad(lambda g, u: jnp.sum(decoder._swiglu(g, u) * weights), (0, 1))(gate, up),
    jax.grad(lambda g, u: jnp.sum(plain(g, u) * weights), (0, 1))(gate, up),
  ):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  tokens, dim, mlp = 512, 256, 1024
  x = jnp.asarray(rng.normal(size=(tokens, dim)), jnp.float32)
  layers = [
    tuple(jnp.asarray(0.05 * rng.normal(size=s), jnp.float32) for s in ((dim, mlp), (dim, mlp), (mlp, dim)))
    for _ in range(4)
  ]

  def stack(act):
    def loss(layers, x):
      for g, u, down in layers:
        x = x + act(x @ g, x @ u) @ down
      return jnp.sum(x * x)

    return jax.jit(jax.grad(loss)).lower(layers, x).compile().memory_analysis().temp_size_in_bytes

  assert stack(plain) - stack(decoder._swiglu) >= 4 * tokens * mlp * 4


def _dot_precisions(lowered) -> list[str]:
  """The operand precisions of every dot_general in a lowered program's StableHLO, one string per dot
  ("" for a dot that names none)."""
  dots = [line for line in lowered.as_text().splitlines() if "stablehlo.dot_general" in line]
  return [" ".join(re.findall(r"precision = \[\w+, \w+\]", line)) for line in dots]


@pytest.mark.parametrize("precision", ["default", "highest"])
def test_matmul_precision_reaches_every_dot_of_training_sampling_and_scoring(precision):
  """matmul_precision is the precision of every dot_general in the programs that compute with the
  model (lowered, not run; a LoRA-adapted Qwen3): the gradient of the loss's per-token log-probs
  and entropies (scoring.completion_logps, through the decoder and through SharedPrefix), and the
  batched engine's prefill and KV-cache decode step, from the model and from its bfloat16
  DecodeCopy."""
  from maxtext.inference import kv_programs as kv
  from maxtext.integration.tunix import scoring
  from maxtext.models.shared_prefix import SharedPrefix

  _, _, m = _model("model_name=qwen3-tiny", f"matmul_precision={precision}", "lora_rank=2")
  graphdef, state = nnx.split(m)
  prompt, completion = jnp.ones((4, 6), jnp.int32), jnp.ones((4, 5), jnp.int32)

  def scored(state, shared):
    model = nnx.merge(graphdef, state)
    logps, entropy = scoring.completion_logps(
      SharedPrefix(model, 6, 2) if shared else model, prompt, completion, 0, 1, 0.7
    )
    return logps.sum() + entropy.sum()

  programs = {
    f"loss gradient (shared={s})": jax.jit(jax.grad(scored), static_argnums=1).lower(state, s) for s in (0, 1)
  }
  rows, size = 4, 16
  copy = decoder.DecodeCopy(m, jnp.bfloat16)
  for name, (graph, weights, layout) in {
    "model": (graphdef, state, m),
    "bfloat16 copy": (copy.graphdef, copy.state(), copy),
  }.items():
    static, cache = kv._StaticGraph(graph), layout.init_cache(rows, size, jnp.float32)
    ints = jnp.zeros((rows,), jnp.int32)
    programs[f"prefill ({name})"] = kv._extend.lower(static, weights, cache, jnp.ones((rows, 3), jnp.int32), ints)
    programs[f"decode chunk ({name})"] = kv._decode.lower(
      static,
      weights,
      cache,
      ints,
      ints,
      ints,
      jnp.zeros((rows, 2), jnp.uint32),
      jnp.ones((rows, 2)),
      ints,
      None,
      ints,
      jnp.full((rows, 1), -1, jnp.int32),
      jnp.array([4, 0]),
      4,
    )
  want = f"precision = [{precision.upper()}, {precision.upper()}]"
  for name, lowered in programs.items():
    precisions = _dot_precisions(lowered)
    assert precisions and set(precisions) == {want}, (name, precisions)


def test_a_query_row_that_attends_no_key_attends_every_key_through_dot_product_attention():
  """decoder._dot_product_attention (cuDNN's call, here through XLA): a row whose mask is all False
  (a left-padded position) comes out as if it attended every key; the other rows keep their mask."""
  b, t, n, k_heads, d = 2, 5, 4, 2, 8
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(keys[0], (b, t, n, d))
  k = jax.random.normal(keys[1], (b, k_heads, d, t))  # the cache's layouts
  v = jax.random.normal(keys[2], (b, k_heads, t, d))
  causal = jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)
  padded = causal.at[1, :2].set(False)  # the second row's first two positions attend nothing
  out = decoder._dot_product_attention(q, k, v, padded, "xla")
  every = decoder._dot_product_attention(q, k, v, jnp.ones_like(causal), "xla")
  want = decoder._dot_product_attention(q, k, v, causal, "xla")
  assert bool(jnp.isfinite(out).all())
  np.testing.assert_allclose(out[1, :2], every[1, :2], rtol=1e-6)
  np.testing.assert_allclose(out[0], want[0], rtol=1e-6)
  np.testing.assert_allclose(out[1, 2:], want[1, 2:], rtol=1e-6)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's flash attention runs on an NVIDIA GPU")
def test_cudnn_flash_on_a_gpu_equals_dot_product_on_left_padded_rows_with_finite_gradients():
  """attention=cudnn_flash through cuDNN itself, in bfloat16: logits and gradients on left-padded
  causal rows (a padded row attends no key) are finite and equal the einsum path's within bfloat16's
  rounding."""
  _, _, m = _model("model_name=qwen3-tiny", "vocab_size=512", "dtype=bfloat16", "attention=dot_product")
  flash_cfg = dataclasses.replace(m.config, attention="cudnn_flash")
  flash = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: decoder.Decoder(flash_cfg, rngs=nnx.Rngs(0)))), nnx.state(m))
  b, t = 4, 64
  tokens = jax.random.randint(jax.random.PRNGKey(1), (b, t), 0, 512)
  valid = jnp.arange(t)[None] >= jnp.array([[0], [3], [17], [40]])
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
  causal = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]
  weights = jax.random.normal(jax.random.PRNGKey(2), (b, t, 512)) * valid[..., None]
  logits = lambda model: model(tokens, positions, None, causal)[0].astype(jnp.float32)
  want, got = nnx.jit(logits)(m), nnx.jit(logits)(flash)
  assert bool(jnp.isfinite(got).all())
  np.testing.assert_allclose(got * valid[..., None], want * valid[..., None], atol=0.05 * float(jnp.abs(want).max()))
  loss = lambda model: jnp.sum(logits(model) * weights)
  grads = [nnx.jit(nnx.grad(loss))(model) for model in (m, flash)]
  for got_grad, want_grad in zip(jax.tree.leaves(grads[1]), jax.tree.leaves(grads[0])):
    got_grad, want_grad = np.asarray(got_grad, np.float32), np.asarray(want_grad, np.float32)
    assert np.isfinite(got_grad).all()
    np.testing.assert_allclose(got_grad, want_grad, atol=0.05 * float(np.abs(want_grad).max()) + 1e-6)


# gemma3: sliding window and query_pre_attn_scalar; one case per layout (scanned: the default)
@pytest.mark.parametrize(("model", "scan"), [("qwen3-tiny", "false"), ("gemma3-tiny", "true")])
def test_attention_through_dot_product_attention_is_the_einsum_path(monkeypatch, model, scan):
  """attention=cudnn_flash's call (decoder._dot_product_attention: the KV cache's layouts turned to
  jax.nn.dot_product_attention's, grouped-query heads, the mask over every head, the scale), run
  through XLA on CPU instead of cuDNN: the decoder's logits and gradients equal the einsum path's
  (attention=dot_product) on every row not padded, without a cache on left-padded causal rows and
  over a KV cache that already holds a prompt. Decode steps (one query position) take the einsum path."""
  _, _, m = _model(f"model_name={model}", "vocab_size=512", f"scan_layers={scan}")
  assert m.config.attention == "dot_product" and m.config.num_query_heads > m.config.num_kv_heads
  helper, implementations = decoder._dot_product_attention, []

  def through_xla(q, k, v, mask, implementation, scale=None):
    implementations.append(implementation)
    return helper(q, k, v, mask, "xla", scale)

  monkeypatch.setattr(decoder, "_dot_product_attention", through_xla)
  flash_cfg = dataclasses.replace(m.config, attention="cudnn_flash")
  flash = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: decoder.Decoder(flash_cfg, rngs=nnx.Rngs(0)))), nnx.state(m))

  b, t, size, prompt = 2, 10, 16, 6
  tokens = jax.random.randint(jax.random.PRNGKey(1), (b, t), 0, 512)
  valid = jnp.arange(t)[None] >= jnp.array([[0], [3]])  # the second row left-padded by 3
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
  causal = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]
  weights = (
    jax.random.normal(jax.random.PRNGKey(2), (b, t + 1, 512))
    * jnp.pad(valid, ((0, 0), (0, 1)), constant_values=True)[..., None]
  )

  def whole(model):
    return model(tokens, positions, None, causal)[0]

  def cached(model):
    """A prompt chunk into an empty cache, the rest of the rows over it, then one decode step."""
    cache = model.init_cache(b, size, jnp.float32)
    pad = lambda mask: jnp.pad(mask, ((0, 0), (0, 0), (0, size - mask.shape[2])))
    first, cache = model(tokens[:, :prompt], positions[:, :prompt], cache, pad(causal[:, :prompt, :prompt]))
    rest, cache = model(tokens[:, prompt:], positions[:, prompt:], cache, pad(causal[:, prompt:]))
    step_mask = jnp.concatenate([valid, jnp.ones((b, 1), bool)], axis=1)[:, None, :]
    step, _ = model(tokens[:, -1:], positions[:, -1:] + 1, cache, pad(step_mask))
    return jnp.concatenate([first, rest, step], axis=1)

  for run in (whole, cached):
    implementations.clear()
    want, got = nnx.jit(run)(m), nnx.jit(run)(flash)
    traced = 1 if m.config.scan_layers else m.config.num_layers  # the scanned layer is traced once
    assert implementations == ["cudnn"] * traced * (1 if run is whole else 2), implementations
    scored = valid if run is whole else jnp.concatenate([valid, jnp.ones((b, 1), bool)], axis=1)
    # a padded row attends every key through cuDNN's call, none through the einsums: no row reads it
    np.testing.assert_allclose(got * scored[..., None], want * scored[..., None], rtol=1e-5, atol=1e-5)
    loss = lambda model, run=run: jnp.sum(run(model) * weights[:, : t + (run is cached)])
    grads = [nnx.jit(nnx.grad(loss))(model) for model in (m, flash)]
    largest = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads[0]))
    for got_grad, want_grad in zip(jax.tree.leaves(grads[1]), jax.tree.leaves(grads[0])):
      np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-5 * largest)


def _op_types(lowered, op: str) -> set[str]:
  """The element types of a StableHLO op's uses in a lowered program, shapes dropped: "(bf16, bf16) ->
  f32" for a binary op, "f32" for a unary one."""
  lines = [line for line in lowered.as_text().splitlines() if f"stablehlo.{op} " in line]
  return {re.sub(r"tensor<(?:\d+x)*(\w+)>", r"\1", line.rsplit(" : ", 1)[1]) for line in lines}


@pytest.mark.parametrize(
  "model", ["qwen3-tiny", *(pytest.param(m, marks=pytest.mark.slow) for m in ("llama-tiny", "gemma3-tiny"))]
)
def test_mixed_precision_trains_float32_weights_with_bfloat16_matmuls(model):
  """weight_dtype=float32 with dtype=bfloat16 is MaxText's mixed precision. A training step (the loss's
  scoring through SharedPrefix, the run's AdamW) keeps the weights, their gradient and AdamW's moments
  in float32 and moves the weights; every matmul of the loss's forward pass takes bfloat16 operands
  (the output layer's giving float32 logits), while the norms (rsqrt) and the softmaxes (exp, log)
  compute in float32. Its per-token log-probs are the float32 model's within a few bfloat16 epsilons
  relative to the log-prob, and its loss (their mean) within one."""
  from maxtext.integration.tunix import cluster, scoring
  from maxtext.models.shared_prefix import SharedPrefix
  from maxtext.utils.steps import Steps

  rng = np.random.default_rng(0)
  prompt = jnp.asarray(np.repeat(rng.integers(2, 512, (2, 12)), 4, axis=0), jnp.int32)
  completion = jnp.asarray(rng.integers(2, 512, (8, 16)), jnp.int32)

  def loss(m):
    logps = scoring.completion_logps(SharedPrefix(m, 12, 4), prompt, completion, 0, 1, 1.0)[0]
    return -logps.mean(), logps

  results = {}
  for dtype in ("float32", "bfloat16"):
    cfg, mesh, m = _model(f"model_name={model}", "vocab_size=512", f"dtype={dtype}", "warmup_steps_fraction=0")
    assert cfg.model.weight_dtype == "float32"
    with jax.set_mesh(mesh):
      optimizer = nnx.Optimizer(m, cluster.optimizer(cfg.train, Steps.of(cfg.train, cfg.algorithm)), wrt=nnx.Param)
      before = [np.asarray(w) for w in jax.tree.leaves(nnx.state(m, nnx.Param))]
      (value, logps), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(m)
      optimizer.update(m, grads)
    after = jax.tree.leaves(nnx.state(m, nnx.Param))
    moments = [x for x in jax.tree.leaves(nnx.state(optimizer.opt_state)) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert {x.dtype for x in (*after, *jax.tree.leaves(grads), *moments)} == {jnp.dtype(jnp.float32)}
    assert len(moments) >= 2 * len(after)
    assert all(not np.array_equal(w, b) for w, b in zip(after, before) if w.ndim >= 2)
    results[dtype] = float(value), np.asarray(logps)
    graphdef, state = nnx.split(m)
    forward = jax.jit(lambda s, graphdef=graphdef: loss(nnx.merge(graphdef, s))[0]).lower(state)
    compute = "bf16" if dtype == "bfloat16" else "f32"
    assert _op_types(forward, "dot_general") == {f"({compute}, {compute}) -> {t}" for t in {compute, "f32"}}
    assert _op_types(forward, "rsqrt") == _op_types(forward, "log") == {"f32"}
    assert "f32" in _op_types(forward, "exponential")  # the softmaxes' (silu's is in dtype)
  eps = float(jnp.finfo(jnp.bfloat16).eps)
  (want_loss, want), (got_loss, got) = results["float32"], results["bfloat16"]
  np.testing.assert_array_less(np.abs(got - want), 4 * eps * np.abs(want))
  assert abs(got_loss - want_loss) < eps * abs(want_loss)
