"""MaxText's config, read by this program: which keys are MaxText's alone (maxtext_keys.py's tables),
the refusal of those this program cannot honour, and the translation of MaxText's values of our own
keys (MaxText's length keys, remat_policy=custom, -1 batch sizes, null defaults, comma-separated
reward_functions, its data template path, its logical_axis_rules). pyconfig applies them while it
merges the layers of a config.
"""

from __future__ import annotations

import logging
import os
import reprlib
from collections.abc import Callable, Mapping
from typing import Any

from maxtext.configs import maxtext_keys, sections
from maxtext.utils.errors import ConfigError

log = logging.getLogger(__name__)


def is_maxtext_only(key: str) -> bool:
  """A MaxText key that base.yml lacks and no alias names: FIXED, generation_configs or ENGINE_ONLY."""
  return (
    key in maxtext_keys.FIXED
    or key.split(".")[0] == "generation_configs"
    or maxtext_keys.engine_only_reason(key) is not None
  )


def apply_length_aliases(v: dict[str, Any], set_by: Mapping[str, str]) -> None:
  """Maps MaxText's max_prefill_predict_length / max_target_length onto our length knobs in `v`
  (dotted key -> value; set_by: the keys some layer set)."""
  prefill, target = v["max_prefill_predict_length"], v["max_target_length"]
  for key in ("max_prefill_predict_length", "max_target_length"):
    problem = sections.key_problem(key, v[key])
    if problem:
      raise ConfigError(problem)
  if prefill != -1:
    if "max_prompt_length" in set_by and v["max_prompt_length"] != prefill:
      raise ConfigError(
        f"max_prefill_predict_length={prefill} conflicts with max_prompt_length="
        f"{v['max_prompt_length']}; set one of them"
      )
    v["max_prompt_length"] = prefill
  if target != -1:
    response = target - v["max_prompt_length"]
    if response <= 0:
      raise ConfigError(f"max_target_length={target} must exceed the prompt length {v['max_prompt_length']}")
    if "max_response_length" in set_by and v["max_response_length"] != response:
      raise ConfigError(
        f"max_target_length={target} implies max_response_length={response}, which conflicts "
        f"with max_response_length={v['max_response_length']}; set one of them"
      )
    v["max_response_length"] = response
  v["max_prefill_predict_length"] = v["max_prompt_length"]
  v["max_target_length"] = v["max_prompt_length"] + v["max_response_length"]


def _generation_configs_problem(key: str, value: Any, source: str) -> str | None:
  """Why MaxText's generation_configs (or one dotted key of it) is refused, or None: it must hold the
  evaluation presets of sections.EVAL_SAMPLING, this program's eval_sampling_strategy choices being
  fixed. A greedy preset is any with eval_top_k 1 or eval_temperature 0 (MaxText's own: 0.01, top_k 1)."""
  if key == "generation_configs":
    presets = value
  else:  # one dotted key of it: generation_configs.<preset>[.<field>]
    name, _, field = key.partition(".")[2].partition(".")
    presets = {name: {field: value} if field else value}
  fields = {"eval_temperature": "temperature", "eval_top_p": "top_p", "eval_top_k": "top_k"}
  here: dict[str, dict[str, Any]] = {name: params for name, params in sections.EVAL_SAMPLING.items()}
  expected = f"expected presets among {', '.join(here)}, each of {', '.join(fields)}"
  if not isinstance(presets, dict):
    return f"generation_configs={presets!r} ({source}): {expected}"
  for name, preset in presets.items():
    ours = here.get(name)
    if ours is None or not isinstance(preset, dict) or set(preset) - set(fields):
      return f"generation_configs.{name}={preset!r} ({source}): {expected}"
    if name == "greedy" and (preset.get("eval_top_k") == 1 or preset.get("eval_temperature") == 0):
      continue
    if any(preset[f] != ours[k] for f, k in fields.items() if f in preset):
      wanted = {f: ours[k] for f, k in fields.items() if ours[k] is not None}
      greedy = " (or eval_top_k: 1)" if name == "greedy" else ""
      return (
        f"generation_configs.{name}={preset!r} ({source}): eval_sampling_strategy={name} samples with "
        f"{wanted}{greedy} here, and its presets are fixed; expected those values"
      )
  return None


def _fixed_problem(key: str, value: Any, source: str) -> str | None:
  """Why a FIXED key of MaxText's (or generation_configs) is refused, or None: it is at another
  value than what this program does."""
  if key.split(".")[0] == "generation_configs":
    return _generation_configs_problem(key, value, source)
  accepted, what = maxtext_keys.FIXED[key]
  return None if value == accepted else f"{key}={value!r} ({source}): not supported, {what}; expected {accepted!r}"


def check_keys(maxtext: Mapping[str, tuple[Any, str]], compat: bool, problems: list[str]) -> dict[str, Any]:
  """Refuses, in one ConfigError with the `problems` found before (unknown keys), every MaxText key
  (`maxtext`: key -> (value, source)) fixed here at another value than this program's, and (without
  maxtext_compat=true, `compat`) every MaxText key that only tunes what this program does not run,
  grouped by reason. Returns the latter keys that maxtext_compat accepts (dotted key -> value, a
  credential's as maxtext_keys.REDACTED), logging them."""
  problems = list(problems)
  engine_only = {
    k: (maxtext_keys.REDACTED, source) if k in maxtext_keys.SECRET else (v, source)
    for k, (v, source) in maxtext.items()
    if maxtext_keys.engine_only_reason(k)
  }
  for key, (value, source) in maxtext.items():
    problem = None if key in engine_only else _fixed_problem(key, value, source)
    if problem:
      problems.append(problem)
  one_source = len({source for _, source in engine_only.values()}) == 1
  groups: dict[str, list[str]] = {}
  for key, (value, source) in engine_only.items():
    shown = f"{key}={value!r}" if one_source else f"{key}={value!r} ({source})"
    groups.setdefault(str(maxtext_keys.engine_only_reason(key)), []).append(shown)
  listed = "; ".join(f"[{reason}] {', '.join(keys)}" for reason, keys in groups.items())
  if one_source:
    listed = f"{next(iter(engine_only.values()))[1]}: {listed}"
  if groups and not compat:
    problems.append(
      f"MaxText keys that only tune what this program does not run, refused unless maxtext_compat=true "
      f"(which accepts them unused): {listed}"
    )
  if compat and not groups:
    problems.append(
      "maxtext_compat=true: no key of this config needs it (it accepts MaxText keys that only tune what "
      "this program does not run); remove it"
    )
  if problems:
    raise ConfigError.of(problems)
  if groups:
    log.warning("maxtext_compat=true accepts these MaxText keys, unused: %s", listed)
  return {k: v for k, (v, _) in engine_only.items()}


def _shipped_template(path: str) -> str:
  """A data template of MaxText's (maxtext/examples/chat_templates/gsm8k_rl.json), where that path is
  not here, as the file name of the one shipped here under its name (same system prompt; the turns
  come from the tokenizer's chat template)."""
  name = os.path.basename(path)
  shipped = os.path.isfile(os.path.join(sections.TEMPLATE_DIR, name))
  return name if "chat_templates/" in path and shipped and not os.path.exists(path) else path


def _axis_rules(rules: list) -> list:
  """logical_axis_rules as [logical axis, [mesh axes]] on this program's mesh. MaxText's rules may
  name one mesh axis for a list, and its mesh axes that this mesh lacks (maxtext_keys.OTHER_MESH_AXES),
  which leave a dimension unsharded as an axis of size 1 would; any other name is refused."""
  out = []
  for rule in rules:
    if not (isinstance(rule, list) and len(rule) == 2 and isinstance(rule[0], str)):
      raise ConfigError(f"logical_axis_rules: {rule!r}: expected [logical axis, [mesh axes]]")
    name, axes = rule[0], [rule[1]] if isinstance(rule[1], str) else rule[1]
    unknown = [a for a in axes if a not in sections.MESH_AXES + maxtext_keys.OTHER_MESH_AXES]
    if unknown:
      raise ConfigError(
        f"logical_axis_rules: {rule!r} names mesh axes {unknown}; expected {', '.join(sections.MESH_AXES)}"
      )
    out.append([name, [a for a in axes if a in sections.MESH_AXES]])
  return out


def translate(v: dict[str, Any], set_by: Mapping[str, str]) -> dict[str, str]:
  """Sets our keys that hold a value MaxText gives a meaning base.yml spells otherwise to ours:
  remat_policy=custom, train_micro_batch_size=-1 (no accumulation), eval_batch_size=-1 (batch_size),
  null rl.epsilon_high (grpo_epsilon) and math_verify_num_procs (min(batch_size, CPUs)),
  comma-separated reward_functions, MaxText's data template path and logical_axis_rules. Returns
  key -> a note of MaxText's value, for the listing of keys that differ from base.yml."""
  translations: dict[str, Callable[[Any], Any]] = {
    "remat_policy": lambda x: maxtext_keys.REMAT_CUSTOM if x == "custom" else x,
    "train_micro_batch_size": lambda x: 0 if x == -1 else x,
    "eval_batch_size": lambda x: v["batch_size"] if x == -1 else x,
    "rl.epsilon_high": lambda x: -1.0 if x is None else x,
    "math_verify_num_procs": lambda x: min(v["batch_size"], os.cpu_count() or 1) if x is None else x,
    "reward_functions": lambda x: [n.strip() for item in x for n in str(item).split(",") if n.strip()],
    "data_template_path": _shipped_template,
    "logical_axis_rules": _axis_rules,
  }
  notes = {}
  for key, ours in translations.items():
    if key in set_by:
      value = ours(v[key])
      if value != v[key]:
        notes[key] = f"MaxText's {reprlib.repr(v[key])}"
        v[key] = value
  return notes
