"""PPO's arithmetic over a batch of completions, free of Tunix: the reward placed on the tokens (and
the KL penalty inside it), GAE,
whitening, the clipped value loss and explained variance (rl.algorithm=ppo; the learner that uses them
is integration/tunix/ppo.py).

Every array is [B, T] over the completion's positions, with `mask` 1 at the tokens that train (the
completion's tokens, not its padding; a row whose mask is all 0 trains nothing). A position whose mask
is 0 between live tokens is skipped: it has no reward, value or advantage of its own, and the next live
token's value is what GAE bootstraps from across it. After a row's last live token the value is 0 (the
episode has ended).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

_EPS = 1e-8


def token_rewards(rewards: ArrayLike, mask: ArrayLike) -> jax.Array:
  """float32 [B, T]: each row's scalar reward at its last live token, 0 elsewhere (rewards [B], as
  the reward functions returned them; a row with no live token gets none)."""
  mask = jnp.asarray(mask) > 0
  last = mask.shape[1] - 1 - jnp.argmax(mask[:, ::-1], axis=1)
  at_last = (jnp.arange(mask.shape[1])[None, :] == last[:, None]) & mask
  return jnp.where(at_last, jnp.asarray(rewards, jnp.float32)[:, None], 0.0)


LOG_RATIO_BOUND, LOW_VAR_KL_BOUND = 20.0, 10.0  # verl's bounds of its low_var_kl penalty


def kl_penalty(logps: ArrayLike, ref_logps: ArrayLike, mask: ArrayLike, coef: float, method: str) -> jax.Array:
  """float32 [B, T]: the KL penalty inside the reward, -coef * KL_t on each live token, KL_t the per-token
  estimate `method` of the sampling policy's log-probs `logps` against the reference's: kl (k1,
  logp - ref), mse_kl (k2, (logp - ref)^2 / 2) or low_var_kl (k3, exp(ref - logp) - (ref - logp) - 1,
  bounded as verl bounds it: the log-ratio to +-LOG_RATIO_BOUND, the estimate to +-LOW_VAR_KL_BOUND, so
  one token the policy all but never samples cannot make a reward of millions)."""
  diff = jnp.asarray(logps, jnp.float32) - jnp.asarray(ref_logps, jnp.float32)
  if method == "kl":
    kl = diff
  elif method == "mse_kl":
    kl = 0.5 * diff**2
  elif method == "low_var_kl":
    diff = jnp.clip(diff, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    kl = jnp.clip(jnp.expm1(-diff) + diff, -LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)
  else:
    raise ValueError(f"unknown KL estimate {method!r}")
  return jnp.where(jnp.asarray(mask) > 0, -coef * kl, 0.0)


def gae(
  rewards: ArrayLike, values: ArrayLike, mask: ArrayLike, gamma: float, lam: float
) -> tuple[jax.Array, jax.Array]:
  """(advantages, returns), float32 [B, T], by generalised advantage estimation (Schulman et al. 2016)
  over each row's live tokens: delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lam * A_next,
  returns R_t = A_t + V_t; both 0 where the mask is 0."""
  live = jnp.asarray(mask) > 0
  rewards, values = jnp.asarray(rewards, jnp.float32), jnp.asarray(values, jnp.float32)

  def step(carry, column):
    next_value, next_adv = carry
    r, v, m = column
    adv = r + gamma * next_value - v + gamma * lam * next_adv
    adv = jnp.where(m, adv, 0.0)
    return (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv)), adv

  zeros = jnp.zeros(rewards.shape[0], jnp.float32)
  _, advantages = jax.lax.scan(step, (zeros, zeros), (rewards.T, values.T, live.T), reverse=True)
  advantages = advantages.T
  return advantages, jnp.where(live, advantages + values, 0.0)


def whiten(x: ArrayLike, mask: ArrayLike) -> jax.Array:
  """x less its mean over the live tokens, over their standard deviation (the unbiased one, over N - 1
  tokens, as verl's masked_whiten and Tunix's whiten take it; over N for a single token); 0 where the
  mask is 0."""
  m = jnp.asarray(mask, jnp.float32)
  count = jnp.maximum(m.sum(), 1.0)
  mean = (x * m).sum() / count
  var = (jnp.square(x - mean) * m).sum() / jnp.maximum(count - 1.0, 1.0)
  return jnp.where(m > 0, (x - mean) * jax.lax.rsqrt(var + _EPS), 0.0)


def value_loss(
  values: ArrayLike, old_values: ArrayLike, returns: ArrayLike, mask: ArrayLike, clip: float
) -> tuple[jax.Array, jax.Array]:
  """(loss, clip fraction): PPO's clipped value loss, the mean over live tokens of
  0.5 * max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2), and the share of live tokens
  where the clipped term is the larger; clip 0 takes 0.5 * (V - R)^2 alone (fraction 0)."""
  values, old_values, returns = (jnp.asarray(a, jnp.float32) for a in (values, old_values, returns))
  m = jnp.asarray(mask, jnp.float32)
  count = jnp.maximum(m.sum(), 1.0)
  plain = jnp.square(values - returns)
  if clip > 0:
    clipped = jnp.square(old_values + jnp.clip(values - old_values, -clip, clip) - returns)
    loss, fraction = jnp.maximum(plain, clipped), (clipped > plain).astype(jnp.float32)
  else:
    loss, fraction = plain, jnp.zeros_like(plain)
  return 0.5 * (loss * m).sum() / count, (fraction * m).sum() / count


def explained_variance(values: ArrayLike, returns: ArrayLike, mask: ArrayLike) -> jax.Array:
  """1 - Var(R - V) / Var(R) over the live tokens (1: the values predict the returns; 0: no better
  than their mean, and 0 where the returns do not vary)."""
  m = jnp.asarray(mask, jnp.float32)
  count = jnp.maximum(m.sum(), 1.0)

  def var(x):
    mean = (x * m).sum() / count
    return (jnp.square(x - mean) * m).sum() / count

  values, returns = jnp.asarray(values, jnp.float32), jnp.asarray(returns, jnp.float32)
  total = var(returns)
  return jnp.where(total > 0, 1.0 - var(returns - values) / jnp.where(total > 0, total, 1.0), 0.0)
