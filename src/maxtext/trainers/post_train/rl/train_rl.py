"""GRPO post-training entrypoint.

    python -m maxtext.trainers.post_train.rl.train_rl rl.yml [key=value ...]

Reads the config, builds the meshes, the decoder with its weights and the tokenizer, hands them to
Tunix's GRPO learner, evaluates before and after training, and writes the run folder:
config.yml, metrics.jsonl, tensorboard/, checkpoints/ and eval.json.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from maxtext.configs import pyconfig
from maxtext.utils import cli

log = logging.getLogger("maxtext.train_rl")


def _summary(result: dict) -> dict:
  return {k: v for k, v in result.items() if k != "examples"}


def run(cfg) -> dict:
  """Trains per cfg; returns {'before': ..., 'after': ...} evaluation summaries."""
  # Heavy imports after config validation, so config errors come back at once.
  import jax  # pylint: disable=import-outside-toplevel

  from maxtext.checkpoint_conversion.load import load_model  # pylint: disable=import-outside-toplevel
  from maxtext.input_pipeline import datasets, tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  from maxtext.integration.tunix import learner as learner_lib, metrics  # pylint: disable=import-outside-toplevel
  from maxtext.trainers.post_train.rl import evaluate_rl, utils_rl  # pylint: disable=import-outside-toplevel
  from maxtext.utils import mesh as mesh_lib  # pylint: disable=import-outside-toplevel

  mesh_lib.maybe_initialize_distributed()
  trainer_mesh, sampler_mesh = mesh_lib.create_meshes(cfg)
  log.info("Devices: %s; trainer mesh %s; sampler mesh %s", jax.devices(), dict(trainer_mesh.shape), dict(sampler_mesh.shape))

  tokenizer = tokenizer_lib.tokenizer_for(cfg)
  train_ds = datasets.train_batches(cfg, tokenizer)
  eval_examples = datasets.eval_examples(cfg, tokenizer)

  actor = load_model(cfg, trainer_mesh)
  reward_fns = [utils_rl.bind_config(fn, cfg) for fn in utils_rl.DEFAULT_REWARD_FUNCTIONS]
  sinks = metrics.MetricSinks(cfg.run_dir)
  try:
    with jax.set_mesh(trainer_mesh):  # optimizer state inherits the parameters' sharding annotations
      cluster = learner_lib.build_cluster(cfg, actor, tokenizer, trainer_mesh, sampler_mesh, sinks)
      learner = learner_lib.build_learner(cfg, cluster, reward_fns)

    before = evaluate_rl.evaluate(cluster, eval_examples, cfg, "eval before")
    log.info("Before training: %s", _summary(before))
    start = time.time()
    learner.train(train_ds)
    log.info("Trained %d steps in %.1f s", cluster.actor_trainer.train_steps, time.time() - start)
    after = evaluate_rl.evaluate(cluster, eval_examples, cfg, "eval after")
    log.info("After training: %s", _summary(after))
  finally:
    sinks.close()

  results = {"before": before, "after": after}
  with open(os.path.join(cfg.run_dir, "eval.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  return {k: _summary(v) for k, v in results.items()}


def _job(cfg) -> None:
  os.makedirs(cfg.run_dir, exist_ok=True)
  pyconfig.write_yaml(cfg, os.path.join(cfg.run_dir, "config.yml"))
  print("Config keys that differ from base.yml:", file=sys.stderr)
  for key, (value, source) in sorted(cfg.overridden.items()):
    print(f"  {key} = {value!r}  ({source})", file=sys.stderr)
  print(json.dumps(run(cfg)))


def main(argv: list[str]) -> int:
  return cli.main(argv, _job)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
