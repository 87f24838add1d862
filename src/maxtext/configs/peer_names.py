"""Other programs' names for this program's settings, so that a key written as TRL, Tunix or MaxText
spell it is refused with what it is here, found by meaning rather than by spelling.

PEER_NAMES maps a peer's key to what it is here, per peer: TRL (its GRPOConfig, with the transformers
TrainingArguments it extends, and ModelConfig), Tunix (GRPOConfig, PPOConfig, RolloutConfig,
RLTrainingConfig) and MaxText's run scripts (keys of MaxText's pre-training config that its RL commands
set). A value is either one of this program's dotted keys (base.yml's) or, where no single key is the
peer's setting, a clause that says what to set instead. A peer key that is also one of ours is not
listed: it is ours.
"""

from __future__ import annotations

PEER_NAMES: dict[str, dict[str, str]] = {
  "TRL": {  # GRPOConfig, and ModelConfig's model_name_or_path
    "beta": "rl.grpo_beta",
    "epsilon": "rl.grpo_epsilon",
    "epsilon_high": "rl.epsilon_high (TRL's 1 + epsilon_high for cispo)",
    "num_generations": "rl.num_generations",
    "num_iterations": "rl.num_iterations",
    "max_completion_length": "max_response_length",
    "temperature": "decode_sampling_temperature",
    "top_p": "decode_sampling_top_p",
    "top_k": "decode_sampling_top_k",
    "seed": "decode_seed, init_weights_seed and data_shuffle_seed (sampling, random weights, data order)",
    "loss_type": "rl.loss_agg_mode with rl.advantage_estimator (grpo: sequence-mean-token-mean; "
    "dapo: token-mean; dr_grpo: sequence-mean-token-scale with advantage_estimator=dr_grpo) and "
    "rl.policy_loss_fn=cispo for cispo",
    "scale_rewards": "rl.advantage_estimator (grpo scales by the group's std, dr_grpo does not)",
    "importance_sampling_level": "rl.loss_algo (token: grpo, sequence: gspo-token)",
    "mask_truncated_completions": "rl.mask_truncated_completions",
    "max_steps": "num_batches",
    "num_train_epochs": "num_epoch",
    "per_device_train_batch_size": "batch_size (prompts per step; each is sampled rl.num_generations times)",
    "gradient_accumulation_steps": "train_micro_batch_size (prompts per micro-batch)",
    "generation_batch_size": "batch_size x rl.num_generations (completions sampled per step)",
    "steps_per_generation": "rl.num_iterations (updates per batch of samples)",
    "warmup_ratio": "warmup_steps_fraction",
    "weight_decay": "adam_weight_decay",
    "adam_beta1": "adam_b1",
    "adam_beta2": "adam_b2",
    "max_grad_norm": "gradient_clipping_threshold",
    "output_dir": "base_output_directory with run_name (the run folder is their join)",
    "save_steps": "checkpoint_period",
    "save_total_limit": "max_num_checkpoints_to_keep",
    "eval_steps": "eval_interval",
    "logging_steps": "nothing: every step is logged to metrics.jsonl",
    "report_to": "wandb_project (TensorBoard is always written)",
    "bf16": "dtype=bfloat16",
    "model_name_or_path": "model_name with load_parameters_path",
    "max_tool_calling_iterations": "rl.max_turns",
    "use_vllm": "rollout_engine (batched: this program's continuous batching engine)",
    "vllm_importance_sampling_correction": "rl.sampler_is=token",
    "vllm_importance_sampling_cap": "rl.sampler_is_threshold",
    "log_completions": "nothing: eval.json and the trajectory log keep the completions",
  },
  "Tunix": {
    "beta": "rl.grpo_beta",
    "epsilon": "rl.grpo_epsilon",
    "num_generations": "rl.num_generations",
    "num_iterations": "rl.num_iterations",
    "kl_loss_mode": "rl.kl_loss_mode",
    "loss_agg_mode": "rl.loss_agg_mode",
    "loss_algo": "rl.loss_algo",
    "advantage_estimator": "rl.advantage_estimator",
    "policy_loss_fn": "rl.policy_loss_fn",
    "max_tokens_to_generate": "max_response_length",
    "kv_cache_size": "nothing: the cache holds max_prompt_length + max_response_length tokens",
    "temperature": "decode_sampling_temperature",
    "top_p": "decode_sampling_top_p",
    "top_k": "decode_sampling_top_k",
    "seed": "decode_seed",
    "data_type": "rollout_dtype",
    "max_steps": "num_batches",
    "eval_every_n_steps": "eval_interval",
    "gradient_accumulation_steps": "train_micro_batch_size (prompts per micro-batch)",
    "mini_batch_size": "batch_size",
    "checkpoint_root_directory": "base_output_directory with run_name (checkpoints go to <run folder>/checkpoints)",
    "degenerate_group_masking": "rl.filter_zero_variance_groups",
    "max_concurrency": "rl.max_concurrency",
    "off_policy_steps": "rl.off_policy_steps",
    "epsilon_low": "rl.grpo_epsilon",
    "gamma": "rl.gamma",
    "gae_lambda": "rl.gae_lambda",
    "epsilon_c": "rl.epsilon_c",
    "entropy_coef": "rl.entropy_coef",
    "clip_range_value": "critic.clip_range_value",
    "kl_method": "rl.kl_in_reward_method (PPO's KL inside the reward, at rl.kl_in_reward_coef; rl.kl_loss_mode is the "
    "loss's)",
  },
  "MaxText": {
    "steps": "num_batches (training steps)",
    "per_device_batch_size": "batch_size (prompts per step, for the whole job)",
    "gradient_accumulation_steps": "train_micro_batch_size (prompts per micro-batch)",
    "base_emb_dim": "emb_dim",
    "base_num_decoder_layers": "num_decoder_layers",
    "base_num_query_heads": "num_query_heads",
    "base_num_kv_heads": "num_kv_heads",
    "base_mlp_dim": "mlp_dim",
    "weight_decay": "adam_weight_decay",
    "loss_algo": "rl.loss_algo",
    "num_generations": "rl.num_generations",
    "num_iterations": "rl.num_iterations",
    "grpo_beta": "rl.grpo_beta",
    "grpo_epsilon": "rl.grpo_epsilon",
  },
}


def meaning(key: str) -> str:
  """What a peer's `key` is here, one clause per meaning ("TRL's and Tunix's beta is rl.grpo_beta
  here"; "TRL's logging_steps has no counterpart here: every step is logged ..."), or '' where no peer
  names it."""
  by_meaning: dict[str, list[str]] = {}
  for peer, names in PEER_NAMES.items():
    if key in names:
      by_meaning.setdefault(names[key], []).append(peer)
  clauses = []
  for ours, peers in by_meaning.items():
    owners = [f"{p}'s" for p in peers]
    who = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
    none, _, why = ours.partition(": ")
    if none in ("nothing", "nothing yet"):
      clauses.append(f"{who} {key} has no counterpart here{none[7:]}: {why}")
    else:
      name, paren, rest = ours.partition(" (")
      clauses.append(f"{who} {key} is {name} here{paren}{rest}")
  return "; ".join(clauses)
