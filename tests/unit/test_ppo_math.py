"""rl/ppo.py against references written here in plain numpy, not after the module's algorithm:
- gae: Schulman et al. 2016 (GAE), by its explicit sum A_t = sum_l (gamma*lam)^l delta_{t+l}, with python
  loops over each row's live tokens (masked positions removed first, value 0 after the last live token);
  plus gamma = lam = 1 (A_t = final reward - V_t) and a tiny case worked by hand.
- token_rewards: the row's reward at its last live token, by a python loop.
- whiten: (x - mean) / sqrt(var + 1e-8) with the mean and the unbiased (N - 1) variance over the live
  tokens, as verl's masked_whiten.
- value_loss: the clipped value loss of PPO implementations (0.5 * max of the plain and clipped squared errors),
  its clip fraction, a 1x3 case worked by hand, and its gradient in V against the analytic derivative
  (itself checked by central finite differences of the numpy loss in float64).
- explained_variance: 1 - Var(R - V) / Var(R), population variances over the live tokens.
- the policy loss on per-token advantages (losses.py's ppo_clip, as PPO trains with it): the clipped
  surrogate of Schulman et al. 2017 and its clip fraction.
"""

import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl.grpo import grpo_learner

from maxtext.integration.tunix import algorithm, losses
from maxtext.rl import ppo
from tests.conftest import make_config
from tests.unit.test_grpo_loss import EOS, PAD, Categorical

# Right-padded, all-zero, holes, fully live, holes with a leading zero.
MASK = np.array(
  [
    [1, 1, 1, 1, 1, 1, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 1, 0, 0, 1, 1, 0],
    [1, 1, 1, 1, 1, 1, 1, 1, 1],
    [0, 1, 1, 0, 1, 1, 1, 0, 0],
  ],
  np.float32,
)


def reference_gae(rewards, values, mask, gamma, lam):
  advantages = np.zeros(rewards.shape)
  for b in range(rewards.shape[0]):
    live = [t for t in range(rewards.shape[1]) if mask[b, t] > 0]
    r = [float(rewards[b, t]) for t in live]
    v = [float(values[b, t]) for t in live] + [0.0]  # the value after the last live token is 0
    delta = [r[k] + gamma * v[k + 1] - v[k] for k in range(len(r))]
    for k, t in enumerate(live):
      advantages[b, t] = sum((gamma * lam) ** j * delta[k + j] for j in range(len(r) - k))
  return advantages, np.where(mask > 0, advantages + values, 0.0)


def live_values(x, mask):
  return np.asarray(x, np.float64)[np.asarray(mask) > 0]


def test_gae_matches_the_explicit_sum():
  for seed in (0, 1, 2):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=MASK.shape).astype(np.float32)
    values = rng.normal(size=MASK.shape).astype(np.float32)
    advantages, returns = ppo.gae(rewards, values, MASK, gamma=0.9, lam=0.8)
    want_adv, want_ret = reference_gae(rewards, values, MASK, 0.9, 0.8)
    np.testing.assert_allclose(np.asarray(advantages), want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(returns), want_ret, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(advantages)[MASK == 0] == 0) and np.all(np.asarray(returns)[MASK == 0] == 0)


def test_gae_with_gamma_and_lambda_one_is_final_reward_less_value():
  rng = np.random.default_rng(3)
  final = np.array([0.37, 5.0, -1.25, 2.0, 0.5], np.float32)
  values = rng.normal(size=MASK.shape).astype(np.float32)
  rewards = ppo.token_rewards(final, MASK)
  advantages, returns = ppo.gae(rewards, values, MASK, gamma=1.0, lam=1.0)
  want = np.where(MASK > 0, final[:, None] - values, 0.0)
  np.testing.assert_allclose(np.asarray(advantages), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(returns), np.where(MASK > 0, final[:, None], 0.0), rtol=1e-5, atol=1e-5)


def test_gae_by_hand():
  # gamma = lam = 0.5, mask [1, 0, 1]: the live sequence is r = [0, 1], V = [0.5, 0.2], then V = 0.
  # delta_2 = 1 + 0.5 * 0 - 0.2 = 0.8, A_2 = 0.8, R_2 = 0.8 + 0.2 = 1.0
  # delta_0 = 0 + 0.5 * 0.2 - 0.5 = -0.4, A_0 = -0.4 + 0.25 * 0.8 = -0.2, R_0 = -0.2 + 0.5 = 0.3
  # Position 1 is skipped: its reward 7 and value 9 play no part, and its advantage and return are 0.
  advantages, returns = ppo.gae([[0.0, 7.0, 1.0]], [[0.5, 9.0, 0.2]], [[1, 0, 1]], gamma=0.5, lam=0.5)
  np.testing.assert_allclose(np.asarray(advantages), [[-0.2, 0.0, 0.8]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(returns), [[0.3, 0.0, 1.0]], atol=1e-6)


def test_token_rewards_sit_at_the_last_live_token():
  final = np.array([0.37, 5.0, -1.25, 2.0, 0.123456], np.float32)
  got = np.asarray(ppo.token_rewards(final, MASK))
  want = np.zeros(MASK.shape, np.float32)
  for b in range(MASK.shape[0]):
    live = np.flatnonzero(MASK[b])
    if len(live):
      want[b, live[-1]] = final[b]
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got, want)  # exact: 0.37 stays 0.37, the all-zero row gets nothing
  assert got[2, 7] == np.float32(-1.25) and got[0, 5] == np.float32(0.37) and not got[1].any()


def test_whiten_over_live_tokens():
  rng = np.random.default_rng(4)
  x = (3.0 + 2.5 * rng.normal(size=MASK.shape)).astype(np.float32)
  got = np.asarray(ppo.whiten(jnp.asarray(x), MASK))
  live = live_values(x, MASK)
  want = np.where(MASK > 0, (x - live.mean()) / np.sqrt(live.var(ddof=1) + 1e-8), 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert abs(live_values(got, MASK).mean()) < 1e-5 and abs(live_values(got, MASK).std(ddof=1) - 1.0) < 1e-5
  assert np.all(got[MASK == 0] == 0)


def reference_value_loss(v, v_old, ret, mask, c):
  live = np.asarray(mask) > 0
  plain = (v - ret) ** 2
  clipped = (v_old + np.clip(v - v_old, -c, c) - ret) ** 2
  return 0.5 * np.maximum(plain, clipped)[live].mean(), (clipped > plain)[live].mean()


def random_value_case(seed):
  rng = np.random.default_rng(seed)
  v_old = rng.normal(size=MASK.shape)
  v = v_old + rng.normal(scale=0.5, size=MASK.shape)
  ret = rng.normal(size=MASK.shape)
  return v, v_old, ret


def test_value_loss_matches_the_clipped_form():
  for seed in (5, 6):
    v, v_old, ret = random_value_case(seed)
    loss, fraction = ppo.value_loss(*(jnp.asarray(a, jnp.float32) for a in (v, v_old, ret)), MASK, clip=0.2)
    want_loss, want_fraction = reference_value_loss(v, v_old, ret, MASK, 0.2)
    assert 0 < want_fraction < 1  # some tokens clipped, some not
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    np.testing.assert_allclose(float(fraction), want_fraction, rtol=1e-6)
    loss0, fraction0 = ppo.value_loss(*(jnp.asarray(a, jnp.float32) for a in (v, v_old, ret)), MASK, clip=0.0)
    np.testing.assert_allclose(float(loss0), 0.5 * live_values((v - ret) ** 2, MASK).mean(), rtol=1e-5)
    assert float(fraction0) == 0.0


def test_value_loss_by_hand():
  # clip 0.2. Token 0: V - V_old = 0.5 -> 0.2, V_clip = 0.7; plain (1 - 0)^2 = 1, clipped 0.49 -> 1.
  # Token 1: V - V_old = -0.5 -> -0.2, V_clip = 2.3; plain (2 - 1)^2 = 1, clipped 1.3^2 = 1.69 -> 1.69 (clipped).
  # Token 2: V = V_old; both 1 (a tie, not counted as clipped). Loss 0.5 * 3.69 / 3 = 0.615, fraction 1/3.
  loss, fraction = ppo.value_loss(
    jnp.array([[1.0, 2.0, 0.0]]), jnp.array([[0.5, 2.5, 0.0]]), jnp.array([[0.0, 1.0, 1.0]]), [[1, 1, 1]], clip=0.2
  )
  np.testing.assert_allclose(float(loss), 0.615, rtol=1e-6)
  np.testing.assert_allclose(float(fraction), 1 / 3, rtol=1e-6)


def test_value_loss_gradient():
  v, v_old, ret = random_value_case(7)
  c, live = 0.2, MASK > 0
  grad = np.asarray(
    jax.grad(lambda x: ppo.value_loss(x, jnp.asarray(v_old, jnp.float32), jnp.asarray(ret, jnp.float32), MASK, c)[0])(
      jnp.asarray(v, jnp.float32)
    )
  )
  # Analytic: (V - R) / n where the plain term is the max; where the clipped term is strictly larger, V - V_old is
  # outside [-c, c] (inside, the terms are equal), so the clipped value is constant in V and the gradient is 0.
  plain = (v - ret) ** 2
  clipped = (v_old + np.clip(v - v_old, -c, c) - ret) ** 2
  taken_clipped = clipped > plain
  assert taken_clipped[live].any() and (~taken_clipped[live]).any()
  assert np.all(np.abs(v - v_old)[taken_clipped] > c)
  analytic = np.where(live & ~taken_clipped, (v - ret) / live.sum(), 0.0)
  np.testing.assert_allclose(grad, analytic, rtol=1e-4, atol=1e-6)
  assert np.all(grad[live & taken_clipped] == 0) and np.all(grad[~live] == 0)
  # The analytic derivative agrees with central finite differences of the float64 numpy loss.
  h, numeric = 1e-6, np.zeros_like(v)
  for idx in np.ndindex(v.shape):
    step = np.zeros_like(v)
    step[idx] = h
    up = reference_value_loss(v + step, v_old, ret, MASK, c)[0]
    down = reference_value_loss(v - step, v_old, ret, MASK, c)[0]
    numeric[idx] = (up - down) / (2 * h)
  np.testing.assert_allclose(numeric, analytic, atol=1e-6)


def test_explained_variance():
  rng = np.random.default_rng(8)
  ret = rng.normal(size=MASK.shape).astype(np.float32)
  v = (ret + 0.5 * rng.normal(size=MASK.shape)).astype(np.float32)
  got = float(ppo.explained_variance(jnp.asarray(v), jnp.asarray(ret), MASK))
  want = 1.0 - live_values(ret - v, MASK).var() / live_values(ret, MASK).var()
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert float(ppo.explained_variance(jnp.asarray(ret), jnp.asarray(ret), MASK)) == 1.0
  constant = np.where(MASK > 0, 1.5, rng.normal(size=MASK.shape)).astype(np.float32)  # constant where live
  assert float(ppo.explained_variance(jnp.asarray(v), jnp.asarray(constant), MASK)) == 0.0


def test_the_policy_loss_on_per_token_advantages_is_ppos_clipped_objective():
  """PPO's policy loss (losses.py's ppo_clip with [B, T] advantages, as rl.algorithm=ppo gives it) on a
  context-free categorical policy, against the clipped surrogate of Schulman et al. 2017 written here:
  mean over live tokens of max(-A r, -A clip(r, 1 - eps, 1 + eps)), r = p / p_old; old log-probs away
  from the policy's so that some tokens clip."""
  rng = np.random.default_rng(7)
  logits = rng.normal(size=6).astype(np.float32)
  completions = np.array([[2, 3, 4], [5, 2, PAD], [3, 3, 2]], np.int32)
  mask = completions != PAD
  advantages = rng.normal(size=completions.shape).astype(np.float32) * mask
  logp = logits - np.log(np.exp(logits).sum())
  old = logp[completions] + rng.normal(scale=0.4, size=completions.shape).astype(np.float32)
  example = grpo_learner.TrainExample(
    prompt_ids=jnp.full((3, 1), 2, jnp.int32),
    prompt_mask=jnp.ones((3, 1), bool),
    completion_ids=jnp.asarray(completions),
    completion_mask=jnp.asarray(mask),
    advantages=jnp.asarray(advantages),
    ref_per_token_logps=None,
    old_per_token_logps=jnp.asarray(old),
  )
  cfg = make_config("rl.algorithm=ppo", "rl.num_generations=1", "rl.grpo_beta=0", "rl.loss_agg_mode=token-mean")
  config = algorithm.ppo_config(cfg.algorithm)
  config.temperature = 1.0
  loss, aux = losses.POLICY_LOSSES["ppo_clip"](Categorical(logits), example, config, pad_id=PAD, eos_id=EOS)

  ratio = np.exp(logp[completions] - old)
  eps = cfg.algorithm.grpo_epsilon
  per_token = np.maximum(-advantages * ratio, -advantages * np.clip(ratio, 1 - eps, 1 + eps))
  clipped = (-advantages * np.clip(ratio, 1 - eps, 1 + eps)) > (-advantages * ratio)
  assert clipped[mask].any() and not clipped[mask].all()
  np.testing.assert_allclose(float(loss), per_token[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(float(aux["pg_clipfrac"]), clipped[mask].mean(), rtol=1e-6)


def test_the_kl_penalty_inside_the_reward_matches_each_estimate():
  rng = np.random.default_rng(3)
  logps = -rng.exponential(size=MASK.shape).astype(np.float32)
  ref = -rng.exponential(size=MASK.shape).astype(np.float32)
  d = logps.astype(np.float64) - ref
  estimates = {"kl": d, "mse_kl": 0.5 * d**2, "low_var_kl": np.exp(-d) - 1 + d}  # k1, k2, k3 of Schulman's note
  for method, kl in estimates.items():
    got = np.asarray(ppo.kl_penalty(logps, ref, MASK, 0.05, method))
    np.testing.assert_allclose(got, np.where(MASK > 0, -0.05 * kl, 0.0), rtol=1e-5, atol=1e-7)
  # low_var_kl is bounded as verl bounds it: a token at p=1e-8 under the policy and 0.5 under the
  # reference would cost 0.05 * 5e7 = 2.5e6 unbounded; it costs 0.05 * 10
  far = ppo.kl_penalty(np.log([[1e-8]]), np.log([[0.5]]), np.ones((1, 1)), 0.05, "low_var_kl")
  np.testing.assert_allclose(np.asarray(far), [[-0.5]], rtol=1e-6)
  # With the reward at the last token, GAE (gamma = lam = 1, V = 0) gives each token the reward less the
  # penalties from that token on: the KL of later tokens is charged to earlier ones, as in PPO for RLHF.
  rewards = np.array([1.0, 0.0, 0.5, -1.0, 2.0], np.float32)
  total = ppo.token_rewards(rewards, MASK) + ppo.kl_penalty(logps, ref, MASK, 0.05, "kl")
  advantages, _ = ppo.gae(total, np.zeros(MASK.shape, np.float32), MASK, gamma=1.0, lam=1.0)
  for b in range(MASK.shape[0]):
    live = [t for t in range(MASK.shape[1]) if MASK[b, t]]
    for k, t in enumerate(live):
      want = rewards[b] - 0.05 * sum(d[b, u] for u in live[k:])
      np.testing.assert_allclose(float(advantages[b, t]), want, rtol=1e-5, atol=1e-6)


def _loss_of(logits, completions, advantages, old, *overrides):
  mask = completions != PAD
  example = grpo_learner.TrainExample(
    prompt_ids=jnp.full((len(completions), 1), 2, jnp.int32),
    prompt_mask=jnp.ones((len(completions), 1), bool),
    completion_ids=jnp.asarray(completions),
    completion_mask=jnp.asarray(mask),
    advantages=jnp.asarray(advantages),
    ref_per_token_logps=None,
    old_per_token_logps=jnp.asarray(old),
  )
  cfg = make_config(
    "rl.algorithm=ppo", "rl.num_generations=1", "rl.grpo_beta=0", "rl.loss_agg_mode=token-mean", *overrides
  )
  config = algorithm.ppo_config(cfg.algorithm)
  config.temperature = 1.0

  def loss(z):
    return losses.POLICY_LOSSES["ppo_clip"](Categorical(z), example, config, pad_id=PAD, eos_id=EOS)

  (value, aux), grad = jax.value_and_grad(lambda z: loss(z), has_aux=True)(jnp.asarray(logits))
  return float(value), aux, np.asarray(grad, np.float64)


def test_dual_clip_bounds_the_loss_of_negative_advantages_at_epsilon_c():
  """rl.epsilon_c (dual-clip PPO, Ye et al. 2020): where A < 0 the per-token loss is
  min(max(-A r, -A clip(r, 1 - eps, 1 + eps)), -c A), and pg_clipfrac_lower is the share of live tokens
  where -c A is the smaller; old log-probs far below the policy's give ratios past c = 3."""
  rng = np.random.default_rng(11)
  logits = rng.normal(size=6).astype(np.float32)
  completions = np.array([[2, 3, 4], [5, 2, PAD], [3, 3, 2], [4, 5, 5]], np.int32)
  mask = completions != PAD
  advantages = (rng.normal(size=completions.shape) * mask).astype(np.float32)
  logp = logits - np.log(np.exp(logits).sum())
  old = (logp[completions] - rng.uniform(0.0, 2.5, size=completions.shape)).astype(np.float32)  # ratios 1 to 12
  loss, aux, _ = _loss_of(logits, completions, advantages, old, "rl.epsilon_c=3.0")

  ratio = np.exp(logp[completions] - old)
  eps = 0.2
  clipped = np.maximum(-advantages * ratio, -advantages * np.clip(ratio, 1 - eps, 1 + eps))
  lower = (advantages < 0) & (clipped > -3.0 * advantages)
  per_token = np.where(advantages < 0, np.minimum(clipped, -3.0 * advantages), clipped)
  assert lower[mask].any() and not lower[mask].all()
  np.testing.assert_allclose(loss, per_token[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(float(aux["pg_clipfrac_lower"]), lower[mask].mean(), rtol=1e-6)
  plain, plain_aux, _ = _loss_of(logits, completions, advantages, old)  # epsilon_c=0: no bound
  np.testing.assert_allclose(plain, clipped[mask].mean(), rtol=1e-5)
  assert float(plain_aux["pg_clipfrac_lower"]) == 0.0 and plain > loss


def test_the_entropy_bonus_is_the_loss_less_entropy_coef_times_the_entropy_with_its_gradient():
  """rl.entropy_coef: the loss less coef * H over the live tokens (token-mean), H = -sum p log p of the
  policy's next-token distribution, and its gradient the plain loss's plus coef * p (log p + H) (the
  derivative of -H in the logits, written here)."""
  rng = np.random.default_rng(5)
  logits = rng.normal(size=6).astype(np.float32)
  completions = np.array([[2, 3, 4], [5, 2, PAD]], np.int32)
  advantages = (rng.normal(size=completions.shape) * (completions != PAD)).astype(np.float32)
  logp = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
  old = logp[completions].astype(np.float32)
  plain, _, plain_grad = _loss_of(logits, completions, advantages, old)
  bonus, aux, bonus_grad = _loss_of(logits, completions, advantages, old, "rl.entropy_coef=0.3")
  p = np.exp(logp)
  entropy = -(p * logp).sum()
  np.testing.assert_allclose(float(aux["entropy"]), entropy, rtol=1e-5)
  np.testing.assert_allclose(bonus, plain - 0.3 * entropy, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bonus_grad, plain_grad + 0.3 * p * (logp + entropy), rtol=1e-4, atol=1e-6)


def test_whiten_equals_tunix_s_masked_whiten_on_the_live_tokens():
  """Tunix's algo_core.masked_whiten (unbiased variance, as verl's): ours equals it where the mask is 1."""
  from tunix.rl import algo_core

  rng = np.random.default_rng(5)
  x = (1.0 + 3.0 * rng.normal(size=MASK.shape)).astype(np.float32)
  theirs = np.asarray(algo_core.masked_whiten(jnp.asarray(x), jnp.asarray(MASK)))
  ours = np.asarray(ppo.whiten(jnp.asarray(x), MASK))
  np.testing.assert_allclose(ours[MASK > 0], theirs[MASK > 0], rtol=1e-5, atol=1e-5)
