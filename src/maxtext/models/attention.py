"""Which attention the decoder computes with: MaxText's `attention` key, resolved once, where the
decoder's ModelConfig is built from the model section, against the backend JAX runs on and the
model's dtype."""

from __future__ import annotations

from typing import Literal

import jax
import jax.extend

from maxtext.configs import sections
from maxtext.configs.sections import ModelSection
from maxtext.utils.errors import ConfigError

# What `select` resolves the key to: the decoder's two ways of computing attention.
Selected = Literal["dot_product", "cudnn_flash"]


def backend() -> tuple[str, bool]:
  """(JAX's default backend as messages name it, whether it is an NVIDIA GPU): a GPU is named with its
  platform version (cuda or rocm and the version), which tells NVIDIA's apart."""
  name = jax.default_backend()
  if name != "gpu":
    return name, False
  version = jax.extend.backend.get_backend().platform_version
  return f"gpu ({version})", version.lower().startswith("cuda")


def select(model: ModelSection) -> Selected:
  """The attention `cfg.attention` names on this backend: autoselected is cudnn_flash on an NVIDIA GPU
  with dtype bfloat16 and dot_product elsewhere; cudnn_flash elsewhere than on an NVIDIA GPU is a
  ConfigError naming the key, the value, the backend and the choices (pyconfig refuses it with a dtype
  other than bfloat16)."""
  if model.attention == "dot_product" or (model.attention == "autoselected" and model.dtype != "bfloat16"):
    return "dot_product"
  name, nvidia = backend()
  if model.attention == "autoselected":
    return "cudnn_flash" if nvidia else "dot_product"
  if not nvidia:
    choices = ", ".join(sections.choices()["attention"])
    raise ConfigError(
      f"attention=cudnn_flash: cuDNN flash attention needs an NVIDIA GPU, but JAX's backend is {name}; "
      f"expected one of {choices} (autoselected or dot_product on this backend)"
    )
  return "cudnn_flash"
