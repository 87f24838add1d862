"""Reads and writes Hugging Face checkpoint directories (config.json + *.safetensors)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors import numpy as safetensors_np

from maxtext.checkpoint_conversion import hf_config
from maxtext.configs.sections import ModelSection
from maxtext.utils import errors


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """All tensors of an HF checkpoint directory (single file or sharded with an index), as stored; a
  weights file missing, truncated or damaged is an InputError naming it."""
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    try:
      with open(index, encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # not JSON, not UTF-8, no weight_map mapping
      raise errors.InputError(f"{index}: not a safetensors index (a JSON object with a weight_map) ({e!r})") from e
    files = [os.path.join(path, name) for name in files]
  else:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
  if not files:
    raise errors.MissingInputError(f"{path}: no *.safetensors weights in the HF checkpoint directory")
  out = {}
  for name in files:
    if not os.path.isfile(name):
      raise errors.MissingInputError(f"{name}: listed in model.safetensors.index.json but missing")
    try:
      with safe_open(name, framework="np") as f:
        for key in f.keys():
          out[key] = f.get_tensor(key)
    except SafetensorError as e:
      raise errors.InputError(f"{name}: not a complete safetensors file, truncated or damaged ({e})") from e
  return out


def write(
  path: str, state: dict[str, np.ndarray], model: ModelSection, tokenizer=None, sequence_classifier: bool = False
) -> None:
  """config.json (of a causal LM, or with `sequence_classifier` of a one-output *ForSequenceClassification),
  model.safetensors and (when given) the tokenizer files with their chat template, written into a new
  folder beside `path` that then takes its place: a process killed while it writes leaves what `path`
  held (and a `.NAME.writing-*` folder beside it)."""
  parent, name = os.path.split(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  fresh = tempfile.mkdtemp(prefix=f".{name}.writing-", dir=parent)
  try:
    hf_config.to_hf_config(model, tokenizer, sequence_classifier).save_pretrained(fresh)
    safetensors_np.save_file(state, os.path.join(fresh, "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
      tokenizer.save_pretrained(fresh)
  except BaseException:
    shutil.rmtree(fresh, ignore_errors=True)
    raise
  if os.path.isdir(path):  # the old folder steps aside, the new one takes its name, then the old goes
    old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
    os.rename(path, os.path.join(old, name))
    os.rename(fresh, path)
    shutil.rmtree(old)
  else:
    os.rename(fresh, path)
