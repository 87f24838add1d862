"""Translates between a Hugging Face config.json (Llama / Qwen3) and our model-YAML keys."""

from __future__ import annotations

import json
from typing import Any

from etils import epath

from maxtext.configs.sections import ModelSection
from maxtext.utils import errors, storage

# Model-YAML keys that define the architecture, in the order they are reported.
ARCHITECTURE_KEYS = (
  "decoder_family",
  "vocab_size",
  "emb_dim",
  "num_decoder_layers",
  "num_query_heads",
  "num_kv_heads",
  "head_dim",
  "mlp_dim",
  "rope_max_timescale",
  "rope_scaling",
  "normalization_layer_epsilon",
  "use_qk_norm",
  "logits_via_embedding",
  "max_position_embeddings",
)
_FAMILIES = {"llama": "llama", "qwen3": "qwen3"}
_LLAMA3_SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _config_json(path: str) -> epath.Path:
  """<path>/config.json, local or on a bucket."""
  storage.use_emulator()
  return epath.Path(path) / "config.json"


def is_hf_checkpoint(path: str) -> bool:
  return bool(path) and not str(path).endswith(".gguf") and _config_json(path).is_file()


def _rope(hf: dict[str, Any], where: str) -> tuple[float, dict[str, float] | None]:
  """(theta, llama3 scaling or None) from transformers 5's rope_parameters or 4's rope_theta/rope_scaling."""
  params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
  kind = params.get("rope_type", params.get("type", "default"))
  if kind == "default":
    return theta, None
  if kind != "llama3":
    raise errors.InputError(f"{where}: rope_type {kind!r} is not supported (expected default or llama3)")
  return theta, {
    k: float(params[k]) if k != "original_max_position_embeddings" else int(params[k]) for k in _LLAMA3_SCALING
  }


def architecture(path: str) -> dict[str, Any]:
  """Our architecture keys read from `<path>/config.json`."""
  where = _config_json(path)
  try:
    hf = json.loads(where.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise errors.InputError(f"{where}: cannot read the model config ({e})") from e
  family = _FAMILIES.get(hf.get("model_type"))
  if family is None:
    raise errors.InputError(f"{where}: model_type {hf.get('model_type')!r} is not supported (expected llama or qwen3)")
  unsupported = [k for k in ("attention_bias", "mlp_bias", "use_sliding_window") if hf.get(k)]
  if hf.get("hidden_act", "silu") != "silu":
    unsupported.append(f"hidden_act={hf['hidden_act']}")
  if unsupported:
    raise errors.InputError(f"{where}: unsupported features {unsupported}")
  theta, scaling = _rope(hf, where)
  heads = hf["num_attention_heads"]
  return {
    "decoder_family": family,
    "vocab_size": hf["vocab_size"],
    "emb_dim": hf["hidden_size"],
    "num_decoder_layers": hf["num_hidden_layers"],
    "num_query_heads": heads,
    "num_kv_heads": hf.get("num_key_value_heads") or heads,
    "head_dim": hf.get("head_dim") or hf["hidden_size"] // heads,
    "mlp_dim": hf["intermediate_size"],
    "rope_max_timescale": theta,
    "rope_scaling": scaling,
    "normalization_layer_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
    "use_qk_norm": family == "qwen3",
    "logits_via_embedding": bool(hf.get("tie_word_embeddings", family == "qwen3")),
    "max_position_embeddings": hf.get("max_position_embeddings", 2048),
  }


def to_hf_config(cfg: ModelSection, tokenizer=None):
  """A transformers config object for the run config's architecture (weights dtype included)."""
  import transformers  # heavy; only the exporter needs it

  rope = {"rope_type": "default", "rope_theta": cfg.rope_max_timescale}
  if cfg.rope_scaling:
    rope = {"rope_type": "llama3", "rope_theta": cfg.rope_max_timescale, **cfg.rope_scaling}
  kwargs: dict[str, Any] = dict(
    vocab_size=cfg.vocab_size,
    hidden_size=cfg.emb_dim,
    num_hidden_layers=cfg.num_decoder_layers,
    num_attention_heads=cfg.num_query_heads,
    num_key_value_heads=cfg.num_kv_heads,
    head_dim=cfg.head_dim,
    intermediate_size=cfg.mlp_dim,
    rms_norm_eps=cfg.normalization_layer_epsilon,
    tie_word_embeddings=cfg.logits_via_embedding,
    max_position_embeddings=cfg.max_position_embeddings,
    rope_parameters=rope,
    dtype=cfg.weight_dtype,
  )
  if tokenizer is not None:
    kwargs.update(
      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
  cls = transformers.Qwen3Config if cfg.decoder_family == "qwen3" else transformers.LlamaConfig
  return cls(architectures=[cls.__name__.replace("Config", "ForCausalLM")], **kwargs)
