"""The rules of a run config, on its values (dotted key -> value, every key of base.yml), which
RunConfig.check applies: each key's own rules, which live on its section field (sections.key: choices
by its Literal type, bounds, paths), the rules that relate keys (check), and those of the layout on
the job's processes and devices (check_job). Each refusal is a ConfigError naming the key(s), the
value(s) and what was expected. While the config is read, which keys the run's mode reads
(sections.inapplicable) is checked against the layers that set them (check_modes), and a checkpoint's
architecture against the model's (check_architecture). What the files a key names hold is checked
where they are read.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from maxtext.configs import sections
from maxtext.utils import distributed, lora_names, storage
from maxtext.utils.errors import ConfigError

log = logging.getLogger(__name__)

# The fields of a Llama 3 rope_scaling mapping (a linear one has factor alone).
_ROPE_SCALING_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def check_storable(key: str, path: str) -> None:
  """Refuses a URL of a scheme we cannot store to (storage.unsupported), naming the key."""
  message = storage.unsupported(key, path)
  if message:
    raise ConfigError(message)


def _check_paths(v: Mapping[str, Any]) -> None:
  """Every key naming a file or folder (sections.key(path=...)) is a local path or gs://; run_name one
  folder's name; the compilation cache local."""
  for key in sections.PATH_KEYS:
    check_storable(key, v[key])
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
  divide the batch, and overlong shaping out of range."""
  if v["rl.algorithm"] == "grpo" and v["rl.num_generations"] < 2:
    raise ConfigError(
      f"rl.num_generations={v['rl.num_generations']} with rl.algorithm=grpo: expected at least 2 (GRPO compares "
      "the samples of a prompt; rl.algorithm=ppo takes 1)"
    )
  if v["rl.algorithm"] == "ppo" and v["rl.use_agentic_rollout"]:
    raise ConfigError(
      "rl.algorithm='ppo' with rl.use_agentic_rollout=true: agentic GRPO has no critic; PPO trains in standard "
      "mode (expected rl.use_agentic_rollout=false, or rl.algorithm=grpo)"
    )
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
  group, mini = v["rl.num_generations"], v["critic.mini_batch_size"]
  if v["rl.algorithm"] == "ppo" and mini and (mini % group or (v["batch_size"] * group) % mini):
    raise ConfigError(
      f"critic.mini_batch_size={mini}: expected 0 or a multiple of rl.num_generations={group} that divides the "
      f"step's {v['batch_size'] * group} completions (batch_size x rl.num_generations)"
    )
  if v["rl.algorithm"] == "ppo" and v["critic.warmup_steps"] >= v["num_batches"]:
    raise ConfigError(
      f"critic.warmup_steps={v['critic.warmup_steps']}: expected fewer than num_batches={v['num_batches']} (the "
      "policy trains on no token in the critic's warmup steps)"
    )
  micro = v["train_micro_batch_size"]
  if micro and v["batch_size"] % micro:
    raise ConfigError(
      f"train_micro_batch_size={micro}: expected 0 (no accumulation) or a divisor of batch_size={v['batch_size']}"
    )
  if v["rl.overlong_buffer_length"] > v["max_response_length"] or v["rl.overlong_penalty"] < 0:
    raise ConfigError(
      f"rl.overlong_buffer_length={v['rl.overlong_buffer_length']}, rl.overlong_penalty={v['rl.overlong_penalty']}: "
      f"expected a buffer from 0 (off) to max_response_length={v['max_response_length']} and a penalty >= 0"
    )


def _check_reward_functions(v: Mapping[str, Any]) -> None:
  """reward_functions and reward_functions_path come together (the file's functions replace the task's);
  reward_weights, where set, weighs each of reward_functions."""
  if v["reward_functions"] and not v["reward_functions_path"]:
    raise ConfigError("reward_functions: set reward_functions_path to the file that defines them")
  if v["reward_functions_path"] and not v["reward_functions"]:
    raise ConfigError(f"reward_functions: name the functions of {v['reward_functions_path']} to use")
  weights, names = list(v["reward_weights"]), list(v["reward_functions"])
  if weights and len(weights) != len(names):
    raise ConfigError(
      f"reward_weights={weights}: expected one weight per function of reward_functions={names} "
      f"({len(names)}), or none (1.0 each)"
    )


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
  """The model's keys together: the context holds the lengths, the layout fits the architecture, the
  query heads group over the key/value heads, and the rope scaling, the family's own keys and the LoRA
  settings are well formed."""
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
  if v["num_query_heads"] % v["num_kv_heads"]:
    raise ConfigError(
      f"num_query_heads={v['num_query_heads']}, num_kv_heads={v['num_kv_heads']}: expected the query heads a "
      "multiple of the key/value heads (each key/value head serves a group of query heads)"
    )
  _check_gemma3_keys(v)
  _check_weights(v)
  if v["lora_alpha"] <= 0:
    raise ConfigError(f"lora_alpha={v['lora_alpha']}: expected a number > 0")
  try:
    re.compile(v["lora_module_path"])
  except re.error as e:
    raise ConfigError(f"lora_module_path={v['lora_module_path']!r}: not a regular expression ({e})") from None
  if v["lora_rank"] > 0:
    _check_lora_path(v)


def _check_lora_path(v: Mapping[str, Any]) -> None:
  """lora_module_path selects some weight that takes an adapter (by our names or a peer's:
  utils/lora_names.py), each of its top-level alternatives selects one, and with scan_layers=true a
  weight is selected in every layer or in none (the decoder, built from its own config, refuses both too)."""
  pattern, num_layers = v["lora_module_path"], v["num_decoder_layers"]
  names = lora_names.layer_weights(num_layers)
  if not any(lora_names.selects(pattern, name) for name in names):
    raise ConfigError(
      f"lora_module_path={pattern!r} matches no weight that takes a LoRA adapter (dotted names such as "
      f"{', '.join(names[:7])}; Tunix's, transformers' and MaxText's names of them match too)"
    )
  unused = lora_names.unused_alternatives(pattern, num_layers)
  if unused:
    raise ConfigError(
      f"lora_module_path={pattern!r}: {', '.join(map(repr, unused))} select(s) no weight of this decoder, whose "
      f"weights that take adapters are {', '.join(lora_names.WEIGHTS)} per layer (as layers.3.attn.q_proj)"
    )
  if v["scan_layers"]:
    for weight in lora_names.WEIGHTS:
      adapted = sum(lora_names.selects(pattern, f"layers.{i}.{weight}") for i in range(num_layers))
      if 0 < adapted < num_layers:
        raise ConfigError(
          f"lora_module_path={pattern!r} selects {weight.split('.')[1]} of {adapted} of the "
          f"{num_layers} layers; with scan_layers=true the layers share one stacked adapter per weight, so a "
          "weight is adapted in every layer or in none (set scan_layers=false to adapt some layers only)"
        )


def _check_weights(v: Mapping[str, Any]) -> None:
  """Random weights load nothing."""
  if v["random_weights"] and v["load_parameters_path"]:
    raise ConfigError(
      f"random_weights=true and load_parameters_path={v['load_parameters_path']}: expected one of them "
      "(random weights load nothing)"
    )


def _check_sampling(v: Mapping[str, Any]) -> None:
  """Sampling that the learner can train on, with top-k and top-p in their ranges."""
  if v["decode_sampling_temperature"] <= 0 and v["rl.use_agentic_rollout"] and v["rollout_engine"] == "batched":
    raise ConfigError(
      f"decode_sampling_temperature={v['decode_sampling_temperature']}: agentic GRPO trains on the "
      "sampler's log-probs, which greedy rollouts do not have; expected a temperature > 0"
    )
  if not 0.0 < v["decode_sampling_top_p"] <= 1.0:
    raise ConfigError(f"decode_sampling_top_p={v['decode_sampling_top_p']}: expected 0 < top_p <= 1 (1: off)")


LOOPBACK = ("127.0.0.1", "::1", "localhost")
SERVE_KEY_ENV, AGENT_KEY_ENV = "MAXTEXT_API_KEY", "MAXTEXT_AGENT_API_KEY"


def api_key(value: str, env: str) -> str | None:
  """A server's API key: the key's value, else the environment variable `env` where it is set, else
  None (no key)."""
  return value or os.environ.get(env) or None


def _check_agent(v: Mapping[str, Any]) -> None:
  """A user's agent (rl.agent): PATH.py:NAME, http, openenv (one of environment.url and environment.command,
  environment.id, or both kinds) or verifiers, on the batched engine (its sessions are served from the
  engine's batcher), without the run's own tools (the agent brings its own), and served beyond this
  machine only with an API key."""
  agent = v["rl.agent"]
  if not agent or not v["rl.use_agentic_rollout"]:
    return
  if agent == "openenv":
    if v["environment.id"]:
      _check_sessions(v)
    if v["environment.url"] and v["environment.command"]:
      raise ConfigError(
        "rl.agent=openenv: expected one of environment.url (a running OpenEnv server) and environment.command "
        "(one the run starts), not both"
      )
    if not (v["environment.url"] or v["environment.command"] or v["environment.id"]):
      raise ConfigError(
        "rl.agent=openenv: expected environment.url (a running OpenEnv server), environment.command (one the run "
        "starts) or environment.id (FILE.py:NAME, a factory of harness sessions); all are empty"
      )
    if v["environment.url"] and not v["environment.url"].startswith(("http://", "https://")):
      raise ConfigError(f"environment.url={v['environment.url']!r}: expected http://HOST:PORT")
  elif agent == "verifiers":
    _check_verifiers(v)
  elif agent != "http":
    _file_and_name(
      "rl.agent", agent, "PATH.py:NAME, a Python file and the async function in it, http, openenv or verifiers"
    )
  if v["rollout_engine"] != "batched":
    raise ConfigError(
      f"rl.agent={agent!r}, rollout_engine={v['rollout_engine']!r}: a user's agent is served from the batched "
      "engine; expected rollout_engine=batched"
    )
  if v["rl.tools"] or v["rl.tools_path"]:
    raise ConfigError(
      f"rl.agent={agent!r}, rl.tools={list(v['rl.tools'])}: the agent calls its own tools (OpenAI function "
      "calling through its client); expected rl.tools=[] and rl.tools_path empty"
    )
  if v["rl.agent_host"] not in LOOPBACK and not api_key(v["rl.agent_api_key"], AGENT_KEY_ENV):
    raise ConfigError(
      f"rl.agent_host={v['rl.agent_host']!r} without rl.agent_api_key (nor ${AGENT_KEY_ENV}): anyone who reaches "
      "the port would take episodes, post rewards and sample from the policy; set a key, or serve at 127.0.0.1"
    )


def _check_sessions(v: Mapping[str, Any]) -> None:
  """rl.agent=openenv with environment.id: FILE.py:NAME of a file that exists, arguments a JSON object."""
  expected = "FILE.py:NAME, NAME an OpenEnv ResourceSessionFactory (or a class or function making one)"
  _file_and_name("environment.id", v["environment.id"], expected)
  _json_object(v["environment.args"], "the factory's")


def _file_and_name(key: str, value: str, expected: str) -> None:
  """`value` is FILE.py:NAME of a file that exists; a ConfigError naming `key` and what was `expected`."""
  path, _, name = value.rpartition(":")
  if not path.endswith(".py") or not name.isidentifier():
    raise ConfigError(f"{key}={value!r}: expected {expected}")
  if not os.path.isfile(path):
    raise ConfigError(f"{key}={value!r}: {path}: file not found")


def _json_object(args: str, whose: str) -> None:
  try:
    parsed = json.loads(args)
  except json.JSONDecodeError as e:
    raise ConfigError(f"environment.args={args!r}: not JSON ({e})") from None
  if not isinstance(parsed, dict):
    raise ConfigError(f"environment.args={args!r}: expected a JSON object of {whose} keyword arguments")


def _check_verifiers(v: Mapping[str, Any]) -> None:
  """rl.agent=verifiers: an environment named, its arguments a JSON object, and no held-out evaluation
  (the environment's rubric judges its own rollouts only: the run's evaluation would score its dataset
  with the run's task)."""
  if not v["environment.id"]:
    raise ConfigError(
      "rl.agent=verifiers: environment.id is empty; expected an installed verifiers environment's id or a Python "
      "file exporting load_environment"
    )
  if v["environment.id"].endswith(".py") and not os.path.isfile(v["environment.id"]):
    raise ConfigError(f"environment.id={v['environment.id']}: file not found")
  _json_object(v["environment.args"], "load_environment's")
  if v["num_test_batches"]:
    raise ConfigError(
      f"rl.agent=verifiers, num_test_batches={v['num_test_batches']}: the run's held-out evaluation would score the "
      "environment's rows with the run's task, not its rubric; expected num_test_batches=0"
    )


def _check_mesh(v: Mapping[str, Any]) -> None:
  fills = [k for k in sections.MeshSection.AXIS_KEYS if v[k] == -1]
  if len(fills) > 1:
    raise ConfigError(f"{', '.join(f'{k}=-1' for k in fills)}: at most one parallelism may be -1")


# What a program needs of the config beyond the rules every program keeps: program -> (key, what is
# expected of its value, which must be set: not 0 or empty).
PROGRAM_RULES: dict[str, tuple[str, str]] = {
  "evaluate_rl": ("num_test_batches", "evaluate_rl has nothing to evaluate; expected a positive integer"),
  "to_huggingface": ("hf_output_path", "required (the folder to write the HF checkpoint to)"),
  "train_reward_model": ("reward_training.output_path", "required (the folder to write the reward model to)"),
}


def check_program(v: Mapping[str, Any], program: str) -> None:
  """The rule PROGRAM_RULES gives `program` (one of its programs)."""
  key, expected = PROGRAM_RULES[program]
  if not v[key]:
    raise ConfigError(f"{key}={v[key]}: {expected}" if v[key] == 0 else f"{key}: {expected}")


def check_job(v: Mapping[str, Any], mesh: sections.MeshSection, job: distributed.Job) -> None:
  """The rules of the run's layout (`mesh`, the config's mesh section) on the job's processes and
  devices: the mesh axes fit the devices (each process's own too, where agentic GRPO samples on them),
  the device fractions leave a device to trainer and sampler (in one process), agentic GRPO across
  processes gives each an equal share of every batch, and cuDNN flash attention runs on an NVIDIA GPU."""
  agentic = v["rl.use_agentic_rollout"]
  if mesh.split:
    _check_split(v, mesh, job)
  else:
    _check_fits(mesh, job.devices)
    if agentic and job.processes > 1:
      _check_fits(
        mesh,
        job.local_devices,
        f" (agentic GRPO across {job.processes} processes samples on each process's {job.local_devices} "
        "devices with the same parallelism keys: set the one to fill to -1)",
      )
  if agentic and job.processes > 1:
    _check_agentic_processes(v, job.processes)
    if v["reward_model.load_parameters_path"]:
      raise ConfigError(
        f"reward_model.load_parameters_path with rl.use_agentic_rollout=true across {job.processes} processes: "
        "each process scores its own episodes, and the reward model runs on the mesh every process shares "
        "(expected one process, or standard mode)"
      )
  if v["attention"] == "cudnn_flash" and not job.nvidia:
    raise ConfigError(
      f"attention=cudnn_flash: cuDNN flash attention needs an NVIDIA GPU, but JAX's backend is {job.backend}; "
      f"expected one of {', '.join(sections.choices()['attention'])} (autoselected or dot_product on this backend)"
    )


def _check_fits(mesh: sections.MeshSection, devices: int, why: str = "") -> None:
  """The mesh axes fit `devices` devices (MeshSection.shape's error, then `why`)."""
  try:
    mesh.shape(devices)
  except ValueError as e:
    raise ConfigError(f"{e}{why}") from None


def _check_split(v: Mapping[str, Any], mesh: sections.MeshSection, job: distributed.Job) -> None:
  tf, sf = v["trainer_devices_fraction"], v["sampler_devices_fraction"]
  if job.processes > 1:
    raise ConfigError(
      f"trainer_devices_fraction={tf}, sampler_devices_fraction={sf}: trainer and sampler on separate devices "
      f"are not supported across {job.processes} processes (each program would run on some processes' "
      "devices only, while every process runs every program); leave both at 1.0"
    )
  n_train, n_sample = mesh.device_counts(job.devices)
  if n_train < 1 or n_sample < 1 or n_train + n_sample > job.devices:
    raise ConfigError(
      f"trainer_devices_fraction={tf}, sampler_devices_fraction={sf}: need at least one device each "
      f"and no more than the {job.devices} available (got {n_train} + {n_sample})"
    )
  _check_fits(mesh, n_train)
  _check_fits(mesh, n_sample)


def _check_agentic_processes(v: Mapping[str, Any], processes: int) -> None:
  if v["rl.dynamic_sampling"]:
    raise ConfigError(
      f"rl.dynamic_sampling=true: not supported in agentic GRPO across {processes} processes (a step's "
      "replacement prompts would have to be sampled in step on every process); use standard GRPO"
    )
  for key in ("batch_size", "train_micro_batch_size"):
    if v[key] % processes:
      raise ConfigError(
        f"{key}={v[key]}: agentic GRPO across {processes} processes gives every process "
        f"an equal share of each batch; expected a multiple of {processes}"
      )


def check(v: Mapping[str, Any]) -> None:
  """Refuses, with a ConfigError, the first rule that the merged values `v` (dotted key -> value, every
  key of base.yml) break: the paths, each key's own choices and bounds (sections.field_problems, all
  of them in one refusal), then the rules that relate keys."""
  _check_paths(v)
  if v["rollout_engine"] == "vllm":
    raise ConfigError(
      "rollout_engine='vllm': not supported (nothing maps this program's parameters to vLLM's or "
      "syncs them after each step); expected one of batched, vanilla"
    )
  problems = sections.field_problems(v)
  if problems:
    raise ConfigError.of(problems)
  _check_mesh(v)
  _check_model(v)
  _check_algorithm(v)
  _check_reward_functions(v)
  _check_sampling(v)
  _check_agent(v)
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
  if v["rl.algorithm"] == "ppo":
    mode = "PPO (rl.algorithm=ppo)"
  elif v["rl.use_agentic_rollout"]:
    mode = "agentic GRPO (rl.use_agentic_rollout=true)"
  else:
    mode = "standard GRPO (rl.use_agentic_rollout=false)"
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
