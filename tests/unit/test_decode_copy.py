"""The batcher decodes with unrolled layers (decoder.DecodeCopy of a scanned model; rollout_layers):
its compiled decode step copies no layer's weights or KV cache, where a step on the stacked arrays
copies each of them per layer (counted in the optimized HLO), and it samples the tokens and log-probs
the stacked layout samples; rollout_layers takes effect as it says."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from maxtext.inference import kv_programs as kv
from maxtext.inference import program_census
from maxtext.inference.continuous_batching import ContinuousBatcher
from maxtext.models import decoder, load
from maxtext.models.decoder import DecodeCopy
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

ROWS, SIZE, CHUNK = 4, 48, 4


@pytest.fixture(scope="module")
def models():
  """{scan_layers: qwen3-tiny decoder}, both from the same seed."""
  out = {}
  for scan in (True, False):
    cfg = make_config("model_name=qwen3-tiny", "vocab_size=1024", f"scan_layers={str(scan).lower()}")
    out[scan] = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  return out


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("dtype", [None, jnp.bfloat16])
def test_the_batchers_decode_step_copies_no_layer_weights_or_cache(models, scan, dtype):
  batcher = ContinuousBatcher(models[scan], SIZE, ROWS, matmul_dtype=dtype, steps_per_dispatch=CHUNK)
  assert batcher.decode_layer_copies(ROWS) == {}
  batcher.close()


@pytest.mark.parametrize("dtype", [None, jnp.bfloat16])
def test_a_batcher_on_the_stacked_layers_copies_each_layer_weight_and_its_cache(models, dtype):
  """The census finds the copies where they are: the scan's body slices each of the 7 weight matrices
  and the keys and values out of the stacked arrays (once in the loop body, run once per layer)."""
  assert len(program_census.layer_buffers(models[True].config, ROWS, SIZE)) == 9
  batcher = ContinuousBatcher(
    models[True], SIZE, ROWS, matmul_dtype=dtype, steps_per_dispatch=CHUNK, unrolled_layers=False
  )
  assert batcher.decode_layer_copies(ROWS) == {"dynamic-slice": 9}
  assert set(batcher._cache) == {"layers"}  # the stacked cache
  batcher.close()


def test_the_copy_holds_each_layers_slice_and_shares_the_rest(models):
  scanned, unrolled = models[True], models[False]
  copy = DecodeCopy(scanned)
  state = copy.state()
  want = nnx.state(unrolled)
  same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), state, want)
  assert all(jax.tree.leaves(same))
  assert state["embed"][...] is nnx.state(scanned)["embed"][...]  # not copied
  layers = sum(x.nbytes for x in jax.tree.leaves(nnx.state(scanned)["layers"]))
  assert copy.added_bytes == layers
  assert copy.nbytes == sum(x.nbytes for x in jax.tree.leaves(nnx.state(scanned)))


def _sample(model, state, cache, prompts, n):
  """Prefills equal-length prompts [ROWS, T] into `cache` and samples n tokens per row (temperature
  0.8, each row its own key) in one decode program: (tokens, log-probs)."""
  t = prompts.shape[1]
  starts = jnp.zeros((ROWS,), jnp.int32)
  cache = kv._extend(model, state, cache, prompts[:, :-1], starts)
  keys = jax.random.key_data(jax.random.split(jax.random.PRNGKey(5), ROWS)).astype(jnp.uint32)
  tokens, logps, made, _, _ = kv._decode(
    model,
    state,
    cache,
    prompts[:, -1],
    jnp.full((ROWS,), t - 1, jnp.int32),  # positions
    jnp.zeros((ROWS,), jnp.int32),  # steps
    keys,
    jnp.tile(jnp.array([[0.8, 1.0]]), (ROWS, 1)),  # temperature, top_p
    jnp.full((ROWS,), 1024, jnp.int32),  # top_k: off
    None,
    jnp.full((ROWS,), n, jnp.int32),  # limits
    jnp.full((ROWS, 1), -1, jnp.int32),  # no EOS
    jnp.array([n, 0], jnp.int32),
    n,
  )
  assert np.asarray(made).tolist() == [n] * ROWS
  return np.asarray(tokens), np.asarray(logps)


def test_the_copy_samples_the_tokens_and_log_probs_of_the_stacked_layout(models):
  scanned, unrolled = models[True], models[False]
  prompts = jax.random.randint(jax.random.PRNGKey(2), (ROWS, 9), 1, 1024)
  graphdef, state = nnx.split(scanned)
  stacked = _sample(kv._StaticGraph(graphdef), state, scanned.init_cache(ROWS, SIZE, jnp.float32), prompts, 12)
  copy = DecodeCopy(scanned)
  got = _sample(kv._StaticGraph(copy.graphdef), copy.state(), copy.init_cache(ROWS, SIZE, jnp.float32), prompts, 12)
  graphdef, state = nnx.split(unrolled)
  plain = _sample(kv._StaticGraph(graphdef), state, unrolled.init_cache(ROWS, SIZE, jnp.float32), prompts, 12)
  # Bit for bit what an unrolled decoder samples, and (on XLA:CPU) what the stacked layout samples.
  for want in (plain, stacked):
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
  assert len(set(got[0].ravel().tolist())) > 8  # sampled, not one repeated token


@pytest.fixture(scope="module")
def bf16_model():
  """A scanned qwen3-tiny decoder with bfloat16 weights, activations and KV cache, its output layer
  a weight of its own (XLA:CPU widens a tied embedding's transpose for the output layer's product,
  which is a matmul, not what the census below is about)."""
  args = ("dtype=bfloat16", "weight_dtype=bfloat16", "logits_via_embedding=false")
  cfg = make_config("model_name=qwen3-tiny", "vocab_size=1024", *args)
  return load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])


@pytest.fixture
def as_floats(monkeypatch):
  """Calling it makes the decoder what it was: 16-bit floats gathered, sliced and scattered as floats,
  not as bits. The programs traced either way are dropped when it switches and at the test's end."""

  def switch():
    monkeypatch.setattr(decoder, "_bits", lambda x: x)
    jax.clear_caches()

  yield switch
  jax.clear_caches()


@pytest.mark.parametrize("weights", ["bfloat16", "float32 with rollout_dtype=bfloat16"])
def test_a_stacked_decode_step_widens_no_whole_16_bit_array_to_float32(models, bf16_model, weights, as_floats):
  """XLA:CPU gathers, slices and scatters 16-bit floats by first converting the whole operand to
  float32: the embedding and every stacked weight once per decode program, the stacked KV cache at
  each layer of each step (a bfloat16 model's decode step took 5.9x as long, benchmarks/RESULTS.md). The decoder
  moves their bits instead (decoder._bits), so the program converts none of them whole."""
  model = bf16_model if weights == "bfloat16" else models[True]
  matmul_dtype = None if weights == "bfloat16" else jnp.bfloat16
  cache = model.init_cache(ROWS, SIZE, model.config.dtype)["layers"]
  whole = [x for x in jax.tree.leaves(nnx.state(model)) if x.ndim >= 2] + [cache["k"], cache["v"]]

  def conversions():
    batcher = ContinuousBatcher(
      model, SIZE, ROWS, matmul_dtype=matmul_dtype, steps_per_dispatch=CHUNK, unrolled_layers=False
    )
    found = program_census.conversions(batcher.decode_program(ROWS), whole)
    batcher.close()
    return found

  assert conversions() == 0
  as_floats()
  # As floats: the 7 stacked weight matrices and the embedding; a bfloat16 model's cache as well,
  # wherever the scan reads or writes its keys and values.
  assert conversions() == 8 if weights != "bfloat16" else conversions() > 8


def test_bfloat16_layers_moved_as_bits_sample_what_they_sampled_as_floats(bf16_model, as_floats):
  """The bits are the values: the same tokens and log-probs, bit for bit, as the decoder sampled when
  it gathered, sliced and scattered the bfloat16 arrays as floats."""
  prompts = jax.random.randint(jax.random.PRNGKey(2), (ROWS, 9), 1, 1024)
  graphdef, state = nnx.split(bf16_model)
  sample = lambda: _sample(
    kv._StaticGraph(graphdef), state, bf16_model.init_cache(ROWS, SIZE, jnp.bfloat16), prompts, 12
  )
  got = sample()
  as_floats()
  want = sample()
  assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
  assert len(set(got[0].ravel().tolist())) > 8  # sampled, not one repeated token


@pytest.mark.parametrize(
  "setting, backend, unrolled",
  [
    ("auto", "cpu", False),
    ("auto", "gpu", True),
    ("auto", "tpu", True),
    ("unrolled", "cpu", True),
    ("stacked", "gpu", False),
  ],
)
def test_rollout_layers_resolves_auto_by_backend(monkeypatch, setting, backend, unrolled):
  from maxtext.integration.tunix import rollout_setup

  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  sampling = make_config(f"rollout_layers={setting}").sampling
  assert rollout_setup.rollout_engine(sampling).keywords["unrolled_layers"] is unrolled


def test_rollout_layers_where_it_cannot_apply_is_refused_naming_the_key():
  from maxtext.utils import errors

  for args in (("scan_layers=false",), ("rollout_engine=vanilla",)):
    with pytest.raises(errors.ConfigError, match="rollout_layers"):
      make_config("model_name=qwen3-tiny", "rollout_layers=unrolled", *args)
