"""Everything this package relies on in Tunix (google-tunix 0.1.7) that is not its public API: its
private members, and its public members we replace on one of our instances (a patch scoped to that
instance; never on a Tunix class).

Each entry names the Tunix class and member, how we use it, where, and why: the upstream gap or
defect it works around. tests/unit/test_tunix_private_api.py checks every entry against the
installed Tunix (a method keeps its parameters, an attribute is still set by the class) and checks
that our code touches no other private Tunix member, so an upgrade that moves one of these fails
there with the entry's reason instead of somewhere inside a training run.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PrivateDependency:
  owner: str  # module.Class in Tunix
  name: str
  use: str  # override (subclass method), call (super() or direct), write/read (attribute), replace (on an instance)
  params: tuple[str, ...] | None  # a method's parameters in the Tunix version we pin; None for an attribute
  where: str  # our module
  why: str


_GRPO = "tunix.rl.grpo.grpo_learner.GRPOLearner"
_AGENTIC = "tunix.rl.agentic.agentic_grpo_learner.GRPOLearner"
_CLUSTER = "tunix.rl.rl_cluster.RLCluster"
_TRAINER = "tunix.sft.peft_trainer.PeftTrainer"

DEPENDENCIES: tuple[PrivateDependency, ...] = (
  # The cluster and its actor trainer (cluster.py)
  PrivateDependency(
    _TRAINER,
    "checkpoint_manager",
    "write",
    None,
    "cluster.py",
    "our Orbax manager saves without the gradient-accumulation buffers and treats a step as "
    "complete only with Orbax's commit marker (a save cut short on a bucket leaves a step folder)",
  ),
  PrivateDependency(
    _TRAINER,
    "create_train_step_fn",
    "replace",
    ("self",),
    "cluster.py",
    "the train step accumulates micro-batch gradients in place; Tunix's MultiSteps step writes a "
    "copy of the weights every micro-batch",
  ),
  PrivateDependency(
    _TRAINER,
    "jit_train_and_eval_step",
    "replace",
    ("self", "skip_jit", "cache_nnx_graph"),
    "cluster.py",
    "wraps Tunix's compiled step so the optimizer update runs once per optimizer step, after the "
    "micro-batches' gradients are accumulated, without graph updates (a program returns the "
    "variables it changed, not copies of all)",
  ),
  PrivateDependency(
    _CLUSTER,
    "_anchor_policy_state",
    "write",
    None,
    "cluster.py",
    "the weights the old policy's log-probs are computed with (the host copy Tunix keeps from every "
    "weight sync). The standard learner never reads it (it calls no get_actor_per_token_logps) and "
    "drops it before each global step and when training ends (a full copy of the weights less at the "
    "peak); the agentic learner drops it likewise where its trainer recomputes no log-probs (the "
    "batched engine's sampler log-probs are the old policy's), and elsewhere, with one mesh for "
    "trainer and sampler, sets it to the weights the samples came from, which a sync never does; its "
    "trainer log-probs read it as Tunix's get_actor_per_token_logps does",
  ),
  PrivateDependency(
    _TRAINER,
    "_save_last_checkpoint",
    "replace",
    ("self",),
    "cluster.py",
    "Tunix's end-of-training save omits the global step a rerun restores the data "
    "position from, so a resumed run would repeat data",
  ),
  PrivateDependency(
    _TRAINER,
    "_shard_optimizer",
    "replace",
    ("self", "mesh"),
    "cluster.py",
    "Tunix's eager sharding constraint copies the whole optimizer state before the "
    "first step even where it is laid out already (a transient copy of the whole state)",
  ),
  PrivateDependency(
    "tunix.sft.checkpoint_manager.CheckpointManager",
    "_checkpoint_manager",
    "write",
    None,
    "cluster.py",
    "the Orbax manager with uncompressed array handlers (Tunix builds its "
    "handlers with zstd compression, whose in-memory buffers were the demo's peak while saving "
    "its trainer state); the class's save, restore and close use it",
  ),
  # Standard GRPO (learner.py)
  PrivateDependency(
    _GRPO,
    "_generate_and_compute_advantage",
    "override",
    ("self", "training_input", "mode"),
    "learner.py",
    "the step's example is ours (maxtext.rl.standard_step, given RLCluster's public calls: sampling "
    "rounds, rewards with the overlong penalty, dynamic sampling, truncated-completion masking, "
    "sampler importance weights), timed (trainer/idle_fraction) and counted (frac_reward_zero_std): "
    "Tunix keeps no rollout for shaping, has no per-batch hook, and its dynamic_sampling flag does "
    "nothing",
  ),
  PrivateDependency(
    _GRPO,
    "_run_global_step",
    "override",
    (
      "self",
      "full_batch_size",
      "mini_batch_size",
      "service_target_batch_size",
      "grad_acc_steps",
      "train_iterator",
      "eval_ds",
      "skip_jit",
    ),
    "learner.py",
    "runs before_step between global steps (evaluation every eval_interval steps, the non-finite "
    "guard, signals) and logs per-step metrics: Tunix 0.1.7 has no step callback",
  ),
  PrivateDependency(
    _GRPO,
    "_last_iter_step",
    "write",
    None,
    "learner.py",
    "a resumed run fast-forwards the data by trainer micro-steps, which count every batch "
    "num_iterations times, so Tunix would skip batches never trained on; divided back",
  ),
  # Agentic GRPO (agentic.py)
  PrivateDependency(
    "tunix.rl.agentic.utils.RolloutSyncLock",
    "acquire_rollout",
    "override",
    ("self",),
    "agentic.py",
    "rl.agent's episodes (a user's agent, minutes each) do not hold weight syncs back: the rollout "
    "orchestrator takes this lock over each whole episode, and a sync waits for all of them; ours "
    "takes none and the sync pauses the batcher between decode chunks instead",
  ),
  PrivateDependency(
    "tunix.rl.agentic.utils.RolloutSyncLock",
    "release_rollout",
    "override",
    ("self",),
    "agentic.py",
    "the other half of acquire_rollout's override",
  ),
)
