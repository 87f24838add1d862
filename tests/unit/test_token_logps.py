"""Token log-probs and entropies from hidden states a vocabulary slice at a time (models/
token_logps.py) against PyTorch autograd through whole logits, and the memory they are for."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from maxtext.models import token_logps as tl

B, T, D, V = 3, 7, 16, 1000


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  hidden = rng.normal(size=(B, T, D)).astype(np.float32)
  head = (0.5 * rng.normal(size=(D, V))).astype(np.float32)
  tokens = rng.integers(0, V, (B, T))
  weights = rng.normal(size=(2, B, T)).astype(np.float32)  # cotangents of the log-probs and the entropies
  return hidden, head, tokens, weights


def _torch(hidden, head, tokens, weights, temperature):
  """Values and gradients of sum(w0 * logp + w1 * entropy) through whole logits."""
  h = torch.tensor(hidden, dtype=torch.float64, requires_grad=True)
  w = torch.tensor(head, dtype=torch.float64, requires_grad=True)
  log_p = torch.log_softmax(h @ w / temperature, dim=-1)
  logps = log_p.gather(-1, torch.tensor(tokens)[..., None])[..., 0]
  entropy = -(log_p.exp() * log_p).sum(-1)
  w0, w1 = (torch.tensor(x, dtype=torch.float64) for x in weights)
  (w0 * logps + w1 * entropy).sum().backward()
  return [x.detach().numpy() for x in (logps, entropy, h.grad, w.grad)]


@pytest.mark.parametrize("slice_columns", [V, 300, 128])  # one slice; slices with a padded last one
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_whole_logits(monkeypatch, slice_columns, temperature):
  """One slice (its logits kept for the backward pass) or several (recomputed)."""
  hidden, head, tokens, weights = _inputs()
  monkeypatch.setattr(tl, "_MIN_SLICE", 1)
  monkeypatch.setattr(tl, "CHUNK_BYTES", 4 * B * T * slice_columns)
  assert tl.vocab_slice(B * T, V) == slice_columns

  def objective(h, w):
    logps, entropy = tl.token_logps(h, w, jnp.asarray(tokens), temperature)
    return jnp.sum(weights[0] * logps + weights[1] * entropy), (logps, entropy)

  (_, (logps, entropy)), (h_grad, w_grad) = jax.value_and_grad(objective, (0, 1), has_aux=True)(hidden, head)
  want = _torch(hidden, head, tokens, weights, temperature)
  for got, expected in zip((logps, entropy, h_grad, w_grad), want):
    np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-4, atol=2e-5 * max(1.0, np.abs(expected).max()))


def test_the_training_step_keeps_no_whole_logits(monkeypatch):
  """The compiled gradient's temporaries stay near one vocabulary slice's logits, where whole logits
  keep several tokens x vocab arrays."""
  monkeypatch.setattr(tl, "CHUNK_BYTES", 16 * 2**20)
  tokens_n, vocab, dim = 512, 32768, 64
  rng = np.random.default_rng(1)
  hidden = jnp.asarray(rng.normal(size=(4, tokens_n // 4, dim)), jnp.float32)
  head = jnp.asarray(0.1 * rng.normal(size=(dim, vocab)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, vocab, (4, tokens_n // 4)))

  def whole(h, w):
    log_p = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, w), -1)
    return jnp.take_along_axis(log_p, tokens[..., None], -1).sum()

  def sliced(h, w):
    return tl.token_logps(h, w, tokens, 1.0)[0].sum()

  temps = {
    f.__name__: jax.jit(jax.grad(f, (0, 1))).lower(hidden, head).compile().memory_analysis().temp_size_in_bytes
    for f in (whole, sliced)
  }
  logits = tokens_n * vocab * 4
  assert temps["whole"] >= 2 * logits, temps
  slice_logits = tokens_n * tl.vocab_slice(tokens_n, vocab) * 4
  assert slice_logits < logits / 2
  assert temps["sliced"] <= 4 * slice_logits + 2 * vocab * dim * 4, temps


def _logits_sized_float32(hlo: str, tokens: int, vocab: int) -> list[str]:
  """The float32 arrays in a compiled program's HLO with a vocabulary-wide axis and at least tokens x
  vocab values."""
  shapes = {tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\bf32\[([\d,]*)\]", hlo)}
  return [f"f32{list(s)}" for s in sorted(shapes) if vocab in s and math.prod(s) >= tokens * vocab]


def test_no_whole_float32_logits_in_the_loss_gradient_or_the_reference_scoring(monkeypatch):
  """Compiled, not run, for a model whose vocabulary spans 8 slices: the policy loss's gradient (through
  SharedPrefix, as the trainer runs it) and the reference's log-probs (rollout.per_token_logps, which
  the cluster's get_ref_per_token_logps runs as build_cluster leaves it) hold no float32 array of the scored tokens x
  vocabulary, while Tunix's own reference scoring, from whole logits, does (so the check sees them).
  The model's width is below the token count, so its [vocab, width] gradients are smaller."""
  from flax import nnx
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.inference import inference_worker

  from maxtext.integration.tunix import algorithm, cluster, losses, prefix_sharing, rollout
  from maxtext.models import load
  from maxtext.utils.mesh import create_meshes
  from tests.conftest import make_config

  monkeypatch.setattr(tl, "CHUNK_BYTES", 0)  # the narrowest slices
  group, prompts, prompt, completion, vocab = 4, 2, 12, 24, 8192
  cfg = make_config(
    "model_name=qwen3-tiny",
    f"vocab_size={vocab}",
    f"rl.num_generations={group}",
    "rl.grpo_beta=0.04",
    f"max_prompt_length={prompt}",
  )
  tokens = prompts * group * completion
  assert tl.vocab_slice(tokens, vocab) == vocab // 8 and cfg.model.emb_dim < tokens
  model = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  rows = prompts * group
  rng = np.random.default_rng(0)
  prompt_ids = jnp.asarray(np.repeat(rng.integers(2, vocab, (prompts, prompt)), group, axis=0), jnp.int32)
  completion_ids = jnp.asarray(rng.integers(2, vocab, (rows, completion)), jnp.int32)
  example = grpo_learner.TrainExample(
    prompt_ids=prompt_ids,
    prompt_mask=jnp.ones(prompt_ids.shape, bool),
    completion_ids=completion_ids,
    completion_mask=jnp.ones(completion_ids.shape, bool),
    advantages=jnp.asarray(rng.normal(size=rows), jnp.float32),
    ref_per_token_logps=jnp.zeros(completion_ids.shape),
    old_per_token_logps=None,
  )
  config = algorithm.grpo_config(cfg.algorithm, cfg.sampling)
  config.temperature = 0.9
  ppo_clip = lambda m, ex, algo: losses.POLICY_LOSSES["ppo_clip"](m, ex, algo, pad_id=0, eos_id=1)
  loss = prefix_sharing.SharedPrefixLoss(ppo_clip, group)
  graphdef, state = nnx.split(model)

  def loss_gradient(state):
    return nnx.grad(lambda m: loss(m, example, config)[0])(nnx.merge(graphdef, state))

  def reference_scoring(state, ours: bool):
    reference = cluster.reference_model(cfg.algorithm, nnx.merge(graphdef, state), prompt)
    if ours:
      return rollout.per_token_logps(reference, prompt_ids, completion_ids, 0, 1, 0.9)
    worker = inference_worker.InferenceWorker({"reference": reference})
    return worker.get_ref_per_token_logps(prompt_ids, completion_ids, 0, 1, 0.9)

  programs = {
    "loss gradient": jax.jit(loss_gradient),
    "reference": jax.jit(reference_scoring, static_argnums=1),
  }
  found = {
    name: _logits_sized_float32(program.lower(state, *args).compile().as_text(), tokens, vocab)
    for name, program, args in (
      ("loss gradient", programs["loss gradient"], ()),
      ("reference", programs["reference"], (True,)),
      ("Tunix's reference", programs["reference"], (False,)),
    )
  }
  assert found["Tunix's reference"], found
  assert not found["loss gradient"] and not found["reference"], found
