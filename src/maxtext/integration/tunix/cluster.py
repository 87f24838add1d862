"""Builds Tunix's RLCluster: actor, reference, optimizer, meshes, rollout engine, checkpointing and
metric sinks, and makes what we change in the cluster and its actor trainer: the checkpoint manager,
the end-of-training save, the optimizer's layout, in-place gradient accumulation, the reference's
scoring and global input batches.

The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.sft import checkpoint_manager, hooks, metrics_logger
from tunix.sft import utils as sft_utils

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.configs.sections import AlgorithmSection, RunSection, TrainSection
from maxtext.integration.tunix import accumulation, metrics, rollout
from maxtext.models import builder
from maxtext.models.decoder import Decoder
from maxtext.models.shared_prefix import SharedPrefix
from maxtext.utils import heap, storage
from maxtext.utils import mesh as mesh_lib
from maxtext.utils.errors import InputError
from maxtext.utils.steps import Steps

Role = rl_cluster_lib.Role


def optimizer(train: TrainSection, steps: Steps) -> optax.GradientTransformation:
  """AdamW on a warmup-cosine schedule over the run's updates, after global-norm clipping. Weight
  decay applies to matrices and embeddings only, as HF's Trainer does (norm scales and biases, the
  one-dimensional parameters, are not decayed), unless adam_weight_decay_all. An update whose
  gradient is zero (no sample of the step carries a learning signal) does not move the weights
  (unless_without_signal)."""
  return unless_without_signal(
    adamw(train, warmup_cosine(train.learning_rate, train.warmup_steps_fraction, steps.updates))
  )


def warmup_cosine(peak: float, warmup_fraction: float, updates: int) -> optax.Schedule:
  """The learning rate of each of `updates` updates: from 0 linearly to `peak` over the first
  int(warmup_fraction * updates), then a cosine decay to 0 at the last."""
  warmup = int(warmup_fraction * updates)
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=max(updates, warmup + 1), end_value=0.0
  )


def adamw(train: TrainSection, learning_rate: optax.ScalarOrSchedule) -> optax.GradientTransformation:
  """AdamW with the run's betas and weight decay (of matrices and embeddings only, unless
  adam_weight_decay_all) at `learning_rate`, after global-norm clipping at gradient_clipping_threshold."""
  mask = None if train.adam_weight_decay_all else (lambda params: jax.tree.map(lambda p: jnp.ndim(p) >= 2, params))
  tx = optax.adamw(learning_rate, b1=train.adam_b1, b2=train.adam_b2, weight_decay=train.adam_weight_decay, mask=mask)
  if train.gradient_clipping_threshold > 0:
    tx = optax.chain(optax.clip_by_global_norm(train.gradient_clipping_threshold), tx)
  return tx


def unless_without_signal(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """tx, except that a gradient of all zeros is no update: a GRPO step whose groups all scored alike
  (and no KL term), or a step of PPO's critic warmup (the policy trains on no token), has nothing to
  learn from, while AdamW would still move the policy with its momentum and weight decay. The
  weights stay, and so do the state's step counts (AdamW's bias correction, the learning-rate
  schedule's step), so the schedule counts the updates that moved the policy: after a critic warmup
  the policy's first update is a fresh AdamW's first, at the first rate of its warmup. The moments
  take the zero gradient (they decay; zero ones, before any update, stay zero), rather than being
  kept. Why: docs/decisions.md, "No update without a learning signal"."""

  def update(grads, state, params=None):
    updates, new_state = tx.update(grads, state, params)
    moves = optax.global_norm(grads) > 0
    counted = jax.tree_util.tree_map_with_path(
      lambda path, new, old: jnp.where(moves, new, old) if _is_count(path) else new, new_state, state
    )
    return jax.tree.map(lambda u: u * moves.astype(u.dtype), updates), counted

  return optax.GradientTransformation(tx.init, update)


def _is_count(path) -> bool:
  """Whether an optax state leaf is a step count (the `count` of AdamW's and a schedule's state)."""
  return bool(path) and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "count"


def save_policy(interval: int) -> ocp.checkpoint_managers.SaveDecisionPolicy:
  """Every `interval` updates (and on preemption); Orbax's default also saves the first update, a
  checkpoint nobody asked for whose write overlapped the next step's rollout."""
  managers = ocp.checkpoint_managers
  return managers.AnySavePolicy([managers.FixedIntervalPolicy(interval), managers.PreemptionCheckpointingPolicy()])


def reference_model(algorithm: AlgorithmSection, actor: Decoder, max_prompt_length: int) -> nnx.Module | None:
  """The KL reference (none without a KL penalty: AlgorithmSection.reference): with LoRA the frozen
  base, the actor's own base weights (no copy; Tunix sees the shared backbone); else a copy of the
  initial actor. It scores each group's prompt once (SharedPrefix over the first max_prompt_length
  tokens, which the group's samples share: both learners pad prompts to at least that length)."""
  if not algorithm.reference:
    return None
  base = builder.base_of(actor) if actor.config.lora_rank else nnx.clone(actor)
  return SharedPrefix(base, max_prompt_length, algorithm.num_generations)


class ReleaseFreedMemory(hooks.TrainingHooks):
  """Before each training micro-batch and after a step's training, hands the heap pages freed since
  (XLA's temporaries and compilers', the rollout's) back to the system, which glibc would keep
  (maxtext.utils.heap); without it the peak memory grows over a run's micro-batches."""

  def on_train_step_start(self, train_ctx):
    heap.release()

  def on_train_start(self, train_ctx):
    pass

  def on_train_end(self, train_ctx):
    jax.block_until_ready(nnx.state(train_ctx.optimizer))  # the step's optimizer update has run
    heap.release()

  def on_train_step_end(self, train_ctx, train_step, train_loss):
    pass

  def on_eval_step_start(self, train_ctx):
    pass

  def on_eval_step_end(self, train_ctx, eval_loss):
    pass


def training_config(
  run: RunSection, train: TrainSection, algorithm: AlgorithmSection, sinks: metrics.MetricSinks, checkpoints: str
) -> rl_cluster_lib.RLTrainingConfig:
  """Tunix's training config: the optimizer, batch sizes, checkpointing under `checkpoints` (a local
  folder or gs://) and the metric sinks."""
  steps = Steps.of(train, algorithm)
  return rl_cluster_lib.RLTrainingConfig(
    actor_optimizer=optimizer(train, steps),
    eval_every_n_steps=steps.updates + 1,
    max_steps=steps.updates,
    checkpoint_root_directory=checkpoints,
    checkpointing_options=ocp.CheckpointManagerOptions(
      save_decision_policy=save_policy(steps.updates_in(run.checkpoint_period)),
      max_to_keep=run.max_num_checkpoints_to_keep,
    ),
    metrics_logging_options=metrics_logger.MetricsLoggerOptions(
      log_dir=sinks.log_dir,
      run_name=run.run_name,
      backend_kwargs={"custom_backend": sinks.factories()},
    ),
    data_sharding_axis=(mesh_lib.DATA_AXES,),  # the batch dimension, split over both
    mini_batch_size=train.batch_size,
    train_micro_batch_size=train.train_micro_batch_size or None,
    # dynamic sampling fills the whole step's batch with groups that have signal, and PPO whitens its
    # advantages over the step's batch and updates its critic in mini-batches of it: one call per step
    rollout_micro_batch_size=train.batch_size if algorithm.dynamic_sampling or algorithm.algorithm == "ppo" else None,
  )


def build_cluster(
  actor: Decoder,
  reference: nnx.Module | None,
  tokenizer,
  trainer_mesh,
  sampler_mesh,
  training: rl_cluster_lib.RLTrainingConfig,
  rollout_engine,
  rollout_configs: dict,
  before_save=None,
) -> Cluster:
  """Tunix's RLCluster (our Cluster); with LoRA adapters in the actor Tunix trains, syncs and checkpoints only those.
  rollout_engine and rollout_configs: rollout_setup.rollout_engine's and rollout_setup.rollout_configs';
  before_save: see CheckpointManager (the actor's checkpoints)."""
  cluster_config = rl_cluster_lib.ClusterConfig(
    role_to_mesh={Role.ACTOR: trainer_mesh, Role.REFERENCE: trainer_mesh, Role.ROLLOUT: sampler_mesh},
    rollout_engine=rollout_engine,
    training_config=training,
    rollout_config=rollout_configs,
  )
  cluster = Cluster(actor=actor, reference=reference, tokenizer=tokenizer, cluster_config=cluster_config)
  trainer = cluster.actor_trainer
  # Tunix's manager has restored the latest checkpoint, if any; ours saves without compression buffers.
  trainer.checkpoint_manager.close()
  trainer.checkpoint_manager = CheckpointManager(
    trainer.config.checkpoint_root_directory, trainer.config.checkpointing_options, before_save
  )
  # Tunix's end-of-training save omits the step a rerun restores the data position from; ours has it.
  trainer._save_last_checkpoint = functools.partial(save_checkpoint, cluster)
  trainer._shard_optimizer = functools.partial(shard_optimizer, trainer)
  trainer.with_training_hooks(ReleaseFreedMemory())
  accumulate_in_place(trainer, training.actor_optimizer)
  if not isinstance(cluster.rollout, rollout.Engine):
    raise TypeError(f"rollout engine {type(cluster.rollout).__name__} lacks rollout.Engine's members")
  if cluster.rollout.keys is not None:
    cluster.rollout.keys.step_source = lambda: cluster.global_steps
  return cluster


def anchor(cluster: rl_cluster_lib.RLCluster):
  """The host copy of the actor's weights RLCluster keeps from each weight sync for the old policy's
  log-probs (None: none kept)."""
  return cluster._anchor_policy_state


def set_anchor(cluster: rl_cluster_lib.RLCluster, state) -> None:
  """Replaces the weights anchor() gives (None drops the copy)."""
  cluster._anchor_policy_state = state


def accumulate_in_place(trainer, tx: optax.GradientTransformation) -> None:
  """Makes the trainer accumulate micro-batch gradients in place (accumulation.py); `tx` is the
  optimizer Tunix wrapped in optax.MultiSteps (nothing to do where it did not: no micro-batching)."""
  if not isinstance(trainer.optimizer.tx, optax.MultiSteps):
    return
  trainer.jit_train_and_eval_step = accumulation.compiled_steps(trainer, tx)
  trainer.create_train_step_fn = functools.partial(accumulation.accumulator, trainer)


def global_token_logps(
  model, mesh, prompt_tokens, completion_tokens, pad_id: int, eos_id: int, temperature: float, rows: int | None = None
) -> jax.Array:
  """The completions' per-token log-probs under `model` (rollout.per_token_logps: the final hidden
  states through the output layer a vocabulary slice at a time, scoring.py), `rows` rows at a time
  (None: all at once). Every process holds the whole batch (the sampler runs on every process's
  devices): the inputs become global arrays on `mesh` first (mesh_lib.global_batch)."""
  size = rows or len(prompt_tokens)
  with mesh:
    prompts, completions = mesh_lib.global_batch((prompt_tokens, completion_tokens), mesh)
    return jnp.concatenate(
      [
        rollout.per_token_logps(model, prompts[i : i + size], completions[i : i + size], pad_id, eos_id, temperature)
        for i in range(0, len(prompts), size)
      ],
      axis=0,
    )


class Cluster(rl_cluster_lib.RLCluster):
  """Tunix's RLCluster whose reference scoring and trainer batches take global arrays on the trainer's
  mesh (Tunix takes each process's arrays for its share of the batch, while every process holds the
  whole batch: the sampler runs on every process's devices).

  get_ref_per_token_logps keeps Tunix's contract (the reference's log-probs of the completions at the
  training rollouts' temperature, micro_batch_size rows at a time), computed by reference_logps:
  Tunix's scores from the model's whole float32 logits [B, T, vocab] (common.compute_per_token_logps).
  update_actor makes the trainer's batches global arrays first, which Tunix's shard_input then leaves
  as they are."""

  def get_ref_per_token_logps(self, prompt_tokens, completion_tokens, pad_id, eos_id, micro_batch_size=None):
    mesh = self.cluster_config.role_to_mesh[Role.ACTOR]
    return reference_logps(self, mesh, prompt_tokens, completion_tokens, pad_id, eos_id, micro_batch_size)

  def update_actor(self, train_ds, eval_ds, skip_jit=False):
    mesh = self.cluster_config.role_to_mesh[Role.ACTOR]
    return super().update_actor(mesh_lib.global_batch(train_ds, mesh), eval_ds, skip_jit)


def reference_logps(cluster, mesh, prompt_tokens, completion_tokens, pad_id, eos_id, micro_batch_size=None):
  """The log-probs of the completions under `cluster`'s reference model (its inference worker's) at
  the training rollouts' temperature, by global_token_logps on `mesh`, micro_batch_size rows at a
  time (None: all at once)."""
  reference = cluster.inference_worker.get_model("reference")
  temperature = cluster.get_rollout_config(mode=rl_cluster_lib.Mode.TRAIN).temperature
  return global_token_logps(
    reference, mesh, prompt_tokens, completion_tokens, pad_id, eos_id, temperature, micro_batch_size
  )


def shard_optimizer(trainer, mesh) -> None:
  """Lays the optimizer state out as its partition specs say before the train step is compiled (as
  Tunix does, so the step compiles once), moving only arrays not laid out so already: Tunix's eager
  sharding constraint copies the whole state, held until garbage collection."""
  if mesh.empty:
    return
  state = nnx.state(trainer.optimizer, nnx.optimizer.OptState)

  def place(array, spec):
    sharding = jax.sharding.NamedSharding(mesh, spec)
    return array if array.sharding.is_equivalent_to(sharding, array.ndim) else jax.device_put(array, sharding)

  nnx.update(trainer.optimizer, jax.tree.map(place, state, nnx.get_partition_spec(state)))


def save_checkpoint(cluster: rl_cluster_lib.RLCluster) -> int:
  """Saves the actor (model, or its LoRA adapters only, and optimizer) between global steps unless
  its step is saved already, with the global step Tunix restores the data position from (a rerun
  resumes there); returns the step."""
  trainer = cluster.actor_trainer
  step = trainer.train_steps
  if (trainer.checkpoint_manager.latest_step() or 0) < step:
    trainer.checkpoint_manager.save(
      step,
      trainer.model,
      trainer.optimizer,
      force=True,
      save_only_lora_params=sft_utils.is_lora_enabled(trainer.model),
      custom_metadata={"global_step": cluster.global_steps, "role": Role.ACTOR.value},
    )
  return step


class CheckpointManager(checkpoint_manager.CheckpointManager):
  """The actor's checkpoint manager: Tunix's, with our Orbax manager in it. Same items and layout as
  Tunix's (either restores the other's checkpoints); arrays are written without compression
  (orbax_checkpoint.uncompressed_manager); every save request first goes to `before_save`, and a save
  to a local folder without room for its arrays raises an ENOSPC OSError before anything is written
  (orbax_checkpoint.check_room). Why: docs/decisions.md, "Uncompressed checkpoints" and "Checkpoint
  room check"."""

  def __init__(
    self,
    root_directory: str,
    options: ocp.CheckpointManagerOptions,
    before_save: Callable[[int, nnx.Module, nnx.Optimizer | None], None] | None = None,
  ):
    """before_save(step, model, optimizer): called on every save request, before anything is
    written (also for steps the save policy skips); an exception it raises stops the save."""
    super().__init__(None, options)  # a disabled manager; it gets the Orbax manager built here
    self._before_save = before_save
    self._root = root_directory
    self._checkpoint_manager = orbax_checkpoint.uncompressed_manager(root_directory, options)
    self._items: Callable[[], dict[str, nnx.State]] = dict

  def saved_updates(self) -> list[int]:
    """The updates whose saves finished, as this manager knows them without reading the storage
    (Orbax forgets a save that failed once it has waited for it; close waits for every save)."""
    return list(self._checkpoint_manager.all_steps())

  def save(self, step, model, optimizer=None, save_only_lora_params=False, force=False, custom_metadata=None):
    """Tunix's save (same parameters and items), after before_save and the room check, with the
    items of `with_items` beside them; every process of a job calls it alike and gets process 0's
    answer."""
    if self._before_save is not None:
      self._before_save(step, model, optimizer)
    if not force and not self._checkpoint_manager.should_save(step):
      return False
    items = {
      orbax_checkpoint.PARAMS_ITEM: nnx.state(model, nnx.LoRAParam) if save_only_lora_params else nnx.state(model)
    }
    if optimizer is not None:
      items["optimizer_state"] = nnx.state(optimizer, nnx.optimizer.OptState)
    items.update(self._items())
    if not storage.is_url(self._root):
      orbax_checkpoint.check_room(self._root, step, jax.tree.leaves(items))
    saves = {
      k: ocp.args.PyTreeSave(item=v, save_args=jax.tree.map(lambda _: ocp.SaveArgs(), v)) for k, v in items.items()
    }
    return self._checkpoint_manager.save(
      step, args=ocp.args.Composite(**saves), custom_metadata=custom_metadata or {}, force=force
    )

  def with_items(self, items: Callable[[], dict[str, nnx.State]]) -> None:
    """Every save also writes items() (item name -> state; orbax_checkpoint.OPTIONAL_ITEMS names them),
    read back by restore_items."""
    self._items = items

  def restore_items(self, step: int, targets: dict[str, nnx.State]) -> dict[str, nnx.State]:
    """The items of step `step` named in `targets` (item name -> a state of the arrays' shapes and
    layout), read into that layout; a step without one of them raises an InputError naming it."""
    held = self._checkpoint_manager.metadata(step).item_metadata
    missing = [name for name in targets if held is None or name not in held or held[name] is None]
    if missing:
      raise InputError(f"{self._root}/{step}: holds no {', '.join(missing)} (a checkpoint of another algorithm's run)")
    restores = {
      k: ocp.args.PyTreeRestore(item=v, restore_args=ocp.checkpoint_utils.construct_restore_args(target=v))
      for k, v in targets.items()
    }
    restored = self._checkpoint_manager.restore(step, args=ocp.args.Composite(**restores))
    return {k: restored[k] for k in targets}
