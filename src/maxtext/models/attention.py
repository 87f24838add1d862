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
  """The attention `model.attention` names on this backend: autoselected is dot_product on every
  backend (cuDNN's backward pass has given NaN gradients on left-padded rows; cudnn_flash is taken
  only when named, until its GPU test passes). cudnn_flash elsewhere than on an NVIDIA GPU, or with a
  dtype other than bfloat16, is refused when the config is checked (checks.check_job, checks.check)."""
  if model.attention in ("dot_product", "autoselected"):
    return "dot_product"
  if not distributed.job().nvidia:
    raise ValueError("attention=cudnn_flash needs an NVIDIA GPU (the config check against the job refuses it)")
  return "cudnn_flash"
