"""MaxText's config keys that base.yml does not have, so that a MaxText user's config loads.

Each falls in one of three kinds:
- RENAMED: a key this program has under another name; the value means what it means in MaxText.
- FIXED: behaviour this program does not vary; accepted at the value that is what it does, any other
  value refused naming what it does instead. MaxText's `generation_configs` (its evaluation sampling
  presets) likewise must hold sections.EVAL_SAMPLING's.
- ENGINE_ONLY: keys that only tune what this program does not run (Pathways, vLLM, slices, host
  offloading, MaxText's own decoder and checkpointer, its diagnostics); they change no result. A
  config that sets one is refused, every such key named at once and grouped by reason, unless
  maxtext_compat=true, which accepts them unused, lists them at start and records them in config.yml.

MaxText's values of our own keys that base.yml spells otherwise (remat_policy=custom,
train_micro_batch_size=-1, eval_batch_size=-1, null for rl.epsilon_high or math_verify_num_procs,
comma-separated reward_functions, its data template path, its logical_axis_rules) are translated
by maxtext_compat.py.
"""

from __future__ import annotations

# MaxText's spelling -> ours.
RENAMED = {
  "micro_batch_size": "train_micro_batch_size",  # MaxText's name until 2026
  "decode_sampling_nucleus_p": "decode_sampling_top_p",
  "chat_template_path": "data_template_path",  # MaxText's name of the data template until 2026
  "hf_name": "hf_subset",  # MaxText's name until 2026
  "rl.degenerate_group_masking": "rl.filter_zero_variance_groups",  # Tunix's name
}

# Key -> (the value accepted, what this program does).
FIXED = {
  "enable_checkpointing": (True, "checkpoints are always saved, every checkpoint_period steps and at the end"),
  "stop_strings": (None, "generation stops at the EOS token or after max_response_length tokens"),
  "eval_corr_lst": (False, "eval.json keeps every example's record (eval_make_lst), right or wrong"),
  "test_batch_start_index": (0, "evaluation starts at the first example"),
}

# MaxText keys whose value is a whole mapping.
MAPPING_VALUED = ("generation_configs", "debug")

# MaxText's remat_policy=custom stores the tensors its per-tensor keys name on the device or the host
# and recomputes the others; here no tensor is offloaded and remat_policy=full recomputes them all.
REMAT_CUSTOM = "full"

# MaxText's mesh axes that this program's mesh (sections.MESH_AXES) lacks: a logical_axis_rules
# entry of MaxText's shards over them as over an axis of size 1, which is to say not at all.
OTHER_MESH_AXES = (
  "diloco",
  "stage",
  "fsdp_transpose",
  "sequence",
  "context",
  "context_usp_ulysses",
  "context_autoregressive",
  "tensor_transpose",
  "tensor_sequence",
  "expert",
  "autoregressive",
)

# Reason -> the keys it covers.
ENGINE_ONLY: dict[str, tuple[str, ...]] = {
  "Pathways and multi-slice launching (this program runs JAX's own processes)": (
    "use_pathways",
    "chips_per_vm",
    "num_trainer_slices",
    "num_samplers_slices",
    "skip_jax_distributed_system",
  ),
  "vLLM rollouts (rollouts here run on rollout_engine: this program's batched engine or Tunix's sampler)": (
    "rollout_data_parallelism",
    "rollout_tensor_parallelism",
    "rollout_expert_parallelism",
    "rollout_subslice_shape",
    "rollout_enable_single_controller",
    "rollout_micro_batch_size",
    "rl.reshard_chunk_size",
    "kv_cache_buffer",
    "hbm_utilization_vllm",
    "swap_space_vllm_gb",
    "enable_dp_attention",
    "max_num_batched_tokens",
    "max_num_seqs",
    "async_scheduling",
    "vllm_load_format",
    "debug_converter",
    "gcs_debug_path",
  ),
  "offloading activations to host memory (remat_policy here is none or full; MaxText's custom runs as full)": (
    "decoder_layer_input",
    "indexer_cutoff_threshold",
    "context",
    "mlpwi",
    "mlpwi_0",
    "mlpwi_1",
    "mlpwo",
    "moe_mlpwi_0",
    "moe_mlpwi_1",
    "moe_mlpwo",
    "query_proj",
    "key_proj",
    "value_proj",
    "kv_proj",
    "qkv_proj",
    "out_proj",
    "query_wa_proj",
    "kv_wa_proj",
    "mla_q",
    "mla_kv",
    "attention_out",
    "engram",
  ),
  "MaxText's checkpoint writer (Pathways storage formats, synchronous saving): checkpoints here are Orbax's, "
  "saved asynchronously": (
    "checkpoint_storage_use_ocdbt",
    "checkpoint_storage_use_zarr3",
    "async_checkpointing",
  ),
  "MaxText's diagnostics (this program logs every step to metrics.jsonl and TensorBoard; log_level=debug)": (
    "log_period",
    "debug",
    "enable_tunix_perf_metrics",
    "log_config",
    "profiler",
    "profiler_steps",
    "skip_first_n_steps_for_profiler",
    "upload_all_profiler_results",
    "enable_goodput_recording",
    "monitor_goodput",
  ),
  "Hugging Face Hub credentials (a tokenizer or dataset named on the Hub reads HF_TOKEN from the environment here)": (
    "hf_access_token",
  ),
  "what this program tells from the files (it reads HF checkpoints as they are, and the tokenizer's kind "
  "from tokenizer_path)": (
    "convert_checkpoint_if_possible",
    "tokenizer_type",
  ),
}

# Keys whose value is a credential: shown and recorded as REDACTED.
SECRET = ("hf_access_token",)
REDACTED = "<redacted>"

_REASON = {key: reason for reason, keys in ENGINE_ONLY.items() for key in keys}


def engine_only_reason(key: str) -> str | None:
  """Why a dotted key only tunes what this program does not run, or None if it is no such key of
  MaxText's (a key under a mapping-valued key, debug.rl, is that key's)."""
  root = key.split(".")[0]
  return _REASON.get(root if root in MAPPING_VALUED else key)
