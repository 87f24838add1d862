"""The run's optimizer (cluster.optimizer): AdamW's weight decay reaches matrices and embeddings but
not norm scales, as HF's Trainer and TRL do, unless adam_weight_decay_all."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from maxtext.integration.tunix import cluster
from maxtext.models import load
from maxtext.utils.mesh import create_meshes
from maxtext.utils.steps import Steps
from tests.conftest import make_config

LR, DECAY = 0.01, 0.1


def _params(model) -> dict:
  return {"/".join(map(str, k)): np.array(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _one_update(gradient: float, *overrides, first: float | None = None) -> tuple[dict, dict, nnx.Optimizer]:
  """Parameters before and after one update of the run's optimizer with every gradient `gradient`
  (after an update with gradients `first`, when given)."""
  cfg = make_config(
    "model_name=qwen3-tiny",
    f"learning_rate={LR}",
    "warmup_steps_fraction=0",
    "gradient_clipping_threshold=0",
    *overrides,
  )
  mesh = create_meshes(cfg.mesh, agentic=False)[0]
  with jax.set_mesh(mesh):
    model = load.load_model(cfg.model, mesh)
    optimizer = nnx.Optimizer(model, cluster.optimizer(cfg.train, Steps.of(cfg.train, cfg.algorithm)), wrt=nnx.Param)
    if first is not None:
      optimizer.update(model, jax.tree.map(lambda p: jnp.full_like(p, first), nnx.state(model, nnx.Param)))
    before = _params(model)
    optimizer.update(model, jax.tree.map(lambda p: jnp.full_like(p, gradient), nnx.state(model, nnx.Param)))
    return before, _params(model), optimizer


@pytest.mark.parametrize("decay_all", [False, True])
def test_weight_decay_skips_norm_scales_unless_asked(decay_all):
  """With the same gradient, the update with weight decay takes lr * decay * w more off a decayed
  weight than the update without (decoupled decay) and the same off a norm scale."""
  flag = f"adam_weight_decay_all={str(decay_all).lower()}"
  before, decayed, _ = _one_update(1.0, f"adam_weight_decay={DECAY}", flag)
  _, plain, _ = _one_update(1.0, "adam_weight_decay=0", flag)
  vectors = [k for k, v in before.items() if v.ndim == 1]
  matrices = [k for k, v in before.items() if v.ndim >= 2]
  assert any("norm" in k for k in vectors) and any("embed" in k for k in matrices)
  for name in matrices:
    np.testing.assert_allclose(plain[name] - decayed[name], before[name] * LR * DECAY, atol=1e-7, err_msg=name)
  for name in vectors:
    expected = before[name] * LR * DECAY if decay_all else np.zeros_like(before[name])
    np.testing.assert_allclose(plain[name] - decayed[name], expected, atol=1e-7, err_msg=name)


def test_a_step_without_learning_signal_leaves_the_weights_alone():
  """A zero gradient (every group of the step scored alike, no KL term) after an update that built
  up AdamW's momentum leaves the weights as they were: AdamW would go on moving the policy with its
  momentum and weight decay, with no sample asking for it (its moments still see the zero gradient)."""
  before, after, _ = _one_update(0.0, f"adam_weight_decay={DECAY}", first=1.0)
  for name in before:
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)
  _, moved, _ = _one_update(1.0, f"adam_weight_decay={DECAY}", first=1.0)
  assert all(not np.array_equal(moved[name], before[name]) for name in before)


def _after(gradients: list[float], *overrides) -> tuple[dict, nnx.Optimizer, list[list[np.ndarray]]]:
  """Parameters after updates of the run's optimizer with every gradient each of `gradients` in turn,
  and optax's state (its leaves) before the first update and after each."""
  cfg = make_config("model_name=qwen3-tiny", f"learning_rate={LR}", "gradient_clipping_threshold=1.0", *overrides)
  mesh = create_meshes(cfg.mesh, agentic=False)[0]
  with jax.set_mesh(mesh):
    model = load.load_model(cfg.model, mesh)
    optimizer = nnx.Optimizer(model, cluster.optimizer(cfg.train, Steps.of(cfg.train, cfg.algorithm)), wrt=nnx.Param)
    states = [[np.asarray(x) for x in jax.tree.leaves(optimizer.opt_state)]]
    for g in gradients:
      optimizer.update(model, jax.tree.map(functools.partial(jnp.full_like, fill_value=g), nnx.state(model, nnx.Param)))
      states.append([np.asarray(x) for x in jax.tree.leaves(optimizer.opt_state)])
    return _params(model), optimizer, states


def test_updates_without_signal_do_not_count_so_a_critic_warmup_leaves_the_schedule_at_its_start():
  """Two zero-gradient updates first (PPO's critic warmup: the policy trains on no token), then two
  real ones, give the weights two real updates of a fresh optimizer give: the learning-rate warmup
  and AdamW's bias correction start at the first update that moves the policy (as verl skips the
  actor's update in its critic warmup), not two updates into the schedule. The warmup leaves optax's
  state as it started, every leaf (counts and moments); flax's Optimizer.step, which counts update
  calls and which neither optax nor Tunix reads, is not part of it."""
  schedule = ("warmup_steps_fraction=0.5", "num_batches=4", f"adam_weight_decay={DECAY}")
  warmed, optimizer, states = _after([0.0, 0.0, 1.0, 0.5], *schedule)
  fresh, _, _ = _after([1.0, 0.5], *schedule)
  for name in fresh:
    np.testing.assert_allclose(warmed[name], fresh[name], rtol=0, atol=1e-7, err_msg=name)
  counts = [
    int(x) for p, x in jax.tree_util.tree_leaves_with_path(optimizer.opt_state) if "count" in jax.tree_util.keystr(p)
  ]
  assert counts and set(counts) == {2}  # the two updates that moved the weights
  assert len(states[0]) > 2
  for start, warm in zip(states[0], states[2], strict=True):
    np.testing.assert_array_equal(warm, start)
