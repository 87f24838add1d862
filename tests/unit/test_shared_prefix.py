"""Scoring each GRPO group's prompt once (models/shared_prefix.py; both learners' loss and the KL
reference): the same logits, loss and gradients as Tunix's loss on whole sequences, for a fraction of
the work."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl import common
from tunix.rl.grpo import grpo_learner
from tunix.rl.inference import inference_worker

from maxtext.integration.tunix import algorithm, cluster, losses, prefix_sharing
from maxtext.models import builder, load
from maxtext.models.shared_prefix import SharedPrefix
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

GROUP, PROMPT, COMPLETION, PAD, EOS = 4, 24, 8, 0, 1


def _example(seed=0, prompts=2):
  """prompts x GROUP samples: left-padded prompts repeated GROUP times, right-padded completions."""
  rng = np.random.default_rng(seed)
  prompt = rng.integers(2, 500, (prompts, PROMPT))
  prompt[0, :5] = PAD
  prompt_ids = np.repeat(prompt, GROUP, axis=0)
  completion_ids = rng.integers(2, 500, (prompts * GROUP, COMPLETION))
  completion_ids[1, 3:] = PAD
  completion_ids[6, 6:] = PAD
  return grpo_learner.TrainExample(
    prompt_ids=jnp.asarray(prompt_ids, jnp.int32),
    prompt_mask=jnp.asarray(prompt_ids != PAD),
    completion_ids=jnp.asarray(completion_ids, jnp.int32),
    completion_mask=jnp.asarray(completion_ids != PAD),
    advantages=jnp.asarray(rng.normal(size=prompts * GROUP), jnp.float32),
    ref_per_token_logps=None,
    old_per_token_logps=None,
  )


def _model(*overrides):
  cfg = make_config(*overrides)
  return cfg, load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])


def _loss(cfg, shared: bool):
  config = algorithm.grpo_config(cfg.algorithm, cfg.sampling)
  config.temperature = 0.9
  ppo_clip = lambda m, ex, algo: losses.POLICY_LOSSES["ppo_clip"](m, ex, algo, pad_id=PAD, eos_id=EOS)
  loss = prefix_sharing.SharedPrefixLoss(ppo_clip, GROUP) if shared else ppo_clip
  return lambda model, example: loss(model, example, config)[0]


@pytest.mark.parametrize(
  "overrides",
  [
    ("model_name=qwen3-tiny",),
    pytest.param(("model_name=llama-tiny", "remat_policy=full"), marks=pytest.mark.slow),
    pytest.param(("model_name=qwen3-tiny", "lora_rank=4", "lora_alpha=8"), marks=pytest.mark.slow),
    pytest.param(("model_name=llama-tiny", "scan_layers=false"), marks=pytest.mark.slow),  # others scanned
    pytest.param(("model_name=gemma3-tiny",), marks=pytest.mark.slow),
  ],
)
def test_same_logits_loss_and_gradients_as_whole_sequences(overrides):
  cfg, model = _model(*overrides, f"rl.num_generations={GROUP}")
  if cfg.model.lora_rank:  # adapters that start at zero would leave their B gradient-free
    builder.set_adapters(
      model,
      {n: np.random.default_rng(1).normal(0, 0.1, a.shape).astype(a.dtype) for n, a in builder.adapters(model).items()},
      "test",
    )
  example = _example()
  # The tokens, positions and causal padding mask Tunix's loss hands the model.
  tokens, positions, attention, _ = common.process_ids(example.prompt_ids, example.completion_ids, PAD, EOS)
  whole, _ = model(tokens, positions, None, attention)
  shared, _ = SharedPrefix(model, PROMPT, GROUP)(tokens, positions, None, attention)
  assert shared.shape == (len(tokens), COMPLETION + 1, cfg.model.vocab_size)
  np.testing.assert_allclose(shared, whole[:, PROMPT - 1 :], rtol=1e-5, atol=1e-5)

  wrt = nnx.LoRAParam if cfg.model.lora_rank else nnx.Param
  results = [nnx.value_and_grad(_loss(cfg, s), argnums=nnx.DiffState(0, wrt))(model, example) for s in (False, True)]
  (want, want_grads), (got, got_grads) = results
  assert abs(float(got) - float(want)) < 1e-6 * max(1.0, abs(float(want))) and float(want) != 0
  largest = max(float(jnp.abs(w).max()) for w in jax.tree.leaves(want_grads))
  assert largest > 1e-3
  for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * largest)


def test_reference_log_probs_with_prompts_padded_past_the_shared_length():
  """The KL reference wraps the model in SharedPrefix over max_prompt_length tokens; a batch whose
  prompts are padded wider (the rollout pads to at least max_prompt_length) scores the same, through
  Tunix's whole logits and through the cluster's reference scoring as build_cluster leaves it (the
  output layer a vocabulary slice at a time, a micro-batch at a time)."""
  cfg, model = _model(
    "model_name=qwen3-tiny", f"rl.num_generations={GROUP}", "rl.grpo_beta=0.04", f"max_prompt_length={PROMPT - 6}"
  )
  reference = cluster.reference_model(cfg.algorithm, model, cfg.sampling.max_prompt_length)
  assert isinstance(reference, SharedPrefix) and reference.prompt_length == PROMPT - 6
  example = _example(seed=3)
  logps = [
    common.compute_per_token_logps(*nnx.split(m), example.prompt_ids, example.completion_ids, PAD, EOS, temperature=0.9)
    for m in (model, reference)
  ]
  scored = types.SimpleNamespace(
    inference_worker=inference_worker.InferenceWorker({"reference": reference}),
    get_rollout_config=lambda mode: types.SimpleNamespace(temperature=0.9),
  )
  mesh = create_meshes(cfg.mesh, agentic=False)[0]
  for micro_batch_size in (None, GROUP):
    logps.append(
      cluster.reference_logps(scored, mesh, example.prompt_ids, example.completion_ids, PAD, EOS, micro_batch_size)
    )
  for got in logps[1:]:
    np.testing.assert_allclose(got, logps[0], rtol=1e-5, atol=1e-5)


def test_a_fraction_of_the_work():
  """The compiled loss and gradient take fewer FLOPs in proportion to the tokens the decoder's layers
  see: 2 x 24 prompt tokens and 8 x 8 completion tokens instead of 8 x 32, 0.44 of them (the output
  layer runs on the completion positions either way, so a small vocabulary keeps it from dominating)."""
  cfg, model = _model("model_name=qwen3-tiny", "vocab_size=512", "num_decoder_layers=4", f"rl.num_generations={GROUP}")
  graphdef, state = nnx.split(model)
  example = _example()
  flops = {}
  for shared in (False, True):
    loss = _loss(cfg, shared)
    step = jax.jit(lambda s, ex, loss=loss: nnx.grad(loss)(nnx.merge(graphdef, s), ex))
    flops[shared] = step.lower(state, example).compile().cost_analysis()["flops"]
  assert flops[True] < 0.6 * flops[False], flops


def test_check_groups_refuses_a_batch_whose_prompts_do_not_repeat_in_runs():
  prompts = np.arange(4 * PROMPT).reshape(4, PROMPT)
  prefix_sharing.check_groups(np.repeat(prompts, GROUP, axis=0), GROUP)
  with pytest.raises(RuntimeError, match="each prompt 4 times in a row"):
    prefix_sharing.check_groups(np.tile(prompts, (GROUP, 1)), GROUP)
  with pytest.raises(RuntimeError, match="6 samples"):
    prefix_sharing.check_groups(np.repeat(prompts, GROUP, axis=0)[:6], GROUP)


def test_refuses_a_cache_and_rows_that_are_not_whole_groups():
  _, model = _model("model_name=qwen3-tiny")
  tokens = jnp.zeros((6, PROMPT + COMPLETION), jnp.int32)
  attention = jnp.ones((6, PROMPT + COMPLETION, PROMPT + COMPLETION), bool)
  with pytest.raises(ValueError, match="does not hold groups of 4"):
    SharedPrefix(model, PROMPT, GROUP)(tokens, tokens, None, attention)
  with pytest.raises(ValueError, match="no KV cache"):
    SharedPrefix(model, PROMPT, GROUP)(tokens, tokens, {}, attention)


@pytest.mark.parametrize("scan", ["true", "false"])
def test_remat_takes_effect_on_the_scoring_with_a_shared_prefix(scan):
  """remat_policy=full rematerializes the layers of the loss's scoring, which runs the group's prompt
  through a KV cache: the gradient's temporaries (XLA's memory analysis) shrink as they do when
  whole sequences are scored. (Once a call with a cache was taken for a sampler's and never
  rematerialized: remat_policy=full left the loss's temporaries as they were.)"""
  from maxtext.integration.tunix import scoring

  prompt, completion = jnp.ones((8, 96), jnp.int32), jnp.ones((8, 128), jnp.int32)
  temporaries = {}
  for remat in ("none", "full"):
    cfg = make_config(*_llama(scan, remat))
    mesh = create_meshes(cfg.mesh, agentic=False)[0]
    graphdef, state = nnx.split(load.load_model(cfg.model, mesh))
    for shared in (True, False):

      def loss(s, shared=shared, graphdef=graphdef):
        model = nnx.merge(graphdef, s)
        model = SharedPrefix(model, 96, 4) if shared else model
        return -scoring.completion_logps(model, prompt, completion, 0, 1, 1.0)[0].mean()

      with jax.set_mesh(mesh):
        compiled = jax.jit(jax.grad(loss)).lower(state).compile()
      temporaries[remat, shared] = compiled.memory_analysis().temp_size_in_bytes
  for shared in (True, False):
    assert temporaries["full", shared] < 0.5 * temporaries["none", shared], temporaries
  # No more than whole sequences need with remat (a scan carrying the whole cache through its
  # rematerialized steps kept it once per layer: 1.8x).
  assert temporaries["full", True] < 1.1 * temporaries["full", False], temporaries


def _llama(scan, remat):
  """A llama-tiny whose activations dominate the gradient's temporaries: 12 layers scanned (the carried
  cache's cost grows with the layers), 4 unrolled (each its own program code)."""
  return (
    "model_name=llama-tiny",
    "vocab_size=4096",
    "emb_dim=256",
    "mlp_dim=1024",
    f"num_decoder_layers={12 if scan == 'true' else 4}",
    f"scan_layers={scan}",
    f"remat_policy={remat}",
  )
