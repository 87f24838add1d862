"""Python files the user names in the config (dataset processor, reward functions, tools)."""

from __future__ import annotations

import importlib.util
import os
import traceback
import types

from maxtext.utils import errors


def load_file(path: str, key: str) -> types.ModuleType:
  """Runs the Python file at path (named by config key `key`) as a module and returns it. A file that
  does not compile or raises as it runs (an import that fails, say) is an InputError naming the key,
  the file and the line (its traceback is the error's cause)."""
  if not os.path.isfile(path):
    raise errors.MissingInputError(f"{key}={path}: file not found")
  spec = importlib.util.spec_from_file_location(f"user_{key.replace('.', '_')}", path)
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:
    raise errors.InputError(f"{key}={path}:{_line(e, path)} {type(e).__name__}: {_message(e, path)}") from e
  return module


def _line(e: Exception, path: str) -> str:
  """`N:` where N is the file's line that failed (a syntax error's, or the deepest traceback frame in
  the file), else empty."""
  if isinstance(e, SyntaxError) and e.lineno and _same(e.filename, path):
    return f"{e.lineno}:"
  lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if _same(f.filename, path)]
  return f"{lines[-1]}:" if lines else ""


def _message(e: Exception, path: str) -> str:
  """The exception's message on one line; a syntax error's location only where it is another file's
  (one the file imports), since _line gives the file's own."""
  text = str(e)
  if isinstance(e, SyntaxError):
    text = e.msg if _same(e.filename, path) else f"{e.msg} ({e.filename}:{e.lineno})"
  return " ".join(text.split())


def _same(a: str | None, b: str) -> bool:
  return os.path.abspath(a or "") == os.path.abspath(b)
