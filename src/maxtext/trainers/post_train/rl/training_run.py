"""One training run (GRPO or PPO), in the order train_rl runs it: set up, evaluate, train, evaluate, save.

`TrainingRun(cfg)` sets up: the rewards (a user's reward file runs first, so its errors come at
once), the run folder (refusing a rerun that changes the settings that shape training, or a folder
without room for two checkpoints; resuming from its latest complete checkpoint), the meshes,
tokenizer, data, the decoder with its weights, Tunix's cluster and the learner the config selects;
config.yml is written last, so only a run that goes on to train with its settings writes it.
Before each of the actor's checkpoint requests `_check_update` stops the run, saving nothing, on a
non-finite loss, KL, gradient norm or reward logged so far or non-finite parameters or optimizer
state after the update; between training
steps `_between_steps` stops it on a non-finite logged value or on a signal (both judged by the run
guard, run_guard.py, and raised out of Tunix's training loop, which has no other way out), uploads
the run folder when it is on a bucket and, in standard GRPO, evaluates every eval_interval steps. A
reward function that fails mid-run raises its InputError out of the training loop once the
checkpoints already being saved have landed. `closing` runs the rest and closes the run: a write to
the run folder that finds no space left on its device stops it with shutdown.DiskFull, a run folder
on a bucket that stops answering with shutdown.StorageLost, and a second signal in training (or a
SIGINT outside it) with shutdown.Abandoned, each once the checkpoint saves under way have landed or
failed, and naming the checkpoint a rerun resumes from.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from typing import Any

import jax
from flax import nnx

from maxtext import tasks
from maxtext.checkpoint_conversion import orbax_checkpoint, to_huggingface
from maxtext.configs.run_config import RunConfig
from maxtext.configs.sections import DataSection
from maxtext.input_pipeline import chat_parser, datasets, rewards, templates
from maxtext.input_pipeline import tokenizer as tokenizer_lib
from maxtext.integration.tunix import agentic as agentic_lib
from maxtext.integration.tunix import cluster as cluster_lib
from maxtext.integration.tunix import learner as learner_lib
from maxtext.integration.tunix import metrics, rollout_setup, tools, trajectories, user_agent
from maxtext.integration.tunix import ppo as ppo_lib
from maxtext.models import critic as critic_lib
from maxtext.models.load import critic_from_reward_model, load_model
from maxtext.rl import reward_model
from maxtext.rl.episode import EpisodeLog
from maxtext.trainers.post_train.rl import evaluate_rl, footprint, progress, report, run_guard
from maxtext.trainers.post_train.rl.run_folder import RunFolder
from maxtext.utils import distributed, heap, shutdown, storage, worker_pool
from maxtext.utils import mesh as mesh_lib
from maxtext.utils.errors import InputError
from maxtext.utils.steps import Steps

log = logging.getLogger(__name__)


def _batches(cfg: RunConfig, data: DataSection, training) -> tuple[Any, Any]:
  """(training batches, reserve batches for dynamic sampling or None) of the training examples of
  `data`; in agentic GRPO their prompts are the user turn only."""
  seed = data.data_shuffle_seed
  train_ds: Any = datasets.train_batches(training, cfg.train, seed, f"dataset_name={data.dataset_name}")
  reserve_ds: Any = datasets.reserve_batches(training, cfg.train, seed) if cfg.algorithm.dynamic_sampling else None
  if cfg.agentic.use_agentic_rollout:
    train_ds = agentic_lib.user_turn_batches(train_ds)
    reserve_ds = reserve_ds and agentic_lib.user_turn_batches(reserve_ds)
  return train_ds, reserve_ds


class TrainingRun:
  def __init__(self, cfg: RunConfig):
    agentic = cfg.agentic.use_agentic_rollout
    distributed.initialize()  # before anything asks JAX about its devices
    rollout_args = {  # what a TRL rollout_func reads of its trainer's args
      "num_generations": cfg.algorithm.num_generations,
      "max_completion_length": cfg.sampling.max_response_length,
      "temperature": cfg.sampling.decode_sampling_temperature,
      "top_p": cfg.sampling.decode_sampling_top_p,
      "top_k": cfg.sampling.decode_sampling_top_k,
    }
    self._user_agent = (
      user_agent.load(cfg.agent, cfg.environment, rollout_args) if agentic and cfg.agent.agent else None
    )  # the agent's file fails fast
    verifiers = self._user_agent.verifiers if self._user_agent else None
    data = verifiers.data_section(cfg.data) if verifiers else cfg.data  # a verifiers environment's dataset
    self.task = task = tasks.select(data.dataset_name)
    reward_set = rewards.reward_functions(task, cfg.task, cfg.maxtext_view())  # so does the reward file
    self.cfg = cfg
    self.steps = steps = Steps.of(cfg.train, cfg.algorithm)
    self.folder = folder = RunFolder(cfg.run, steps)
    folder.check_config(cfg)
    folder.check_space(footprint.checkpoint_bytes(cfg))
    agent_workers = self._user_agent.worker_bytes() if self._user_agent else 0.0
    self._expected_peak = footprint.log_estimate(cfg, agent_workers)
    footprint.check_fits(
      self._expected_peak,
      cfg.run.ignore_memory_estimate,
      footprint.host_memory_bytes(),
      footprint.device_memory_bytes(),
    )
    heap.release_after_compiling()
    trainer_mesh, sampler_mesh = mesh_lib.create_meshes(cfg.mesh, agentic)
    log.info(
      "Devices: %s; trainer mesh %s; sampler mesh %s", jax.devices(), dict(trainer_mesh.shape), dict(sampler_mesh.shape)
    )
    self.tokenizer = tokenizer = tokenizer_lib.tokenizer_for(cfg.model)
    template = templates.PromptTemplate(cfg.task, tokenizer, task.template, agentic)
    examples = datasets.Examples(data, template, cfg.sampling.max_prompt_length, cfg.maxtext_view())
    render, agentic_parts = None, None
    if agentic:
      agentic_parts = (chat_parser.for_config(cfg.agentic, template), tools.tool_map(cfg.tools))
      render = (
        verifiers.first_prompt_renderer(agentic_parts[0])
        if verifiers
        else trajectories.first_prompt_renderer(cfg.tools, *agentic_parts)
      )
    training = examples.training(render)
    if not (self._user_agent and self._user_agent.rollout_args is not None):  # a rollout_func posts more fields
      reward_set.check_fields(training[0])  # a reward function's parameter the data lacks fails before the model
    self.train_ds, reserve_ds = _batches(cfg, data, training)
    evaluations = cfg.eval
    self.eval_examples = (
      examples.evaluation(evaluations.num_test_batches * evaluations.eval_batch_size)
      if evaluations.num_test_batches
      else []
    )
    self.score = evaluate_rl.scorer(task, cfg.task)
    actor = load_model(cfg.model, trainer_mesh)
    critic = self._critic(actor, trainer_mesh)
    if cfg.reward_model.load_parameters_path:
      scorer = reward_model.load_reward_model(cfg.reward_model, cfg.model, template, trainer_mesh)
      reward_set = reward_set.with_function(scorer.reward_function(), cfg.reward_model.weight, cfg.reward_model.alone)

    resumed = folder.resume()
    if resumed:
      folder.check_layout(resumed, cfg.model.scan_layers)
      folder.check_shapes(resumed, orbax_checkpoint.param_shapes(actor))
    self.results = folder.previous_results(resumed)
    run = cfg.run
    wandb = None
    if run.wandb_project and distributed.is_main():
      wandb = metrics.WandbRun(run.wandb_project, run.run_name, folder.path, cfg.public())
    self.guard = run_guard.RunGuard(steps)
    self._abandoned = ""  # what a second signal cut short in training
    self._settled = False  # whether the checkpoints settled after a fault (closing)
    self.sinks = metrics.MetricSinks(
      folder.path,
      lag=cfg.agentic.off_policy_steps + 2,
      wandb=wandb,
      steps=steps,
      on_scalar=self.guard.observe,
      on_row=progress.StepLines(cfg.train.num_batches),
    )
    try:
      with jax.set_mesh(trainer_mesh):  # optimizer state inherits the parameters' sharding annotations
        self.cluster = cluster_lib.build_cluster(
          actor,
          cluster_lib.reference_model(cfg.algorithm, actor, cfg.sampling.max_prompt_length),
          tokenizer,
          trainer_mesh,
          sampler_mesh,
          cluster_lib.training_config(run, cfg.train, cfg.algorithm, self.sinks, folder.checkpoints),
          rollout_setup.rollout_engine(cfg.sampling),
          rollout_setup.rollout_configs(
            cfg.sampling, evaluations.eval_sampling_strategy, agentic, tokenizer.eos_token_id
          ),
          before_save=self._check_update,
        )
      reserve = reserve_ds.__getitem__ if reserve_ds is not None else None
      with jax.set_mesh(trainer_mesh), shutdown.handlers_kept():
        self.learner = self._build_learner(reward_set, reserve, agentic_parts, critic, trainer_mesh)
    except BaseException:
      self.close()
      raise
    folder.write_config(cfg)  # the inputs it names have loaded and the checkpoint it resumes from fits

  def _critic(self, actor, mesh) -> critic_lib.Critic | None:
    """PPO's critic (None for GRPO): critic.load_parameters_path's reward model, else the policy's
    starting weights (taken before a resumed run restores the actor's)."""
    cfg = self.cfg
    if cfg.algorithm.algorithm != "ppo":
      return None
    if cfg.critic.load_parameters_path:
      critic = critic_from_reward_model(cfg.critic.load_parameters_path, cfg.model, mesh)
    else:
      critic = critic_lib.from_policy(actor, cfg.model.init_weights_seed + 1)
    devices = sorted({d.id for x in jax.tree.leaves(nnx.state(critic)) for d in x.sharding.device_set})
    log.info("PPO's critic laid out on the trainer mesh %s, devices %s", dict(mesh.shape), devices)
    return critic

  def _build_learner(self, reward_set: rewards.RewardSet, reserve, agentic_parts, critic, trainer_mesh):
    """The learner of the run's mode on the cluster (agentic_parts: the chat parser and tool map of
    agentic GRPO, else None; critic: PPO's, on trainer_mesh, else None). Process 0 writes the
    episode log."""
    cfg = self.cfg
    episode_log = EpisodeLog(self.folder.episodes, self.tokenizer.decode) if jax.process_index() == 0 else None
    if critic is not None:
      return ppo_lib.build_learner(
        cfg.train,
        cfg.algorithm,
        cfg.critic,
        cfg.sampling,
        self.cluster,
        reward_set,
        critic,
        trainer_mesh,
        self._before_step,
        episode_log,
      )
    if agentic_parts is None:
      return learner_lib.build_learner(
        cfg.train, cfg.algorithm, cfg.sampling, self.cluster, reward_set, self._before_step, reserve, episode_log
      )
    parser, tool_map = agentic_parts
    return agentic_lib.build_learner(
      cfg.train,
      cfg.algorithm,
      cfg.sampling,
      cfg.agentic,
      cfg.tools,
      self.cluster,
      reward_set,
      parser,
      tool_map,
      before_step=self._between_steps,
      reserve=reserve,
      user_agent=self._user_agent,
      model_name=cfg.model.model_name,
      episode_log=episode_log,
    )

  def evaluate(self, desc: str) -> dict | None:
    """The evaluation's result; None with num_test_batches=0 (no evaluation)."""
    if not self.eval_examples:
      log.info("%s: none (num_test_batches=0)", desc)
      return None
    result = evaluate_rl.evaluate(self._generate, self.eval_examples, self.score, self.cfg.eval, desc)
    log.info("%s: %s", desc, evaluate_rl.summary_of(result))
    return result

  def _generate(self, prompts: list[str]) -> list[str]:
    """Evaluation completions; where each process has its own sampler, each generates every
    process_count-th prompt and the processes exchange them."""
    generate = lambda some: self.cluster.generate(some, mode=rollout_setup.Mode.EVAL).text if some else []
    if not mesh_lib.process_local(self.cluster.r2m[cluster_lib.Role.ROLLOUT]):
      return generate(prompts)
    count, texts = jax.process_count(), list(prompts)
    for index, part in enumerate(distributed.gather_objects(generate(prompts[jax.process_index() :: count]))):
      texts[index::count] = part
    return texts

  def evaluate_before(self) -> None:
    """Evaluates the initial policy, unless a resumed run did already."""
    if self.results["before"] is None:
      self.results["before"] = self.evaluate("eval before")
      self.folder.write_results(self.results)

  def _between_steps(self, steps_done: int) -> None:
    """Stops on a non-finite loss, KL or reward (process 0 logs them) or on a signal to any process;
    every process takes the same branch. On a bucket, the run folder is uploaded."""
    self.folder.save()
    self.guard.between_steps(steps_done)

  def _check_update(self, update: int, model, optimizer) -> None:
    """Before the actor's checkpoint request for optimizer update `update` (Tunix makes one after
    every update, saved or not): stops the run, saving nothing, when a watched value logged so far
    or the updated parameters or optimizer state are not finite. Every process takes the same
    branch. The metrics rows of the steps before this one then reach the disk before its
    checkpoint: in standard GRPO they are final and written, in agentic GRPO (late scalars may
    follow) they are mirrored to metrics.jsonl.pending."""
    self.guard.check_update(update, model, optimizer)
    if not self.steps.ends_step(update):
      return
    if self.cfg.agentic.use_agentic_rollout:
      self.sinks.save_held()
    else:
      self.sinks.step_logged(self.steps.of_update(update) - 1)

  def _stop_non_finite(self, e: shutdown.NonFiniteError) -> None:
    """Ends a run stopped at step e.step by a non-finite value: the metrics rows and the saves of the
    steps before it land, checkpoints of e.step on (saved before a late-logged value showed) are set
    aside, and the NonFiniteError is raised again naming the checkpoint a rerun resumes from. A step
    of 0 (a reward found non-finite before its update) is the step the run stopped at, the first not
    trained."""
    if not e.step:
      e = shutdown.NonFiniteError(e.name, self._trained() + 1)
    self.sinks.stopped_after(e.step - 1)
    self.cluster.actor_trainer.checkpoint_manager.close()  # waits for asynchronous saves to land
    self.folder.keep_checkpoints_through(e.step - 1)
    raise shutdown.NonFiniteError(e.name, e.step, max(self.folder.saved_steps(), default=0)) from None

  def _before_step(self, steps_done: int) -> None:
    """_between_steps, and the evaluation every eval_interval steps (standard GRPO)."""
    self._between_steps(steps_done)
    interval = self.cfg.eval.eval_interval
    if self.eval_examples and interval and steps_done and steps_done % interval == 0:
      result = self.evaluate(f"eval at step {steps_done}")
      assert result is not None  # there are evaluation examples
      self.results["during"].append({"step": steps_done, **result})
      self.folder.write_results(self.results)

  def train(self) -> None:
    sinks, cluster = self.sinks, self.cluster
    start, compiled = time.time(), sinks.compile_clock()
    done, total = self._trained(), self.cfg.train.num_batches
    if done < total:
      log.info(
        "Training steps %d to %d of %d; the first also compiles the training and sampling programs, so it takes longer",
        done + 1,
        total,
        total,
      )
    sinks.restart_clock()
    self.guard.stop.progress = self._trained
    with self.guard.stop:
      try:
        try:
          self.learner.train(self.train_ds)
        except shutdown.Interrupted as e:
          sinks.stopped_after(e.step)
          with shutdown.signals_noted():
            cluster.close()  # flushes the finished steps' metrics and checkpoints the last one
          raise
      except KeyboardInterrupt:  # a second signal: in a step, or once the step in flight at the first had ended
        trained, first = self._trained(), self.guard.stop.first_at
        stopping = first is not None and trained > first
        self._abandoned = (
          f"after step {trained}, while the run was stopping"
          if stopping
          else f"during step {trained + 1}, which is abandoned"
        )
        raise
      except shutdown.NonFiniteError as e:
        self._stop_non_finite(e)
      except InputError:  # a reward function's: the checkpoints saved before it land whole
        cluster.actor_trainer.checkpoint_manager.close()
        raise
    trained = self._trained()
    try:
      self._between_steps(trained)  # a non-finite value at the last step: no later step boundary saw it
    except shutdown.NonFiniteError as e:
      self._stop_non_finite(e)
    if trained == done:
      log.info("Nothing left to train: the run's %d of %d steps were trained before this rerun", done, total)
    else:
      log.info(
        "Trained steps %d to %d in %.1f s (%.1f s of it compiling)",
        done + 1,
        trained,
        time.time() - start,
        sinks.compile_clock() - compiled,
      )
    footprint.log_peak(self._expected_peak)

  def evaluate_after(self) -> None:
    """Evaluates the trained policy and the paired gain over the initial one."""
    results = self.results
    results["after"] = self.evaluate("eval after")
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
    self.folder.write_results(results)

  def export(self) -> None:
    """The trained policy as an HF checkpoint, with export_hf=true."""
    run = self.cfg.run
    if run.export_hf:
      model = self.cluster.actor_trainer.model
      path = run.hf_output_path or os.path.join(self.folder.path, "hf")
      to_huggingface.export(model, self.cfg.model, self.tokenizer, path)

  def _trained(self) -> int:
    return self.steps.done(self.cluster.actor_trainer.train_steps)

  def _fault(self, e: BaseException | None) -> type[shutdown.RunStopped] | None:
    """The stop `closing` turns the exception into: Abandoned for a KeyboardInterrupt, DiskFull for a
    write that found no space left, StorageLost for a bucket run folder that stopped answering
    (Orbax's writes fail as ValueErrors that carry the OS or TensorStore error's text); None for
    anything else."""
    if isinstance(e, KeyboardInterrupt):
      return shutdown.Abandoned
    if e is None or isinstance(e, shutdown.RunStopped):
      return None
    if storage.no_space(e):
      return shutdown.DiskFull
    if self.folder.lost or (storage.is_url(self.folder.url) and storage.unreachable(e)):
      return shutdown.StorageLost
    return None

  def _settle_checkpoints(self, fault: type[shutdown.RunStopped]) -> None:
    """After a fault: the metrics rows of steps not trained are dropped at close, the checkpoint
    saves under way land (or fail), and (unless the bucket is lost) what unfinished ones left is
    deleted. A lost bucket is not asked again: the run folder uploads nothing more."""
    self._settled = True
    self.folder.lost = self.folder.lost or fault is shutdown.StorageLost
    self.sinks.stopped_after(self._trained())
    try:
      self.cluster.actor_trainer.checkpoint_manager.close()
    except Exception as e:  # noqa: BLE001 (it too may find the disk full or the bucket gone)
      log.warning("A checkpoint being saved did not finish: %s", " ".join(str(e).split())[:300])
    if fault is not shutdown.StorageLost:
      self.folder.drop_unfinished_checkpoints()

  def _close_after(self, e: BaseException | None) -> None:
    """Closes the run after the block ended with `e` (None: it completed), with a signal logged
    meanwhile; after a fault (_fault) the checkpoints settle first, with a signal killing the process."""
    fault = self._fault(e)
    if fault is None:
      with shutdown.signals_noted():
        self.close()
      return
    with shutdown.signals_kill():
      self._settle_checkpoints(fault)
      self.close()

  def _kept_on_bucket(self) -> int:
    """The newest checkpoint this run's manager saved on the bucket with its steps' metrics rows
    uploaded (0: none); read without asking the bucket."""
    updates = self.cluster.actor_trainer.checkpoint_manager.saved_updates()
    saved = [self.steps.done(u) for u in updates if self.steps.ends_step(u)]
    rows = self.folder.uploaded_steps
    return max((s for s in saved if all(k in rows for k in range(1, s + 1))), default=0)

  @contextlib.contextmanager
  def closing(self):
    """Runs the block, then closes the run (`close`). A fault in the block or in closing (`_fault`)
    ends the run with its shutdown.RunStopped, once the checkpoint saves under way have landed or
    failed, naming the checkpoint a rerun resumes from; other errors pass as they are."""
    try:
      try:
        yield
      except BaseException as e:
        self._close_after(e)
        raise
      self._close_after(None)
    except BaseException as e:
      fault = self._fault(e)
      if fault is None:
        raise
      if not self._settled:  # closing itself met the fault
        with shutdown.signals_kill():
          self._settle_checkpoints(fault)
      if fault is shutdown.StorageLost:
        reason = storage.reason(e)[:300]
        raise shutdown.StorageLost(self.folder.url, reason, self._kept_on_bucket()) from e
      kept = self.folder.drop_unfinished_checkpoints()
      if fault is shutdown.DiskFull:
        raise shutdown.DiskFull(self.folder.url, kept) from e
      worker_pool.stop_all()  # user code in workers (a reward function that never returns) holds nothing up
      raise shutdown.Abandoned(self.guard.stop.second or signal.SIGINT, self._abandoned, kept) from None

  def close(self) -> None:
    """Flushes the metric sinks, writes report.md (process 0), uploads the run folder (also where
    the sinks could not write: their first failure is raised after) and stops the environment server
    the run started."""
    try:
      self.sinks.close()
    finally:
      try:
        if distributed.is_main():
          _write_report(self.folder.path)
        self.folder.save()
      finally:
        if self._user_agent is not None:
          self._user_agent.close()

  def summary(self) -> dict:
    """The evaluation summaries before, during (every eval_interval steps) and after training."""
    results = self.results
    return {
      "before": evaluate_rl.summary_of(results["before"]),
      "during": [evaluate_rl.summary_of(r) for r in results["during"]],
      "after": evaluate_rl.summary_of(results["after"]),
      "gain": results.get("gain"),
    }


def _write_report(run_dir: str) -> None:
  """report.md and its plots; a failure is logged, never allowed to fail the run."""
  try:
    log.info("Wrote %s", report.write(run_dir)["report"])
  except Exception as e:
    log.warning(
      "report.md not written (rebuild it with python -m maxtext.trainers.post_train.rl.report %s): %r", run_dir, e
    )
