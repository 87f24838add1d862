"""Builds the one frozen, validated run config from YAML files and key=value overrides.

Precedence: base.yml < the given YAML (which names `base_config`) < models/<model_name>.yml (or
the config.json of an HF checkpoint in load_parameters_path) < command line. Every key must exist
in base.yml; values must fit the type of its default (an int widens to float, a string to a
one-item list).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from typing import Any

import yaml

from maxtext import tasks
from maxtext.checkpoint_conversion import hf_config
from maxtext.configs import checks, config_yml, maxtext_compat, maxtext_keys, peer_names, sections
from maxtext.configs.run_config import RunConfig
from maxtext.utils import storage
from maxtext.utils.errors import ConfigError

log = logging.getLogger(__name__)

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
BASE_YAML = os.path.join(CONFIG_DIR, "base.yml")
MODELS_DIR = os.path.join(CONFIG_DIR, "models")

# Accepted spellings of keys, mapped to the canonical key.
KEY_ALIASES = {"model": "model_name", **maxtext_keys.RENAMED}


def resolve_yaml_path(name: str) -> str:
  """A YAML path as given, or a bare file name found under the configs folder."""
  if os.path.isfile(name):
    return name
  if not os.path.isabs(name):
    for root, _, files in os.walk(CONFIG_DIR):
      if os.path.basename(name) in files and os.path.dirname(name) in ("", os.path.basename(root)):
        return os.path.join(root, os.path.basename(name))
  raise ConfigError(f"{name}: config file not found (a YAML path, or a file name under {CONFIG_DIR})")


def _load_chain(path: str, seen: tuple[str, ...] = ()) -> list[tuple[str, dict[str, Any]]]:
  """[(path, flat values)] from base.yml down to `path`. A YAML without base_config extends base.yml
  (as MaxText's configs extend MaxText's), and a base_config naming a base.yml that is not there
  (MaxText's `../base.yml`) names ours."""
  path = os.path.abspath(path)
  if path in seen:
    raise ConfigError(f"{path}: base_config cycle through {' -> '.join(seen)}")
  data = config_yml.read_yaml(path)
  parent = data.pop("base_config", None)
  if path == BASE_YAML:
    return [(path, config_yml.flatten(data))]
  if parent is None:
    parent_path = BASE_YAML
  else:
    parent_path = parent if os.path.isabs(parent) else os.path.join(os.path.dirname(path), parent)
    if not os.path.isfile(parent_path):
      parent_path = BASE_YAML if os.path.basename(parent) == "base.yml" else resolve_yaml_path(parent)
  return _load_chain(parent_path, seen + (path,)) + [(path, config_yml.flatten(data))]


def _type_name(value: Any) -> str:
  return {bool: "bool", int: "int", float: "float", str: "string", list: "list"}.get(type(value), type(value).__name__)


_JSON_OBJECT_KEYS = frozenset(sections.json_object_keys())


def _check_value(key: str, value: Any, default: Any, source: str) -> Any:
  """The value if it fits the default's type (ints widen to float); else a ConfigError."""
  if default is None or value is None:
    return value
  if isinstance(default, str) and isinstance(value, dict) and key in _JSON_OBJECT_KEYS:
    return json.dumps(value)  # a JSON object's key given a mapping (JSON on the command line is YAML too)
  if isinstance(default, bool):
    ok = isinstance(value, bool)
  elif isinstance(default, float):
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
      try:
        value = float(value)
      except ValueError:
        pass
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    value = float(value) if ok else value
  elif isinstance(default, int):
    ok = isinstance(value, int) and not isinstance(value, bool)
  elif isinstance(default, list) and isinstance(value, str):  # one string where a list is expected
    value, ok = [value], True
  else:
    ok = isinstance(value, type(default))
  if not ok:
    raise ConfigError(f"{key}={value!r} ({source}): expected {_type_name(default)}, got {_type_name(value)}")
  return value


def _unknown_key(key: str, known: list[str], source: str) -> str:
  """The refusal of `key`: what a peer's key of that name is here (peer_names), else the closest of
  ours by spelling."""
  hint = peer_names.meaning(key)
  if hint:
    return f"{key}: unknown key ({source}); {hint}"
  close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
  hint = f"; did you mean {close[0]}?" if close else ""
  return f"{key}: unknown key ({source}){hint}"


class _Merger:
  """Applies layers of flat overrides onto the flat defaults, checking types. Keys that are neither
  base.yml's nor MaxText's are gathered in `unknown`, MaxText's keys that base.yml lacks in `maxtext`
  (key -> (value, source)) and values of the wrong type in `mistyped`, for one report of them all."""

  def __init__(self, defaults: dict[str, Any]):
    self.defaults = defaults
    self.values = dict(defaults)
    self.set_by: dict[str, str] = {}
    self.layer: dict[str, int] = {}  # key -> the index of the apply() call that last set it
    self.unknown: list[tuple[str, str]] = []
    self.maxtext: dict[str, tuple[Any, str]] = {}
    self.mistyped: list[str] = []
    self._applied = 0

  def apply(self, flat: dict[str, Any], source: str) -> None:
    self._applied += 1
    for key, value in flat.items():
      key = KEY_ALIASES.get(key, key)
      if key in self.defaults:
        try:
          self.values[key] = _check_value(key, value, self.defaults[key], source)
        except ConfigError as e:
          self.mistyped.append(str(e))
          continue
        self.set_by[key] = source
        self.layer[key] = self._applied
      elif maxtext_compat.is_maxtext_only(key):
        self.maxtext[key] = (value, source)
      else:
        self.unknown.append((key, source))


def parse_overrides(args: list[str]) -> dict[str, Any]:
  """key=value strings -> {dotted key: YAML-parsed scalar}."""
  out = {}
  for arg in args:
    key, sep, raw = arg.partition("=")
    if not sep or not key:
      raise ConfigError(f"{arg!r}: expected key=value")
    try:
      value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
      value = raw
    out[key.strip()] = value
  return out


# Inputs that a program reads from a local copy when they are on a bucket (with_local_inputs); the
# others are outputs, stay on the machine (jax_cache_dir) or are Orbax checkpoints, read in place.
_COPIED_INPUTS = sections.path_keys("input")


def reference() -> list[tuple[str, str, str]]:
  """(dotted key, default as written in base.yml, meaning) for every key of base.yml, in file order;
  the meaning is the `doc` on the key's section field (sections.docs)."""
  meanings = sections.docs()
  out, section = [], ""
  with open(BASE_YAML, encoding="utf-8") as f:
    for line in f:
      body = line.rstrip("\n")
      if not body.strip() or body.lstrip().startswith(("#", "-")):
        continue
      key, _, value = body.strip().partition(":")
      if not body.startswith(" "):
        section = ""
        if not value.strip() and key not in meanings:  # a section (rl:), not a key whose list follows
          section = key + "."
          continue
      out.append((section + key, value.strip(), meanings[section + key]))
  return out


def known_models() -> list[str]:
  return sorted(f[:-4] for f in os.listdir(MODELS_DIR) if f.endswith(".yml"))


def with_local_inputs(cfg: RunConfig) -> RunConfig:
  """cfg with every input on a bucket replaced by a local copy, but Orbax checkpoints, which Orbax
  reads where they are; config.yml keeps recording the URLs."""
  from maxtext.checkpoint_conversion import orbax_checkpoint

  flat, urls, copies = cfg.flat(), {}, {}
  for key in _COPIED_INPUTS:
    url = flat[key]
    if not storage.is_url(url) or (key == "load_parameters_path" and orbax_checkpoint.is_orbax_checkpoint(url)):
      continue
    urls[key], copies[key] = url, storage.local_copy(key, url)
  return cfg.replace_values(copies, urls) if urls else cfg


def initialize(argv: list[str]) -> RunConfig:
  """argv as on the command line (argv[0] ignored): [yaml] key=value ... -> the frozen config, with every
  rule of RunConfig.check kept but those of the job's devices (RunConfig.check(job), where the program
  starts JAX), each key set taking effect in the run's mode, and the task reading its reward keys."""
  args = list(argv[1:])
  yaml_path = BASE_YAML
  if args and "=" not in args[0]:
    yaml_path = resolve_yaml_path(args.pop(0))
  cli = parse_overrides(args)

  chain = _load_chain(yaml_path)
  _, defaults = chain[0]
  merger = _Merger(defaults)
  for path, flat in chain[1:]:
    merger.apply(flat, path)

  cli = {KEY_ALIASES.get(k, k): v for k, v in cli.items()}
  hf_path = str(cli.get("load_parameters_path", merger.values["load_parameters_path"]) or "")
  checks.check_storable("load_parameters_path", hf_path)
  if storage.is_url(hf_path) and not storage.exists("load_parameters_path", hf_path):
    raise ConfigError(f"load_parameters_path={hf_path}: no such object or folder in the bucket")
  hf_arch = hf_config.architecture(hf_path) if hf_config.is_hf_checkpoint(hf_path) else None
  if hf_arch is not None and "model_name" not in cli:
    hf_source = os.path.join(hf_path, "config.json")
    merger.apply(hf_arch, hf_source)
    merger.apply({"model_name": os.path.basename(os.path.normpath(hf_path))}, hf_source)
  else:
    model_name = cli.get("model_name", merger.values["model_name"])
    model_yaml = os.path.join(MODELS_DIR, f"{model_name}.yml")
    if not os.path.isfile(model_yaml):
      raise ConfigError(f"model_name={model_name!r}: unknown model; known models: {', '.join(known_models())}")
    merger.apply(config_yml.flatten(config_yml.read_yaml(model_yaml)), model_yaml)
  merger.apply(cli, "command line")
  if hf_arch is not None:
    checks.check_architecture(merger.values, hf_arch, hf_path)

  problems = [_unknown_key(key, list(merger.defaults), source) for key, source in merger.unknown]
  maxtext_only = maxtext_compat.check_keys(merger.maxtext, merger.values["maxtext_compat"], problems + merger.mistyped)
  notes = maxtext_compat.translate(merger.values, merger.set_by)
  for key, value in merger.values.items():
    if value is None and defaults[key] is not None:
      raise ConfigError(f"{key}=None ({merger.set_by[key]}): expected {_type_name(defaults[key])}")
  maxtext_compat.apply_length_aliases(merger.values, merger.set_by)
  sources = {k: merger.set_by.get(k, "derived") + (f", {notes[k]}" if k in notes else "") for k in merger.values}
  overridden = {k: (merger.values[k], sources[k]) for k in merger.values if merger.values[k] != defaults[k]}
  config = RunConfig.from_values(merger.values, overridden, maxtext_only=maxtext_only).check()
  changed = [k for k in merger.set_by if merger.values[k] != defaults[k]]
  checks.check_modes(merger.values, merger.set_by, merger.layer, changed)
  ignored = tasks.select(merger.values["dataset_name"]).ignored(
    list(overridden), user_rewards=bool(merger.values["reward_functions_path"])
  )
  if ignored:
    raise ConfigError(ignored)
  return config
