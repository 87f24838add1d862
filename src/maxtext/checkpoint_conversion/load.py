"""Builds the decoder for a run: weights from load_parameters_path, the model's default, or random."""

from __future__ import annotations

import logging

from jax.sharding import Mesh

from maxtext import assets
from maxtext.checkpoint_conversion import gguf_reader, hf_layout
from maxtext.configs.pyconfig import ConfigError
from maxtext.models import builder
from maxtext.models.decoder import Decoder, ModelConfig

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
  """The weights file of the run; empty for a seeded random init."""
  if cfg.load_parameters_path:
    return cfg.load_parameters_path
  if cfg.model_name in assets.DEFAULT_WEIGHTS:
    return assets.DEFAULT_WEIGHTS[cfg.model_name]()
  if cfg.model_name in assets.RANDOM_INIT_MODELS:
    return ""
  raise ConfigError(f"load_parameters_path: required for model_name={cfg.model_name} (no embedded default weights)")


def load_model(cfg, mesh: Mesh) -> Decoder:
  mcfg = ModelConfig.from_config(cfg)
  path = parameters_path(cfg)
  if not path:
    log.info("Initialising %s randomly (seed %d)", cfg.model_name, cfg.init_weights_seed)
    return builder.init_random(mcfg, mesh, cfg.init_weights_seed)
  if not path.endswith(".gguf"):
    raise ConfigError(f"load_parameters_path={path}: expected a .gguf file")
  _check_gguf_architecture(path, cfg)
  log.info("Loading weights from %s", path)
  hf = gguf_reader.read_hf_state_dict(path)
  return builder.from_arrays(mcfg, mesh, hf_layout.hf_to_maxtext(hf, mcfg), path)
