"""PPO's critic in training (rl.algorithm=ppo): its values of a step's completions and its updates
towards their returns, by an AdamW of its own (critic.learning_rate on critic.lr_schedule; the run's
betas, weight decay and gradient clipping), on the trainer's mesh.

Tunix 0.1.7's critic role is not used: its trainer updates only LoRA parameters where the critic has
adapters, so a new value head never trains, and it has no critic-only warmup (docs/decisions.md,
"PPO's critic outside Tunix's trainer").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.configs.sections import CriticSection, TrainSection
from maxtext.integration.tunix import cluster as cluster_lib
from maxtext.integration.tunix import scoring
from maxtext.models import critic as critic_lib
from maxtext.rl import ppo
from maxtext.utils import distributed
from maxtext.utils import mesh as mesh_lib

PARAMS, OPTIMIZER = orbax_checkpoint.CRITIC_ITEMS  # its checkpoint items


def learning_rate(section: CriticSection, train: TrainSection) -> float:
  """critic.learning_rate, or ten times the policy's learning_rate where it is -1."""
  return section.learning_rate if section.learning_rate > 0 else 10.0 * train.learning_rate


def schedule(section: CriticSection, train: TrainSection, updates: int) -> optax.ScalarOrSchedule:
  """The critic's learning rate over its `updates` updates of the run: learning_rate's constant, or with
  critic.lr_schedule=warmup_cosine the policy's shape (warmup over warmup_steps_fraction of them, then a
  cosine decay to 0)."""
  peak = learning_rate(section, train)
  if section.lr_schedule == "constant":
    return peak
  return cluster_lib.warmup_cosine(peak, train.warmup_steps_fraction, updates)


class CriticTrainer:
  """The critic, its optimizer and the programs that score and train it: `rows` completions at a time
  (None: the whole batch), one update per `rows` completions, `passes` passes over a step's batch;
  with `group` > 1 the rows come in groups of that many sharing their prompt, computed once a group
  (models.critic.SharedPrefixCritic); `updates`: its updates in the whole run, which its learning-rate
  schedule spans."""

  def __init__(
    self,
    critic: critic_lib.Critic,
    section: CriticSection,
    train: TrainSection,
    mesh,
    pad_id: int,
    eos_id: int,
    rows: int | None,
    passes: int = 1,
    group: int = 1,
    updates: int = 1,
  ):
    self.critic = critic
    self._trained = critic_lib.trained(critic)
    with jax.set_mesh(mesh):
      self.optimizer = nnx.Optimizer(
        critic, cluster_lib.adamw(train, schedule(section, train, updates)), wrt=self._trained
      )
    self._mesh, self._pad, self._eos, self._rows, self._passes = mesh, pad_id, eos_id, rows, passes
    self._group = group
    self._clip = section.clip_range_value

  def _parts(self, arrays: tuple) -> list[tuple]:
    """The arrays as global arrays on the mesh, in row slices of `rows`."""
    arrays = mesh_lib.global_batch(tuple(arrays), self._mesh)
    size = self._rows or len(arrays[0])
    return [tuple(a[i : i + size] for a in arrays) for i in range(0, len(arrays[0]), size)]

  def values(self, prompt_ids, completion_ids) -> np.ndarray:
    """float32 values [B, C] of each completion token's state (scoring.completion_values), on the host
    (every process holds them all)."""
    graphdef, state = nnx.split(self.critic)
    with self._mesh:  # as cluster.global_token_logps scores: jax.set_mesh would lay the slices out on the mesh
      parts = self._parts((prompt_ids, completion_ids))
      values = [_values(graphdef, state, p, c, self._pad, self._eos, self._group) for p, c in parts]
      return distributed.host_array(jnp.concatenate(values, axis=0))

  def train(self, prompt_ids, completion_ids, mask, old_values, returns) -> dict[str, float]:
    """Updates towards `returns` [B, C] under PPO's clipped value loss (ppo.value_loss) over the live
    tokens of `mask`, clipped around the values the batch was scored with (`old_values`): one update
    per `rows` completions, `passes` passes. Returns the metrics: the updates' mean value loss, clip
    fraction and gradient norm, and the old values' and returns' means and explained variance over
    the live tokens."""
    losses, clipped, norms = [], [], []
    with self._mesh:
      parts = self._parts((prompt_ids, completion_ids, mask, old_values, returns))
      for _ in range(self._passes):
        for part in parts:
          loss, clip, norm = _update(  # type: ignore[call-arg]
            self.optimizer, self.critic, *part, self._pad, self._eos, self._clip, self._group, self._trained
          )
          losses.append(loss)
          clipped.append(clip)
          norms.append(norm)
    m = jnp.asarray(mask, jnp.float32)
    count = jnp.maximum(m.sum(), 1.0)
    return {
      "critic/value_loss": float(np.mean(jax.device_get(losses))),
      "critic/vf_clipfrac": float(np.mean(jax.device_get(clipped))),
      "critic/grad_norm": float(np.mean(jax.device_get(norms))),
      "critic/values_mean": float((old_values * m).sum() / count),
      "critic/returns_mean": float((returns * m).sum() / count),
      "critic/explained_variance": float(ppo.explained_variance(old_values, returns, mask)),
    }

  def items(self) -> dict[str, nnx.State]:
    """Its checkpoint items: the parameters it trains and its optimizer's state."""
    return {PARAMS: nnx.state(self.critic, self._trained), OPTIMIZER: nnx.state(self.optimizer, nnx.optimizer.OptState)}

  def restore(self, items: dict[str, nnx.State]) -> None:
    """Sets the parameters and optimizer state of `items` (as `items` returns them)."""
    nnx.update(self.critic, items[PARAMS])
    nnx.update(self.optimizer, items[OPTIMIZER])


def _scored(critic: critic_lib.Critic, prompt_ids, completion_ids, pad, eos, group) -> jax.Array:
  model = critic_lib.SharedPrefixCritic(critic, prompt_ids.shape[1], group) if group > 1 else critic
  return scoring.completion_values(model, prompt_ids, completion_ids, pad, eos)


@functools.partial(jax.jit, static_argnames=("graphdef", "pad", "eos", "group"))
def _values(graphdef, state, prompt_ids, completion_ids, pad, eos, group):
  return _scored(nnx.merge(graphdef, state), prompt_ids, completion_ids, pad, eos, group)


@nnx.jit(static_argnames=("pad", "eos", "clip", "group", "trained"))
def _update(optimizer, critic, prompt_ids, completion_ids, mask, old_values, returns, pad, eos, clip, group, trained):
  """One optimizer update on the part's value loss; returns (the loss, its clip fraction, the
  gradient's global norm)."""

  def loss_fn(model):
    values = _scored(model, prompt_ids, completion_ids, pad, eos, group)
    loss, clipped = ppo.value_loss(values, old_values, returns, mask, clip)
    return loss, (loss, clipped)

  grads, (loss, clipped) = nnx.grad(loss_fn, argnums=nnx.DiffState(0, trained), has_aux=True)(critic)
  optimizer.update(critic, grads)
  return loss, clipped, optax.global_norm(grads)
