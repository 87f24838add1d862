"""Which attention the decoder computes with: MaxText's `attention` key, resolved once, where the
decoder's ModelConfig is built from the model section, against the backend JAX runs on and the
model's dtype."""

from __future__ import annotations

from typing import Literal

from maxtext.configs.sections import ModelSection
from maxtext.utils import distributed

# What `select` resolves the key to: the decoder's two ways of computing attention.
Selected = Literal["dot_product", "cudnn_flash"]


def select(model: ModelSection) -> Selected:
  """The attention `model.attention` names on this backend: autoselected is cudnn_flash on an NVIDIA
  GPU with dtype bfloat16 and dot_product elsewhere. cudnn_flash elsewhere than on an NVIDIA GPU, or
  with a dtype other than bfloat16, is refused when the config is checked (checks.check_job, checks.check)."""
  if model.attention == "dot_product" or (model.attention == "autoselected" and model.dtype != "bfloat16"):
    return "dot_product"
  nvidia = distributed.job().nvidia
  if model.attention == "autoselected":
    return "cudnn_flash" if nvidia else "dot_product"
  if not nvidia:
    raise ValueError("attention=cudnn_flash needs an NVIDIA GPU (the config check against the job refuses it)")
  return "cudnn_flash"
