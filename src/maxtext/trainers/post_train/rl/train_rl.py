"""GRPO post-training entrypoint.

    python -m maxtext.trainers.post_train.rl.train_rl rl.yml [key=value ...]

Reads the config, builds the meshes, the decoder with its weights and the tokenizer, hands them to
Tunix's GRPO learner, evaluates before and after training, and writes the run folder:
config.yml, metrics.jsonl, tensorboard/, checkpoints/, eval.json, report.md with plots/ and, with
export_hf=true, the trained policy as an HF checkpoint.
"""

from __future__ import annotations

import sys

from maxtext.configs import cli
from maxtext.configs.run_config import RunConfig


def run(cfg: RunConfig) -> dict:
  """Trains per cfg; returns the evaluation summaries before, during (every eval_interval steps)
  and after training."""
  # Heavy imports after config validation, so config errors come back at once.
  from maxtext.trainers.post_train.rl import run_folder
  from maxtext.trainers.post_train.rl.training_run import TrainingRun
  from maxtext.utils import distributed

  cfg.check(distributed.initialize())  # the layout fits the job's devices; its processes agree on the lock
  with run_folder.locked(cfg.run):  # one run writes the folder; exit 2 naming the run that holds it
    job = TrainingRun(cfg)  # run folder, meshes, data, model, cluster, learner; resumes a rerun
    with job.closing():  # a full disk or a second signal: one line naming the checkpoint kept
      job.evaluate_before()
      job.train()
      job.evaluate_after()
      job.export()
  return job.summary()


def _job(cfg: RunConfig) -> list[dict]:
  print("Config keys that differ from base.yml:", file=sys.stderr)
  for key, (value, source) in sorted(cfg.overridden.items()):
    print(f"  {key} = {value!r}  ({source})", file=sys.stderr)
  return [run(cfg)]


def main(argv: list[str]) -> int:
  return cli.main(argv, _job)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
