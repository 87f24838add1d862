"""Builds the decoder for a run from load_parameters_path (GGUF file, HF checkpoint directory or
Orbax checkpoint), the model's embedded default, or a seeded random init."""

from __future__ import annotations

import logging
import os

import numpy as np
from jax.sharding import Mesh

from maxtext import assets
from maxtext.checkpoint_conversion import gguf_reader, hf_checkpoint, hf_config, orbax_checkpoint
from maxtext.models import builder, hf_layout
from maxtext.models.decoder import Decoder, ModelConfig
from maxtext.utils import errors
from maxtext.utils.errors import ConfigError

log = logging.getLogger(__name__)


def _check_gguf_architecture(path: str, cfg) -> None:
  reader = gguf_reader.open_gguf(path)
  arch = gguf_reader.field(reader, "general.architecture")
  expected = {
      "num_decoder_layers": (f"{arch}.block_count", cfg.num_decoder_layers),
      "emb_dim": (f"{arch}.embedding_length", cfg.emb_dim),
      "mlp_dim": (f"{arch}.feed_forward_length", cfg.mlp_dim),
      "num_query_heads": (f"{arch}.attention.head_count", cfg.num_query_heads),
      "num_kv_heads": (f"{arch}.attention.head_count_kv", cfg.num_kv_heads),
      "vocab_size": (f"{arch}.vocab_size", cfg.vocab_size),
  }
  diffs = [
      f"{key}={ours} but the file has {gguf_key}={gguf_reader.field(reader, gguf_key)}"
      for key, (gguf_key, ours) in expected.items()
      if gguf_reader.field(reader, gguf_key) not in (None, ours)
  ]
  if diffs:
    raise ConfigError(f"{path}: does not match model_name={cfg.model_name}: " + "; ".join(diffs))


def parameters_path(cfg) -> str:
  """The weights of the run; empty for a seeded random init."""
  if cfg.random_weights:
    if cfg.load_parameters_path:
      raise ConfigError(f"random_weights=true and load_parameters_path={cfg.load_parameters_path}: "
                        "expected one of them (random weights load nothing)")
    return ""
  if cfg.load_parameters_path:
    return cfg.load_parameters_path
  if cfg.model_name in assets.DEFAULT_WEIGHTS:
    return assets.DEFAULT_WEIGHTS[cfg.model_name]()
  if cfg.model_name in assets.RANDOM_INIT_MODELS:
    return ""
  raise ConfigError(f"load_parameters_path: required for model_name={cfg.model_name} (no embedded default weights)")


def read_arrays(path: str, cfg) -> dict[str, np.ndarray]:
  """Our dotted parameter names -> arrays (as stored) from a GGUF file, HF directory or Orbax checkpoint."""
  mcfg = ModelConfig.from_config(cfg)
  if path.endswith(".gguf"):
    _check_gguf_architecture(path, cfg)
    return hf_layout.hf_to_maxtext(gguf_reader.read_hf_state_dict(path), mcfg)
  if hf_config.is_hf_checkpoint(path):
    return hf_layout.hf_to_maxtext(hf_checkpoint.read_state_dict(path), mcfg)
  if orbax_checkpoint.is_orbax_checkpoint(path):
    return orbax_checkpoint.restore_arrays(path)
  if not os.path.exists(path):
    raise errors.MissingInputError(f"load_parameters_path={path}: no such file or directory")
  raise ConfigError(
      f"load_parameters_path={path}: expected a .gguf file, an HF checkpoint directory (config.json + "
      "*.safetensors) or an Orbax checkpoint (<step>/model_params)"
  )


def load_model(cfg, mesh: Mesh) -> Decoder:
  mcfg = ModelConfig.from_config(cfg)
  path = parameters_path(cfg)
  if not path:
    log.info("Initialising %s randomly (seed %d)", cfg.model_name, cfg.init_weights_seed)
    return builder.init_random(mcfg, mesh, cfg.init_weights_seed)
  log.info("Loading weights from %s", path)
  return builder.from_arrays(mcfg, mesh, read_arrays(path, cfg), path)
