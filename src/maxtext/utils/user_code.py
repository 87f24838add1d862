"""Python files the user names in the config (dataset processor, reward functions, tools)."""

from __future__ import annotations

import importlib.util
import os
import types

from maxtext.utils import errors


def load_file(path: str, key: str) -> types.ModuleType:
  """Runs the Python file at path (named by config key `key`) as a module and returns it."""
  if not os.path.isfile(path):
    raise errors.MissingInputError(f"{key}={path}: file not found")
  spec = importlib.util.spec_from_file_location(f"user_{key.replace('.', '_')}", path)
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
