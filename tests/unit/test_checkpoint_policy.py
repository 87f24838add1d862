"""Checkpoints every checkpoint_period steps (cluster.save_policy): Orbax's default policy also saves
the first step, a checkpoint nobody asked for whose write overlapped the next step's rollout."""

import numpy as np
import orbax.checkpoint as ocp

from maxtext.integration.tunix import cluster


def _saved_steps(tmp_path, options) -> list[int]:
  with ocp.CheckpointManager(tmp_path, options=options) as manager:
    for step in range(1, 6):
      manager.save(step, args=ocp.args.StandardSave({"w": np.full(3, step, np.float32)}))
    manager.wait_until_finished()
    return sorted(manager.all_steps())


def test_saves_every_interval_only(tmp_path):
  assert _saved_steps(tmp_path / "ours", ocp.CheckpointManagerOptions(save_decision_policy=cluster.save_policy(2))) == [
    2,
    4,
  ]
  assert _saved_steps(tmp_path / "orbax", ocp.CheckpointManagerOptions(save_interval_steps=2)) == [1, 2, 4]
