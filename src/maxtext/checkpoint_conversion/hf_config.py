"""Translates between a Hugging Face config.json (Llama / Qwen3 / Gemma 3's text decoder) and our
model-YAML keys."""

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
  "rope_local_max_timescale",
  "sliding_window_size",
  "sliding_window_pattern",
  "query_pre_attn_scalar",
  "normalization_layer_epsilon",
  "use_qk_norm",
  "logits_via_embedding",
  "max_position_embeddings",
)
_FAMILIES = {"llama": "llama", "qwen3": "qwen3", "gemma3_text": "gemma3"}
_LLAMA3_SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _config_json(path: str) -> epath.Path:
  """<path>/config.json, local or on a bucket."""
  storage.use_emulator()
  return epath.Path(path) / "config.json"


def is_hf_checkpoint(path: str) -> bool:
  return bool(path) and not str(path).endswith(".gguf") and _config_json(path).is_file()


def _rope(
  hf: dict[str, Any], where: str, params: dict[str, Any] | None = None, theta: float = 10000.0
) -> tuple[float, dict[str, float] | None]:
  """(theta, llama3 or linear scaling or None) from transformers 5's rope_parameters or 4's
  rope_theta/rope_scaling (`params`: the parameters of one kind of layer, Gemma 3's)."""
  if params is None:
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  params = dict(params)
  theta = float(params.pop("rope_theta", hf.get("rope_theta", theta)))
  kind = params.get("rope_type", params.get("type", "default"))
  if kind == "default":
    return theta, None
  if kind == "linear":
    return theta, {"factor": float(params["factor"])}
  if kind != "llama3":
    raise errors.InputError(f"{where}: rope_type {kind!r} is not supported (expected default, linear or llama3)")
  return theta, {
    k: float(params[k]) if k != "original_max_position_embeddings" else int(params[k]) for k in _LLAMA3_SCALING
  }


def architectures(path: str) -> list[str]:
  """The model classes `<path>/config.json` names (its `architectures`)."""
  where = _config_json(path)
  try:
    return list(json.loads(where.read_text()).get("architectures") or [])
  except (OSError, json.JSONDecodeError, AttributeError) as e:
    raise errors.InputError(f"{where}: cannot read the model config ({e})") from e


def architecture(path: str) -> dict[str, Any]:
  """Our architecture keys read from `<path>/config.json`."""
  where = _config_json(path)
  try:
    hf = json.loads(where.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise errors.InputError(f"{where}: cannot read the model config ({e})") from e
  family = _FAMILIES.get(hf.get("model_type"))
  if "Gemma3ForCausalLM" in (hf.get("architectures") or ()):
    family = "gemma3"
  if family is None:
    raise errors.InputError(
      f"{where}: model_type {hf.get('model_type')!r} is not supported (expected llama, qwen3 or gemma3_text; "
      "a multimodal Gemma 3 checkpoint's text decoder is not read)"
    )
  if family == "gemma3":
    return _gemma3_architecture(hf, where)
  unsupported = [k for k in ("attention_bias", "mlp_bias", "use_sliding_window") if hf.get(k)]
  if hf.get("hidden_act", "silu") != "silu":
    unsupported.append(f"hidden_act={hf['hidden_act']}")
  if unsupported:
    raise errors.InputError(f"{where}: unsupported features {unsupported}")
  theta, scaling = _rope(hf, where)
  return {**_shape(hf, family, theta, scaling), **dict.fromkeys(_GEMMA3_KEYS, 0)}


# The keys only Gemma 3 sets (0 for the other families).
_GEMMA3_KEYS = ("rope_local_max_timescale", "sliding_window_size", "sliding_window_pattern", "query_pre_attn_scalar")


def _shape(hf: dict[str, Any], family: str, theta: float, scaling: dict[str, float] | None) -> dict[str, Any]:
  """The architecture keys every family reads alike."""
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


def _pattern(layer_types: list[str], where: str) -> int:
  """sliding_window_pattern from Gemma 3's layer_types: the p whose layers (i + 1) % p == 0 are the
  full_attention ones."""
  unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
  if unknown:
    raise errors.InputError(
      f"{where}: layer_types {unknown} are not supported (expected full_attention or sliding_attention)"
    )
  is_global = [kind == "full_attention" for kind in layer_types]
  n = len(is_global)
  for pattern in range(1, n + 2):
    if [(i + 1) % pattern == 0 for i in range(n)] == is_global:
      return pattern
  raise errors.InputError(
    f"{where}: layer_types {layer_types} do not repeat one pattern of sliding-window layers followed by a "
    "full_attention one (sliding_window_pattern)"
  )


def _gemma3_architecture(hf: dict[str, Any], where) -> dict[str, Any]:
  """Gemma3TextConfig's keys (transformers 5's rope_parameters per kind of layer, or 4's rope_theta,
  rope_local_base_freq and rope_scaling of the global layers), with Gemma 3's defaults."""
  unsupported = [k for k in ("attention_bias", "use_bidirectional_attention") if hf.get(k)]
  unsupported += [
    f"{k}={hf[k]}" for k in ("attn_logit_softcapping", "final_logit_softcapping") if hf.get(k) is not None
  ]
  for key in ("hidden_activation", "hidden_act"):
    if hf.get(key, "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
      unsupported.append(f"{key}={hf[key]}")
  if unsupported:
    raise errors.InputError(f"{where}: unsupported features {unsupported}")
  hf = {"vocab_size": 262208, "head_dim": 256, "max_position_embeddings": 131072, "tie_word_embeddings": True, **hf}
  rope = hf.get("rope_parameters") or {}
  if "full_attention" in rope or "sliding_attention" in rope:
    theta, scaling = _rope(hf, where, rope.get("full_attention") or {}, 1e6)
    local, _ = _rope(hf, where, rope.get("sliding_attention") or {}, 1e4)
  else:
    theta, scaling = _rope(hf, where, {"rope_theta": hf.get("rope_theta", 1e6), **(hf.get("rope_scaling") or {})})
    local = float(hf.get("rope_local_base_freq", 1e4))
  n = hf["num_hidden_layers"]
  layer_types = hf.get("layer_types")
  if layer_types and len(layer_types) != n:
    raise errors.InputError(f"{where}: layer_types has {len(layer_types)} entries for {n} layers")
  pattern = _pattern(layer_types, where) if layer_types else int(hf.get("sliding_window_pattern", 6))
  return {
    **_shape(hf, "gemma3", theta, scaling),
    "use_qk_norm": True,
    "rope_local_max_timescale": local,
    "sliding_window_size": int(hf.get("sliding_window") or 4096),
    "sliding_window_pattern": pattern,
    "query_pre_attn_scalar": int(hf.get("query_pre_attn_scalar", 256)),
  }


def to_hf_config(model: ModelSection, tokenizer=None, sequence_classifier: bool = False):
  """A transformers config object for the run config's architecture (weights dtype included): of a
  causal LM, or with `sequence_classifier` of a *ForSequenceClassification with one output (a reward
  model)."""
  import transformers  # heavy; only the exporter needs it

  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": model.rope_max_timescale}
  if model.rope_scaling:
    kind = "linear" if set(model.rope_scaling) == {"factor"} else "llama3"
    rope = {"rope_type": kind, "rope_theta": model.rope_max_timescale, **model.rope_scaling}
  kwargs: dict[str, Any] = dict(
    vocab_size=model.vocab_size,
    hidden_size=model.emb_dim,
    num_hidden_layers=model.num_decoder_layers,
    num_attention_heads=model.num_query_heads,
    num_key_value_heads=model.num_kv_heads,
    head_dim=model.head_dim,
    intermediate_size=model.mlp_dim,
    rms_norm_eps=model.normalization_layer_epsilon,
    tie_word_embeddings=model.logits_via_embedding,
    max_position_embeddings=model.max_position_embeddings,
    rope_parameters=rope,
    dtype=model.weight_dtype,
  )
  if sequence_classifier:
    kwargs["num_labels"] = 1
  if tokenizer is not None:
    kwargs.update(
      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
  if model.decoder_family == "gemma3":
    n, pattern = model.num_decoder_layers, model.sliding_window_pattern
    kwargs.update(
      rope_parameters={
        "full_attention": rope,
        "sliding_attention": {"rope_type": "default", "rope_theta": model.rope_local_max_timescale},
      },
      layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)],
      sliding_window=model.sliding_window_size,
      query_pre_attn_scalar=model.query_pre_attn_scalar,
      hidden_activation="gelu_pytorch_tanh",
    )
    kind = "Gemma3TextForSequenceClassification" if sequence_classifier else "Gemma3ForCausalLM"
    return transformers.Gemma3TextConfig(architectures=[kind], **kwargs)
  cls = transformers.Qwen3Config if model.decoder_family == "qwen3" else transformers.LlamaConfig
  head = "ForSequenceClassification" if sequence_classifier else "ForCausalLM"
  return cls(architectures=[cls.__name__.replace("Config", head)], **kwargs)
