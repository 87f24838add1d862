"""Converts weights (HF checkpoint directory, GGUF file, Orbax checkpoint, or the model's default) to
an Orbax checkpoint.

    python -m maxtext.checkpoint_conversion.to_maxtext rl.yml load_parameters_path=SRC \\
        base_output_directory=DIR [weight_dtype=bfloat16]   (DIR local or gs://)

Writes DIR/0/model_params (the layout train_rl's checkpoints use) and DIR/config.yml; pass DIR as
load_parameters_path to use it.
"""

from __future__ import annotations

import logging
import sys

from maxtext.configs import cli, config_yml
from maxtext.configs.run_config import RunConfig

log = logging.getLogger(__name__)


def convert(cfg: RunConfig) -> None:
  from maxtext.checkpoint_conversion import orbax_checkpoint
  from maxtext.models.load import load_model
  from maxtext.utils import distributed, storage
  from maxtext.utils import mesh as mesh_lib

  cfg.check(distributed.initialize())  # the layout fits the job's devices
  trainer_mesh, _ = mesh_lib.create_meshes(cfg.mesh, agentic=False)
  step_dir = orbax_checkpoint.save_params(cfg.run.base_output_directory, load_model(cfg.model, trainer_mesh))
  if distributed.is_main():
    config_yml.write_yaml(cfg, storage.join(cfg.run.base_output_directory, "config.yml"))
  log.info("Wrote %s", step_dir)


def main(argv: list[str]) -> int:
  return cli.main(argv, convert)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
