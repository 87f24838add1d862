"""A config as YAML: reading a config file into dotted keys, and writing a run's config.yml, which
loads as a config again."""

from __future__ import annotations

import itertools
import os
import tempfile
from typing import Any

import yaml

from maxtext.configs import maxtext_keys
from maxtext.configs.run_config import RunConfig
from maxtext.configs.sections import unflatten
from maxtext.utils import safe_files, storage
from maxtext.utils.errors import ConfigError

# Keys whose value is a whole mapping (not a section of keys).
MAPPING_VALUED_KEYS = ("rope_scaling", *maxtext_keys.MAPPING_VALUED)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """A YAML mapping as dotted key -> value (a mapping-valued key's mapping kept whole)."""
  out = {}
  for key, value in tree.items():
    dotted = f"{prefix}{key}"
    if isinstance(value, dict) and dotted not in MAPPING_VALUED_KEYS:
      out.update(flatten(value, dotted + "."))
    else:
      out[dotted] = value
  return out


def read_yaml(path: str) -> dict[str, Any]:
  """A config file's mapping; a ConfigError naming the file where it cannot be read or is not one."""
  try:
    with open(path, encoding="utf-8") as f:
      data = yaml.safe_load(f) or {}
  except OSError as e:
    raise ConfigError(f"{path}: cannot read config file ({e.strerror})") from e
  except yaml.YAMLError as e:
    raise ConfigError(f"{path}: not valid YAML ({e})") from e
  if not isinstance(data, dict):
    raise ConfigError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
  return data


def written_values(config: RunConfig) -> dict[str, Any]:
  """Dotted key -> value as config.yml records them: inputs copied from a bucket by their URL, secret
  keys as RunConfig.public writes them."""
  return {**config.public(), **config.urls}


def write_yaml(config: RunConfig, path: str, comments: list[str] | tuple[str, ...] = ()) -> None:
  """Writes config as YAML to a local path (atomically: safe_files.replaced) or a gs:// URL, after the
  comment lines `comments`: every key, then the MaxText keys maxtext_compat accepted (so that the
  file loads as a config again)."""
  if storage.is_url(path):
    with tempfile.TemporaryDirectory() as folder:
      write_yaml(config, os.path.join(folder, "config.yml"), comments)
      storage.upload(os.path.join(folder, "config.yml"), path)
    return
  with safe_files.replaced(path) as f:
    f.writelines(line + "\n" for line in comments)
    yaml.safe_dump(unflatten({**written_values(config), **config.maxtext_only}), f, sort_keys=False)


def read_written(path: str) -> tuple[dict[str, Any], list[str]]:
  """A config.yml that write_yaml wrote: its dotted keys and values, and its leading comment lines."""
  values = flatten(read_yaml(path))
  with open(path, encoding="utf-8") as f:
    comments = list(itertools.takewhile(lambda line: line.startswith("#"), (line.rstrip("\n") for line in f)))
  return values, comments
