"""The advantage estimators and policy losses of losses.py against hand computations, on the
categorical toy policy of test_grpo_loss; config refusals name the key, the value and the choices."""

import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl import algo_core, common, function_registry

from maxtext.configs import sections
from maxtext.integration.tunix import algorithm, losses
from maxtext.utils.errors import ConfigError
from tests.conftest import make_config
from tests.unit.test_grpo_loss import EOS, PAD, Categorical, _example

REWARDS = np.array([1, 0, 0, 1, 2, 2, 2, 5], np.float32)  # two groups of 4


@pytest.mark.parametrize(
  "name, expected",
  [
    # (r - group mean) / (group std with ddof 1 + 1e-6): group 1 mean 0.5, std sqrt(1/3); group 2 mean 2.75, std 1.5
    ("grpo", [0.866025, -0.866025, -0.866025, 0.866025, -0.5, -0.5, -0.5, 1.5]),
    ("dr_grpo", [0.5, -0.5, -0.5, 0.5, -0.75, -0.75, -0.75, 2.25]),
    # r - mean of the group's other three: 1 - 1/3, 0 - 2/3; 2 - 3, 5 - 2
    ("rloo", [2 / 3, -2 / 3, -2 / 3, 2 / 3, -1.0, -1.0, -1.0, 3.0]),
    # (r - 13/8) / 1.494782 (the batch's std, ddof 0)
    ("reinforce_pp", [-0.418121, -1.087115, -1.087115, -0.418121, 0.250873, 0.250873, 0.250873, 2.257860]),
  ],
)
def test_advantages_of_a_small_reward_table(name, expected):
  losses.register()
  estimator = function_registry.get_advantage_estimator(name)
  np.testing.assert_allclose(np.asarray(estimator(rewards=REWARDS, num_generations=4)), expected, atol=1e-5)


LOGITS = np.array([0.0, 0.0, 1.0, 0.3, -0.4, 0.2])


def _grad(cfg, old_shift: float, advantage: float, loss_name: str) -> np.ndarray:
  """d loss / d logits for one sampled token (2) whose old log-prob is the current one minus
  old_shift (ratio exp(old_shift))."""
  model = Categorical(LOGITS)
  logp = float(jax.nn.log_softmax(jnp.asarray(LOGITS))[2])
  example = _example([2], old_logps=jnp.full((1, 1), logp - old_shift), advantages=[advantage])
  config = algorithm.grpo_config(cfg.algorithm, cfg.sampling)
  config.temperature = 1.0
  fn = function_registry.get_policy_loss_fn(loss_name)
  grads = nnx.grad(lambda m: fn(m, example, config, pad_id=PAD, eos_id=EOS)[0])(model)
  return np.asarray(grads.logits.value if hasattr(grads.logits, "value") else grads.logits)


def _dlogp() -> np.ndarray:
  """d log p(token 2) / d logits = onehot(2) - softmax."""
  return np.eye(len(LOGITS))[2] - np.asarray(jax.nn.softmax(jnp.asarray(LOGITS)))


@pytest.mark.parametrize("advantage", [1.5, -1.5])
def test_inside_the_clip_range_both_losses_are_the_policy_gradient(advantage):
  """At ratio 1 (on-policy), ppo_clip's and cispo's gradients are both -A * d log p: a descent step
  raises the sampled token's probability for A > 0 and lowers it for A < 0."""
  expected = -advantage * _dlogp()
  for name in ("ppo_clip", "cispo"):
    cfg = make_config(f"rl.policy_loss_fn={name}", "rl.grpo_beta=0")
    grad = _grad(cfg, 0.0, advantage, name)
    np.testing.assert_allclose(grad, expected, atol=1e-6, err_msg=name)
    moved = LOGITS - 0.1 * grad
    p_before, p_after = jax.nn.softmax(jnp.asarray(LOGITS))[2], jax.nn.softmax(jnp.asarray(moved))[2]
    assert (p_after > p_before) == (advantage > 0), name


def test_outside_the_clip_range_ppo_drops_the_token_and_cispo_truncates_its_weight():
  """Ratio 2 with A > 0 and epsilon_high 0.28: PPO's clipped term is constant, so the token gives no
  gradient; CISPO keeps it with the weight truncated to 1.28: -1.28 * A * d log p. Below the range
  (ratio 0.5, A > 0) PPO keeps the unclipped -A * r * d log p and CISPO -A * r * d log p too."""
  ppo = make_config("rl.policy_loss_fn=ppo_clip", "rl.grpo_beta=0", "rl.epsilon_high=0.28")
  cis = make_config("rl.policy_loss_fn=cispo", "rl.grpo_beta=0", "rl.epsilon_high=0.28")
  np.testing.assert_allclose(_grad(ppo, np.log(2.0), 1.0, "ppo_clip"), 0.0, atol=1e-7)
  np.testing.assert_allclose(_grad(cis, np.log(2.0), 1.0, "cispo"), -1.28 * _dlogp(), atol=1e-6)
  np.testing.assert_allclose(_grad(ppo, np.log(0.5), 1.0, "ppo_clip"), -0.5 * _dlogp(), atol=1e-6)
  np.testing.assert_allclose(_grad(cis, np.log(0.5), 1.0, "cispo"), -0.5 * _dlogp(), atol=1e-6)


def test_cispo_keeps_the_kl_penalty_and_the_diagnostics_tunix_logs():
  cfg = make_config("rl.policy_loss_fn=cispo", "rl.grpo_beta=0.5", "rl.kl_loss_mode=mse_kl")
  config = algorithm.grpo_config(cfg.algorithm, cfg.sampling)
  config.temperature = 1.0
  logp = float(jax.nn.log_softmax(jnp.asarray(LOGITS))[2])
  example = _example([2], ref_logps=jnp.full((1, 1), logp - 0.4), advantages=[0.0])
  loss, aux = losses.POLICY_LOSSES["cispo"](Categorical(LOGITS), example, config, pad_id=PAD, eos_id=EOS)
  np.testing.assert_allclose(float(loss), 0.5 * 0.4**2 / 2, rtol=1e-5)  # beta * (logp - ref)^2 / 2
  tunix_aux = algo_core.grpo_loss_fn(Categorical(LOGITS), example, config, pad_id=PAD, eos_id=EOS)[1]
  assert set(tunix_aux) <= set(aux)


@pytest.mark.parametrize("loss_algo", ["grpo", "gspo-token"])
@pytest.mark.parametrize("shift", [0.0, 0.1, 0.6, -0.6])
@pytest.mark.parametrize("epsilon_c", [0.0, 1.5])
def test_ppo_clip_is_tunixs_grpo_loss(loss_algo, shift, epsilon_c):
  """Our ppo_clip against Tunix's grpo_loss_fn (the loss it replaces) on two sequences of three tokens:
  the same loss, gradient and diagnostics, inside and outside the clip range, per token and per
  sequence, with a KL term and sampler importance weights, without and with dual clip (rl.epsilon_c:
  shift 0.6 takes the negative advantage's ratio past 1.5)."""
  cfg = make_config(
    "rl.grpo_beta=0.3", f"rl.loss_algo={loss_algo}", "rl.epsilon_high=0.28", f"rl.epsilon_c={epsilon_c}"
  )
  config = algorithm.grpo_config(cfg.algorithm, cfg.sampling)
  config.temperature = 1.0
  tokens = jnp.asarray([[2, 3, 4], [5, 2, 1]], jnp.int32)
  logps = jax.nn.log_softmax(jnp.asarray(LOGITS))[tokens]
  example = common.TrainExample(
    prompt_ids=jnp.full((2, 1), 2, jnp.int32),
    prompt_mask=jnp.ones((2, 1), bool),
    completion_ids=tokens,
    completion_mask=jnp.asarray([[1, 1, 1], [1, 1, 0]], bool),
    advantages=jnp.asarray([1.2, -0.7]),
    ref_per_token_logps=logps - 0.2,
    old_per_token_logps=logps - shift * jnp.asarray([[1.0, -1.0, 0.5], [0.3, 1.0, 0.0]]),
    sampler_is_weights=jnp.asarray([[1.0, 0.5, 2.0], [1.5, 1.0, 1.0]]),
  )

  def run(fn):
    grad_fn = nnx.value_and_grad(lambda m: fn(m, example, config, pad_id=PAD, eos_id=EOS), has_aux=True)
    (loss, aux), grads = grad_fn(Categorical(LOGITS))
    return float(loss), aux, np.asarray(grads.logits[...])

  ours, theirs = run(losses.POLICY_LOSSES["ppo_clip"]), run(algo_core.grpo_loss_fn)
  np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6)
  np.testing.assert_allclose(ours[2], theirs[2], rtol=1e-5, atol=1e-7)
  assert np.abs(theirs[2]).max() > 1e-3
  for key, value in theirs[1].items():
    np.testing.assert_allclose(float(ours[1][key]), float(value), rtol=1e-5, atol=1e-7, err_msg=key)
  if epsilon_c and shift == 0.6 and loss_algo == "grpo":
    assert float(ours[1]["pg_clipfrac_lower"]) > 0


def test_the_loss_reports_the_sampler_trainer_mismatch_from_its_forward_pass():
  """With the sampler's log-probs in the example, the loss's aux holds their distance to the trainer's
  log-probs before the step's updates (the old ones where given, else its own): by hand."""
  cfg = make_config()
  config = algorithm.grpo_config(cfg.algorithm, cfg.sampling)
  config.temperature = 1.0
  p = jax.nn.softmax(jnp.asarray(LOGITS))
  tokens = [2, 3, 4]
  trainer = np.log(np.asarray(p)[tokens]).reshape(1, 3)
  sampler = np.log(np.asarray(p)[tokens] * np.array([0.5, 2.0, 1.3])).reshape(1, 3)
  base = _example([2], advantages=[1.0])
  fields = dict(
    prompt_ids=base.prompt_ids,
    prompt_mask=base.prompt_mask,
    completion_ids=jnp.asarray([tokens], jnp.int32),
    completion_mask=jnp.asarray([[1, 1, 0]], bool),
    advantages=base.advantages,
    ref_per_token_logps=None,
  )
  prob = np.asarray(p)[tokens]
  for old in (None, jnp.asarray(trainer)):
    example = losses.SampledExample(**fields, old_per_token_logps=old, sampler_logps=jnp.asarray(sampler))
    for name in losses.POLICY_LOSSES:
      aux = losses.POLICY_LOSSES[name](Categorical(LOGITS), example, config, pad_id=PAD, eos_id=EOS)[1]
      assert set(losses.MISMATCH_METRICS) <= set(aux)
      np.testing.assert_allclose(
        float(aux["sampler_trainer/logp_diff_mean"]), np.log(2), rtol=1e-5
      )  # the third is masked
      np.testing.assert_allclose(float(aux["sampler_trainer/logp_diff_max"]), np.log(2), rtol=1e-5)
      np.testing.assert_allclose(float(aux["sampler_trainer/prob_diff_mean"]), (0.5 * prob[0] + prob[1]) / 2, rtol=1e-5)
      np.testing.assert_allclose(float(aux["sampler_trainer/prob_diff_max"]), max(0.5 * prob[0], prob[1]), rtol=1e-5)
  without = _example([2], advantages=[1.0])
  assert not set(losses.MISMATCH_METRICS) & set(
    losses.POLICY_LOSSES["ppo_clip"](Categorical(LOGITS), without, config, pad_id=PAD, eos_id=EOS)[1]
  )


def test_every_aggregation_listed_is_one_tunix_implements():
  per_token, mask = jnp.ones((2, 3)), jnp.array([[1, 1, 0], [1, 0, 0]])
  for mode in typing.get_args(sections.LossAggMode):
    assert np.isfinite(float(common.aggregate_loss(per_token, mask, mode)))
  with pytest.raises(ValueError):
    common.aggregate_loss(per_token, mask, "bogus")


@pytest.mark.parametrize(
  "args, message",
  [
    (["rl.advantage_estimator=grpo_plus"], "rl.advantage_estimator='grpo_plus': expected one of grpo, dr_grpo, rloo"),
    (["rl.policy_loss_fn=ppo"], "rl.policy_loss_fn='ppo': expected one of ppo_clip, cispo"),
    (["rl.loss_algo=nope"], "rl.loss_algo='nope': expected one of grpo, gspo-token"),
    (["rl.loss_agg_mode=bogus"], "rl.loss_agg_mode='bogus': expected one of token-mean, sequence-mean-token-mean"),
    (["rl.policy_loss_fn=cispo", "rl.loss_algo=gspo-token"], "sequence-level ratio belongs to ppo_clip"),
    (["rl.advantage_estimator=reinforce_pp", "rl.use_agentic_rollout=true"], "no batch to normalise over"),
  ],
)
def test_misspelt_or_conflicting_algorithm_values_are_refused(args, message):
  with pytest.raises(ConfigError, match=message):
    make_config(*args)


def test_the_registries_hold_one_function_per_choice_of_their_key():
  choices = sections.choices()
  assert tuple(losses.ADVANTAGE_ESTIMATORS) == choices["rl.advantage_estimator"]
  assert tuple(losses.POLICY_LOSSES) == choices["rl.policy_loss_fn"]
