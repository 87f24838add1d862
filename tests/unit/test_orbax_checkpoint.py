"""cluster.CheckpointManager: Tunix's checkpoint manager writing uncompressed arrays, which
saves without compression buffers and reads and writes checkpoints interchangeably with Tunix's."""

import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from tunix.sft import checkpoint_manager

from maxtext.integration.tunix import cluster


class _Model(nnx.Module):
  def __init__(self, seed: int):
    rngs = nnx.Rngs(seed)
    self.a = nnx.Linear(64, 32, rngs=rngs)
    self.b = nnx.Linear(32, 8, rngs=rngs)


def _weights(model) -> list[np.ndarray]:
  return [np.asarray(x) for x in nnx.to_flat_state(nnx.state(model, nnx.Param)).leaves]


def _round_trip(tmp_path, writer, reader):
  saved, restored = _Model(1), _Model(2)
  manager = writer(str(tmp_path), ocp.CheckpointManagerOptions())
  manager.save(3, saved, force=True)
  manager.close()
  manager = reader(str(tmp_path), ocp.CheckpointManagerOptions())
  step, _ = manager.maybe_restore(restored)
  manager.close()
  assert step == 3
  for want, got in zip(_weights(saved), _weights(restored)):
    np.testing.assert_array_equal(got, want)


def test_tunix_restores_ours_and_ours_restores_tunix(tmp_path):
  _round_trip(tmp_path / "ours", cluster.CheckpointManager, checkpoint_manager.CheckpointManager)
  _round_trip(tmp_path / "tunix", checkpoint_manager.CheckpointManager, cluster.CheckpointManager)


_SAVE = """
import sys, numpy as np, jax, orbax.checkpoint as ocp
from flax import nnx
from tunix.sft import checkpoint_manager
from maxtext.integration.tunix import cluster
from maxtext.trainers.post_train.rl.footprint import peak_rss_bytes
class Big(nnx.Module):
  def __init__(self):
    self.w = nnx.List([nnx.Param(jax.random.normal(jax.random.key(i), (1024, 1024))) for i in range(100)])
model = Big()  # 100 float32 arrays of 4 MiB: 420 MB of incompressible values
jax.block_until_ready(nnx.state(model))
cls = cluster.CheckpointManager if sys.argv[2] == "ours" else checkpoint_manager.CheckpointManager
manager = cls(sys.argv[1], ocp.CheckpointManagerOptions())
before = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS:"))) * 1024
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) back to the current RSS
manager.save(1, model, force=True)
manager.close()
print(int(peak_rss_bytes() - before))
"""


def _save_growth(tmp_path, which: str) -> int:
  out = subprocess.run(
    [sys.executable, "-c", _SAVE, str(tmp_path / which), which], capture_output=True, text=True, check=True
  )
  return int(out.stdout.split()[-1])


def test_saving_needs_no_buffers_beyond_the_state(tmp_path):
  """Saving 420 MB of float32 weights: Tunix's compressing manager holds a large share of them in
  compression buffers at once; ours writes them from the arrays."""
  ours, tunix = _save_growth(tmp_path, "ours"), _save_growth(tmp_path, "tunix")
  assert ours < 60e6, ours
  assert tunix > 150e6, tunix
