"""The rules of a run config, checked at start on the merged values (dotted key -> value, every key of
base.yml) before they become sections: each key's own rules, which live on its section field
(sections.key: choices by its Literal type, bounds), and the rules that relate keys. Each refusal is
a ConfigError naming the key(s), the value(s) and what was expected. Which keys the run's mode
reads (sections.inapplicable) is checked against the layers that set them (check_modes), and a
checkpoint's architecture against the model's (check_architecture).
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Mapping
from typing import Any

from maxtext.configs import sections
from maxtext.utils import storage
from maxtext.utils.errors import ConfigError

log = logging.getLogger(__name__)

# The fields of a Llama 3 rope_scaling mapping (a linear one has factor alone).
_ROPE_SCALING_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _check_paths(v: Mapping[str, Any]) -> None:
  """Every key naming a file or folder (sections.key(path=...)) is a local path or gs://; run_name one
  folder's name; the compilation cache local."""
  for key in sections.PATH_KEYS:
    storage.check(key, v[key])
  name = v["run_name"]
  if name in ("", ".", "..") or "/" in name or "\\" in name:
    raise ConfigError(
      f"run_name={name!r}: expected the name of one folder under base_output_directory (not empty, no / or \\, "
      "not . or ..)"
    )
  if storage.is_url(v["jax_cache_dir"]):
    raise ConfigError(
      f"jax_cache_dir={v['jax_cache_dir']!r}: expected a local folder (the compilation cache belongs to the machine)"
    )


def _check_algorithm(v: Mapping[str, Any]) -> None:
  """Refuses algorithm choices that would not do what they say together, a micro-batch that does not
  divide the batch, and dynamic sampling and overlong shaping out of range."""
  if v["rl.policy_loss_fn"] == "cispo" and v["rl.loss_algo"] != "grpo":
    raise ConfigError(
      f"rl.loss_algo={v['rl.loss_algo']!r} with rl.policy_loss_fn=cispo: the sequence-level ratio belongs to "
      "ppo_clip; cispo weights tokens (expected rl.loss_algo=grpo)"
    )
  if v["rl.advantage_estimator"] == "reinforce_pp" and v["rl.dynamic_sampling"]:
    raise ConfigError(
      "rl.advantage_estimator='reinforce_pp' with rl.dynamic_sampling=true: REINFORCE++ normalises over the "
      "sampled batch, not the groups dynamic sampling keeps (expected grpo, dr_grpo or rloo)"
    )
  if v["rl.advantage_estimator"] == "reinforce_pp" and v["rl.use_agentic_rollout"]:
    raise ConfigError(
      "rl.advantage_estimator='reinforce_pp' with rl.use_agentic_rollout=true: agentic GRPO scores one "
      "group at a time, so there is no batch to normalise over (expected grpo, dr_grpo or rloo)"
    )
  micro = v["train_micro_batch_size"]
  if micro < 0 or (micro and v["batch_size"] % micro):
    raise ConfigError(
      f"train_micro_batch_size={micro}: expected 0 (no accumulation) or a divisor of batch_size={v['batch_size']}"
    )
  if v["rl.dynamic_sampling_max_rounds"] < 2 and v["rl.dynamic_sampling"]:
    raise ConfigError(
      f"rl.dynamic_sampling_max_rounds={v['rl.dynamic_sampling_max_rounds']}: expected at least 2 (one round "
      "samples nothing more)"
    )
  if not 0 <= v["rl.overlong_buffer_length"] <= v["max_response_length"] or v["rl.overlong_penalty"] < 0:
    raise ConfigError(
      f"rl.overlong_buffer_length={v['rl.overlong_buffer_length']}, rl.overlong_penalty={v['rl.overlong_penalty']}: "
      f"expected a buffer from 0 (off) to max_response_length={v['max_response_length']} and a penalty >= 0"
    )


def _check_reward_functions(v: Mapping[str, Any]) -> None:
  """reward_functions and reward_functions_path come together (the file's functions replace the task's)."""
  if v["reward_functions"] and not v["reward_functions_path"]:
    raise ConfigError("reward_functions: set reward_functions_path to the file that defines them")
  if v["reward_functions_path"] and not v["reward_functions"]:
    raise ConfigError(f"reward_functions: name the functions of {v['reward_functions_path']} to use")


# The keys only decoder_family=gemma3 reads: 0 (none) for the other families.
_GEMMA3_KEYS = ("rope_local_max_timescale", "sliding_window_size", "sliding_window_pattern", "query_pre_attn_scalar")


def _check_gemma3_keys(v: Mapping[str, Any]) -> None:
  """Gemma 3's attention keys: set, and positive, for gemma3; 0 for the other families."""
  family = v["decoder_family"]
  if family != "gemma3":
    for key in _GEMMA3_KEYS:
      if v[key] != 0:
        raise ConfigError(
          f"{key}={v[key]!r}: only decoder_family=gemma3 has sliding-window layers and their settings, but "
          f"decoder_family={family!r}; expected 0"
        )
    return
  for key in _GEMMA3_KEYS:
    if v[key] <= 0:
      raise ConfigError(f"{key}={v[key]!r}: decoder_family=gemma3 needs it; expected a positive number")
  if not v["use_qk_norm"]:
    raise ConfigError(
      "use_qk_norm=False: decoder_family=gemma3 always normalises queries and keys per head; expected true"
    )


def _check_model(v: Mapping[str, Any]) -> None:
  """The model's keys together: the context holds the lengths, the layout fits the architecture, and
  the rope scaling, the family's own keys and the LoRA settings are well formed."""
  total = v["max_prompt_length"] + v["max_response_length"]
  if total > v["max_position_embeddings"]:
    raise ConfigError(
      f"max_prompt_length + max_response_length = {total} exceeds the context of "
      f"{v['model_name']} (max_position_embeddings={v['max_position_embeddings']})"
    )
  if v["scan_layers"] and "layers" not in {rule[0] for rule in v["logical_axis_rules"]}:
    raise ConfigError(
      "logical_axis_rules: no rule for 'layers', the axis scan_layers=true stacks the decoder layers on; "
      'add ["layers", []] (on no mesh axis), or set scan_layers=false'
    )
  if v["attention"] == "cudnn_flash" and v["dtype"] != "bfloat16":
    raise ConfigError(
      f"attention=cudnn_flash, dtype={v['dtype']!r}: cuDNN flash attention takes bfloat16 or float16 "
      "inputs; expected dtype=bfloat16, or attention=autoselected or dot_product"
    )
  scaling = v["rope_scaling"]
  if scaling is not None and (
    not isinstance(scaling, dict) or sorted(scaling) not in (sorted(_ROPE_SCALING_FIELDS), ["factor"])
  ):
    raise ConfigError(
      f"rope_scaling={scaling!r}: expected null, a mapping with {', '.join(_ROPE_SCALING_FIELDS)} (Llama 3) "
      "or a mapping with factor alone (linear)"
    )
  _check_gemma3_keys(v)
  if v["lora_rank"] < 0 or v["lora_alpha"] <= 0:
    raise ConfigError(
      f"lora_rank={v['lora_rank']}, lora_alpha={v['lora_alpha']}: expected lora_rank >= 0 (0: full "
      "fine-tuning) and lora_alpha > 0"
    )
  try:
    re.compile(v["lora_module_path"])
  except re.error as e:
    raise ConfigError(f"lora_module_path={v['lora_module_path']!r}: not a regular expression ({e})") from None
  if v["scan_layers"] and v["lora_rank"] > 0:  # before any data or weights load (the decoder checks it too)
    layers = range(v["num_decoder_layers"])
    for weight in _LORA_WEIGHTS:
      adapted = sum(re.fullmatch(v["lora_module_path"], f"layers.{i}.{weight}") is not None for i in layers)
      if 0 < adapted < len(layers):
        raise ConfigError(
          f"lora_module_path={v['lora_module_path']!r} selects {weight.split('.')[1]} of {adapted} of the "
          f"{len(layers)} layers; with scan_layers=true the layers share one stacked adapter per weight, so a "
          "weight is adapted in every layer or in none (set scan_layers=false to adapt some layers only)"
        )


# The weights LoRA can adapt in each decoder layer (decoder.LORA_INPUT_AXES's, by module).
_LORA_WEIGHTS = tuple(f"attn.{w}_proj" for w in "qkvo") + tuple(f"mlp.{w}_proj" for w in ("gate", "up", "down"))


def _check_sampling(v: Mapping[str, Any]) -> None:
  """Sampling that the learner can train on, with top-k and top-p in their ranges."""
  if v["decode_sampling_temperature"] <= 0 and v["rl.use_agentic_rollout"] and v["rollout_engine"] == "batched":
    raise ConfigError(
      f"decode_sampling_temperature={v['decode_sampling_temperature']}: agentic GRPO trains on the "
      "sampler's log-probs, which greedy rollouts do not have; expected a temperature > 0"
    )
  if v["decode_sampling_top_k"] < 0 or not 0.0 < v["decode_sampling_top_p"] <= 1.0:
    raise ConfigError(
      f"decode_sampling_top_k={v['decode_sampling_top_k']}, decode_sampling_top_p="
      f"{v['decode_sampling_top_p']}: expected top_k >= 0 (0: off) and 0 < top_p <= 1 (1: off)"
    )


def check(v: Mapping[str, Any]) -> None:
  """Refuses, with a ConfigError, the first rule that the merged values `v` (dotted key -> value, every
  key of base.yml) break: the paths, each key's own choices and bounds (sections.field_problem), then
  the rules that relate keys."""
  _check_paths(v)
  if v["rollout_engine"] == "vllm":
    raise ConfigError(
      "rollout_engine='vllm': not supported (nothing maps this program's parameters to vLLM's or "
      "syncs them after each step); expected one of batched, vanilla"
    )
  problem = sections.field_problem(v)
  if problem:
    raise ConfigError(problem)
  _check_model(v)
  _check_algorithm(v)
  _check_reward_functions(v)
  _check_sampling(v)
  if v["wandb_project"] and importlib.util.find_spec("wandb") is None:
    raise ConfigError(f"wandb_project={v['wandb_project']!r}: the wandb package is not installed (pip install wandb)")


def check_modes(v: Mapping[str, Any], set_by: Mapping[str, str], layer: Mapping[str, int], changed: list[str]) -> None:
  """Every changed key must take effect in the run's mode (its field's `applies` conditions, see
  sections.key): one the mode ignores is an error naming the key and the mode. Except where the key
  was set in an earlier layer (a recipe's YAML) than the setting that made the mode ignore it (e.g.
  num_test_batches=0 on the command line against the recipe's eval_batch_size): the later choice
  wins and the key is reported as unused (set_by: key -> the layer's name; layer: key -> the index of
  the layer that set it). Likewise, with maxtext_compat=true, a key a file set
  (MaxText's configs set keys of every mode)."""
  mode = (
    "agentic GRPO (rl.use_agentic_rollout=true)"
    if v["rl.use_agentic_rollout"]
    else "standard GRPO (rl.use_agentic_rollout=false)"
  )
  ignored = sections.inapplicable(v)  # key -> (reason, the key whose value makes it ignored)
  for key in changed:
    if key not in ignored:
      continue
    reason, decider = ignored[key]
    from_file = set_by.get(key, "command line") != "command line"
    if layer.get(key, -1) < layer.get(decider, -1) or (v["maxtext_compat"] and from_file):
      log.warning(
        "%s=%r (from %s) is not used: %s (%s=%r from %s)",
        key,
        v[key],
        set_by[key],
        reason,
        decider,
        v[decider],
        set_by[decider],
      )
      continue
    raise ConfigError(f"{key}={v[key]!r}: {mode} would ignore it ({reason}); remove it or change the mode")


def check_architecture(values: dict[str, Any], hf_arch: dict[str, Any], hf_path: str) -> None:
  """The run's architecture must be the checkpoint's config.json."""
  diffs = [
    f"{key}={values[key]!r} but config.json has {hf_arch[key]!r}" for key in hf_arch if values[key] != hf_arch[key]
  ]
  if diffs:
    raise ConfigError(
      f"model_name={values['model_name']} does not match load_parameters_path={hf_path}: " + "; ".join(diffs)
    )
