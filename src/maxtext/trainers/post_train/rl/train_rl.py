"""GRPO post-training entrypoint.

    python -m maxtext.trainers.post_train.rl.train_rl rl.yml [key=value ...]

Reads the config, builds the meshes, the decoder with its weights and the tokenizer, hands them to
Tunix's GRPO learner, evaluates before and after training, and writes the run folder:
config.yml, metrics.jsonl, tensorboard/, checkpoints/, eval.json, report.md with plots/ and, with
export_hf=true, the trained policy as an HF checkpoint.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from maxtext.configs import cli
from maxtext.utils import shutdown
from maxtext.utils.errors import ConfigError

log = logging.getLogger("maxtext.train_rl")


def _write_report(run_dir: str) -> None:
  """report.md and its plots; a failure is logged, never allowed to fail the run."""
  from maxtext.trainers.post_train.rl import report

  try:
    log.info("Wrote %s", report.write(run_dir)["report"])
  except Exception as e:
    log.warning(
      "report.md not written (rebuild it with python -m maxtext.trainers.post_train.rl.report %s): %r", run_dir, e
    )


def run(cfg) -> dict:
  """Trains per cfg; returns the evaluation summaries before, during (every eval_interval steps)
  and after training."""
  # Heavy imports after config validation, so config errors come back at once.
  import jax
  import numpy as np

  from maxtext.checkpoint_conversion import to_huggingface
  from maxtext.input_pipeline import datasets
  from maxtext.input_pipeline import tokenizer as tokenizer_lib
  from maxtext.integration.tunix import agentic, chat_parser, losses, metrics, rollout, trajectories
  from maxtext.integration.tunix import cluster as cluster_lib
  from maxtext.integration.tunix import learner as learner_lib
  from maxtext.models.load import load_model
  from maxtext.trainers.post_train.rl import evaluate_rl, footprint, tools, utils_rl
  from maxtext.trainers.post_train.rl.run_folder import RunFolder
  from maxtext.utils import distributed, heap
  from maxtext.utils import mesh as mesh_lib
  from maxtext.utils.steps import Steps

  losses.check(cfg)
  distributed.initialize()  # before anything asks JAX about its devices
  folder = RunFolder(cfg)
  folder.write_config(cfg)
  expected = footprint.log_estimate(cfg)
  heap.release_after_compiling()
  if cfg.rl.use_agentic_rollout and jax.process_count() > 1:
    raise ConfigError(
      f"rl.use_agentic_rollout=true: not supported across {jax.process_count()} processes (its "
      "rollouts run on threads whose order differs between processes, while every process must run "
      "the sampler's programs in the same order); use rl.use_agentic_rollout=false"
    )
  trainer_mesh, sampler_mesh = mesh_lib.create_meshes(cfg)
  log.info(
    "Devices: %s; trainer mesh %s; sampler mesh %s", jax.devices(), dict(trainer_mesh.shape), dict(sampler_mesh.shape)
  )

  tokenizer = tokenizer_lib.tokenizer_for(cfg)
  if cfg.rl.use_agentic_rollout:
    tool_map = tools.tool_map(cfg)
    parser = chat_parser.for_config(cfg, tokenizer)
    train_ds = datasets.train_batches(cfg, tokenizer, trajectories.first_prompt_renderer(cfg, parser, tool_map))
  else:
    train_ds = datasets.train_batches(cfg, tokenizer)
  eval_examples = datasets.eval_examples(cfg, tokenizer) if cfg.num_test_batches else []
  reward_fns = utils_rl.reward_functions(cfg)
  actor = load_model(cfg, trainer_mesh)

  results = folder.previous_results(folder.resume())
  wandb = None
  if cfg.wandb_project and distributed.is_main():
    wandb = metrics.WandbRun(cfg.wandb_project, cfg.run_name, folder.path, cfg.to_dict())
  sinks = metrics.MetricSinks(folder.path, lag=cfg.rl.off_policy_steps + 2, wandb=wandb, steps=Steps.of(cfg))
  try:
    with jax.set_mesh(trainer_mesh):  # optimizer state inherits the parameters' sharding annotations
      cluster = cluster_lib.build_cluster(cfg, actor, tokenizer, trainer_mesh, sampler_mesh, sinks, folder.checkpoints)

    def evaluate(desc: str) -> dict | None:
      """The evaluation's result; None with num_test_batches=0 (no evaluation)."""
      if not eval_examples:
        log.info("%s: none (num_test_batches=0)", desc)
        return None
      generate = lambda prompts: cluster.generate(prompts, mode=rollout.Mode.EVAL).text
      result = evaluate_rl.evaluate(generate, eval_examples, cfg, desc)
      log.info("%s: %s", desc, evaluate_rl.summary_of(result))
      return result

    stop = shutdown.GracefulStop()

    def guard(steps_done: int) -> None:
      """Between steps: stop on a non-finite loss, KL or reward (process 0 logs them), or on a signal to
      any process; every process takes the same branch. On a bucket, the run folder is uploaded."""
      folder.save()
      bad = sinks.nonfinite()
      flags = distributed.gather(np.array([bad[1] if bad else 0, stop.signum or 0]))
      step, signum = int(flags[0, 0]), int(flags[:, 1].max())
      if step:
        cluster.actor_trainer.checkpoint_manager.close()  # waits for asynchronous saves to land
        folder.keep_checkpoints_through(step - 1)
        raise shutdown.NonFiniteError(
          bad[0] if bad else "a watched value (see process 0)", step, max(folder.saved_steps(), default=0)
        )
      if signum:
        raise shutdown.Interrupted(signum, steps_done)

    def before_step(steps_done: int) -> None:
      guard(steps_done)
      if eval_examples and cfg.eval_interval and steps_done and steps_done % cfg.eval_interval == 0:
        result = evaluate(f"eval at step {steps_done}")
        assert result is not None  # there are evaluation examples
        results["during"].append({"step": steps_done, **result})
        folder.write_results(results)

    with jax.set_mesh(trainer_mesh), shutdown.handlers_kept():
      if cfg.rl.use_agentic_rollout:
        learner = agentic.build_learner(cfg, cluster, reward_fns, parser, tool_map, before_step=guard)
        train_ds = agentic.user_turn_batches(train_ds)
      else:
        reserve = datasets.reserve_batches(cfg, tokenizer).__getitem__ if cfg.rl.dynamic_sampling else None
        learner = learner_lib.build_learner(cfg, cluster, reward_fns, before_step, reserve)
    if results["before"] is None:
      results["before"] = evaluate("eval before")
      folder.write_results(results)
    start, compiled = time.time(), sinks.compile_clock()
    sinks.restart_clock()
    with stop:
      try:
        learner.train(train_ds)
      except shutdown.Interrupted as e:
        sinks.stopped_after(e.step)
        cluster.close()  # flushes the finished steps' metrics and checkpoints the last one
        raise
    trained = Steps.of(cfg).done(cluster.actor_trainer.train_steps)
    guard(trained)  # a non-finite value at the last step: no later step boundary saw it
    log.info(
      "Trained %d steps in %.1f s (%.1f s of it compiling)",
      trained,
      time.time() - start,
      sinks.compile_clock() - compiled,
    )
    footprint.log_peak(expected)
    results["after"] = evaluate("eval after")
    results["gain"] = evaluate_rl.paired_gain(results["before"], results["after"])
    if results["gain"]:
      g = results["gain"]
      log.info(
        "Accuracy %.3f before, %.3f after: gain %+.3f, 95%% interval [%+.3f, %+.3f] (paired bootstrap over %d "
        "questions; %d improved, %d worsened)",
        results["before"]["accuracy"],
        results["after"]["accuracy"],
        g["gain"],
        g["ci95_low"],
        g["ci95_high"],
        g["num_examples"],
        g["improved"],
        g["worsened"],
      )
    folder.write_results(results)
    if cfg.export_hf:
      to_huggingface.export(
        cluster.actor_trainer.model, cfg, tokenizer, cfg.hf_output_path or os.path.join(folder.path, "hf")
      )
  finally:
    sinks.close()
    if distributed.is_main():
      _write_report(folder.path)
    folder.save()
  return {
    "before": evaluate_rl.summary_of(results["before"]),
    "during": [evaluate_rl.summary_of(r) for r in results["during"]],
    "after": evaluate_rl.summary_of(results["after"]),
    "gain": results.get("gain"),
  }


def _job(cfg) -> list[dict]:
  print("Config keys that differ from base.yml:", file=sys.stderr)
  for key, (value, source) in sorted(cfg.overridden.items()):
    print(f"  {key} = {value!r}  ({source})", file=sys.stderr)
  return [run(cfg)]


def main(argv: list[str]) -> int:
  return cli.main(argv, _job)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
