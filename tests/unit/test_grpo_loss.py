"""The GRPO loss our configs build (losses.py's ppo_clip) on a categorical toy policy:
the KL estimator chosen by rl.kl_loss_mode and its gradient, and the upper clip of rl.epsilon_high."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl.grpo import grpo_learner

from maxtext.integration.tunix import algorithm, losses
from tests.conftest import make_config

VOCAB, PAD, EOS = 6, 0, 1


class Categorical(nnx.Module):
  """A policy whose next-token logits are one learnable vector, whatever the context."""

  def __init__(self, logits):
    self.logits = nnx.Param(jnp.asarray(logits, jnp.float32))

  def __call__(self, tokens, positions, cache, attention_mask):  # as Tunix's losses call a model
    return jnp.broadcast_to(self.logits, (*tokens.shape, VOCAB)), cache

  def hidden_states(self, tokens, positions, cache, attention_mask):  # as ours do (scoring.py)
    return jnp.ones((*tokens.shape, 1)), cache

  def output_head(self):
    return self.logits[...][None, :]

  @property
  def config(self):  # as ours have: the precision scoring multiplies hidden states by the head at
    return types.SimpleNamespace(precision=jax.lax.Precision.DEFAULT)


def _example(completions, ref_logps=None, old_logps=None, advantages=None):
  n = len(completions)
  completion_ids = jnp.asarray(completions, jnp.int32).reshape(n, 1)
  return grpo_learner.TrainExample(
    prompt_ids=jnp.full((n, 1), 2, jnp.int32),
    prompt_mask=jnp.ones((n, 1), bool),
    completion_ids=completion_ids,
    completion_mask=jnp.ones((n, 1), bool),
    advantages=jnp.zeros(n) if advantages is None else jnp.asarray(advantages, jnp.float32),
    ref_per_token_logps=ref_logps,
    old_per_token_logps=old_logps,
  )


def _loss_and_grad(cfg, model, example):
  config = algorithm.grpo_config(cfg.algorithm, cfg.sampling)
  config.temperature = 1.0  # what the learner sets from the training rollout config

  def loss(m):
    return losses.POLICY_LOSSES["ppo_clip"](m, example, config, pad_id=PAD, eos_id=EOS)[0]

  value, grads = nnx.value_and_grad(loss)(model)
  return float(value), np.asarray(grads.logits.value if hasattr(grads.logits, "value") else grads.logits)


def _on_policy_kl_gradient(mode: str, policy_logits, ref_logits, samples=20000):
  """d(beta * KL term)/d(logits), completions sampled from the policy (the on-policy expectation)."""
  policy = jax.nn.softmax(jnp.asarray(policy_logits))
  tokens = np.asarray(jax.random.choice(jax.random.PRNGKey(0), VOCAB, (samples,), p=policy))
  ref_logps = jax.nn.log_softmax(jnp.asarray(ref_logits))[tokens].reshape(-1, 1)
  cfg = make_config(f"rl.kl_loss_mode={mode}", "rl.grpo_beta=1.0", "rl.loss_agg_mode=token-mean")
  return _loss_and_grad(cfg, Categorical(policy_logits), _example(tokens, ref_logps=ref_logps))[1]


POLICY = np.array([0.0, 0.0, 1.5, 0.2, -0.5, 0.0])  # moved away from the reference
REFERENCE = np.zeros(VOCAB)


def test_default_kl_estimator_pulls_the_policy_back_to_the_reference():
  """low_var_kl (k3 = exp(ref - logp) - (ref - logp) - 1) has the on-policy expected gradient
  d/dlogits KL(ref || policy) = policy - ref (by hand: dk3/dlogp = 1 - ref/policy, weighted by the
  policy); a gradient step along it lowers the true KL."""
  assert make_config().algorithm.kl_loss_mode == "low_var_kl"
  grad = _on_policy_kl_gradient("low_var_kl", POLICY, REFERENCE)
  policy, ref = jax.nn.softmax(POLICY), jax.nn.softmax(REFERENCE)
  np.testing.assert_allclose(grad, policy - ref, atol=0.02)
  assert grad[2] > 0.2  # the token the policy over-weights is pushed down, hard

  def kl(logits):
    p = jax.nn.softmax(logits)
    return float(jnp.sum(p * (jnp.log(p) - jnp.log(ref))))

  assert kl(POLICY - 1.0 * grad) < 0.6 * kl(POLICY)


def test_k1_kl_estimator_has_no_expected_gradient():
  """kl (k1 = logp - ref) as a loss: its on-policy gradient is E[grad logp] = 0, so grpo_beta would
  not pull the policy anywhere; the default is therefore low_var_kl."""
  grad = _on_policy_kl_gradient("kl", POLICY, REFERENCE)
  np.testing.assert_allclose(grad, np.zeros(VOCAB), atol=0.02)
  assert np.abs(_on_policy_kl_gradient("low_var_kl", POLICY, REFERENCE)).max() > 10 * np.abs(grad).max()


def test_mse_kl_estimator_by_hand():
  """mse_kl (k2 = (logp - ref)^2 / 2) on one completion: value and gradient by hand."""
  cfg = make_config("rl.kl_loss_mode=mse_kl", "rl.grpo_beta=0.5", "rl.loss_agg_mode=token-mean")
  logp = jax.nn.log_softmax(jnp.asarray(POLICY))
  ref = jnp.log(jnp.full((1, 1), 0.1))
  value, grad = _loss_and_grad(cfg, Categorical(POLICY), _example([2], ref_logps=ref))
  d = float(logp[2] - ref[0, 0])
  assert value == pytest.approx(0.5 * 0.5 * d * d, rel=1e-5)
  onehot = np.eye(VOCAB)[2]
  np.testing.assert_allclose(grad, 0.5 * d * (onehot - np.asarray(jax.nn.softmax(POLICY))), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("epsilon_high, expected", [(-1.0, 1.2), (0.28, 1.25)])
def test_standard_grpo_clips_the_ratio_above_at_epsilon_high(epsilon_high, expected):
  """A positive advantage with the ratio at 1.25: the loss is -clip(1.25, 1 - eps, 1 + eps_high),
  -1.2 with grpo_epsilon=0.2 alone and -1.25 with rl.epsilon_high=0.28 (DAPO's clip-higher)."""
  cfg = make_config("rl.grpo_beta=0", f"rl.epsilon_high={epsilon_high}", "rl.loss_agg_mode=token-mean")
  logp = float(jax.nn.log_softmax(jnp.asarray(POLICY))[3])
  old = jnp.full((1, 1), logp - np.log(1.25))
  value, _ = _loss_and_grad(cfg, Categorical(POLICY), _example([3], old_logps=old, advantages=[1.0]))
  assert value == pytest.approx(-expected, rel=1e-5)
