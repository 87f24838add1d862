"""The run's optimizer (cluster.optimizer): AdamW's weight decay reaches matrices and embeddings but
not norm scales, as HF's Trainer and TRL do, unless adam_weight_decay_all."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from maxtext.integration.tunix import cluster
from maxtext.models import load
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

LR, DECAY = 0.01, 0.1


def _one_update_without_gradient(*overrides) -> tuple[dict, dict]:
  """Parameters before and after one AdamW update with zero gradients: only weight decay moves them."""
  cfg = make_config(
    "model_name=qwen3-tiny",
    f"learning_rate={LR}",
    f"adam_weight_decay={DECAY}",
    "warmup_steps_fraction=0",
    "gradient_clipping_threshold=0",
    *overrides,
  )
  mesh = create_meshes(cfg)[0]
  with jax.set_mesh(mesh):
    model = load.load_model(cfg, mesh)
    before = {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    optimizer = nnx.Optimizer(model, cluster.optimizer(cfg), wrt=nnx.Param)
    optimizer.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param)))
    after = {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  return before, after


@pytest.mark.parametrize("decay_all", [False, True])
def test_weight_decay_skips_norm_scales_unless_asked(decay_all):
  before, after = _one_update_without_gradient(f"adam_weight_decay_all={str(decay_all).lower()}")
  vectors = [k for k, v in before.items() if v.ndim == 1]
  matrices = [k for k, v in before.items() if v.ndim >= 2]
  assert any("norm" in k for k in vectors) and any("embed" in k for k in matrices)
  for name in matrices:  # decoupled decay: w - lr * decay * w
    np.testing.assert_allclose(after[name], before[name] * (1 - LR * DECAY), rtol=1e-6, err_msg=name)
  for name in vectors:
    expected = before[name] * (1 - LR * DECAY) if decay_all else before[name]
    np.testing.assert_allclose(after[name], expected, rtol=1e-6, err_msg=name)
