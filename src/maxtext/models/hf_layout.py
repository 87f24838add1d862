"""Maps Hugging Face Llama/Qwen3/Gemma 3 (Gemma3ForCausalLM) parameter names and layouts to this
decoder's parameters and back.

HF linear weights are [out_features, in_features]; ours are einsum kernels laid out
[in, heads, head_dim] for q/k/v, [heads, head_dim, out] for o, and [in, out] for the MLP.
One table drives both directions, so the two stay exact inverses. Norm weights are copied as they
are: Gemma 3's as HF stores them (w, the norm scaling by 1 + w), which is what ours hold too.
"""

from __future__ import annotations

import numpy as np

from maxtext.models.decoder import ModelConfig
from maxtext.utils import errors


def _layout(kind: str, cfg: ModelConfig) -> tuple[int, ...] | None:
  """Our shape of a transposed HF weight of this kind; None for vectors copied as they are."""
  e, hq, hkv, d = cfg.emb_dim, cfg.num_query_heads, cfg.num_kv_heads, cfg.head_dim
  return {"vector": None, "linear": (), "q": (e, hq, d), "kv": (e, hkv, d), "o": (hq, d, e)}[kind]


def _table(cfg: ModelConfig) -> list[tuple[str, str, str]]:
  """(HF name, our name, kind) for every parameter of the architecture."""
  rows = [("model.embed_tokens.weight", "embed", "vector"), ("model.norm.weight", "final_norm.scale", "vector")]
  if not cfg.tie_embeddings:
    rows.append(("lm_head.weight", "lm_head", "linear"))
  for i in range(cfg.num_layers):
    hf, ours = f"model.layers.{i}.", f"layers.{i}."
    if cfg.gemma:  # post_attention_layernorm normalises the attention block's output
      rows += [
        (hf + "input_layernorm.weight", ours + "attn_norm.scale", "vector"),
        (hf + "post_attention_layernorm.weight", ours + "post_attn_norm.scale", "vector"),
        (hf + "pre_feedforward_layernorm.weight", ours + "mlp_norm.scale", "vector"),
        (hf + "post_feedforward_layernorm.weight", ours + "post_mlp_norm.scale", "vector"),
      ]
    else:
      rows += [
        (hf + "input_layernorm.weight", ours + "attn_norm.scale", "vector"),
        (hf + "post_attention_layernorm.weight", ours + "mlp_norm.scale", "vector"),
      ]
    rows += [
      (hf + "self_attn.q_proj.weight", ours + "attn.q_proj", "q"),
      (hf + "self_attn.k_proj.weight", ours + "attn.k_proj", "kv"),
      (hf + "self_attn.v_proj.weight", ours + "attn.v_proj", "kv"),
      (hf + "self_attn.o_proj.weight", ours + "attn.o_proj", "o"),
    ]
    if cfg.use_qk_norm:
      rows += [
        (hf + "self_attn.q_norm.weight", ours + "attn.q_norm.scale", "vector"),
        (hf + "self_attn.k_norm.weight", ours + "attn.k_norm.scale", "vector"),
      ]
    rows += [(hf + f"mlp.{p}.weight", ours + f"mlp.{p}", "linear") for p in ("gate_proj", "up_proj", "down_proj")]
  return rows


def hf_to_maxtext(hf: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
  """HF state dict (model.layers.N.self_attn.q_proj.weight, ...) -> our dotted parameter names."""
  out = {}
  for hf_name, name, kind in _table(cfg):
    if hf_name not in hf:
      raise errors.InputError(f"checkpoint lacks {hf_name} (a {cfg.family} model with this config needs it)")
    shape = _layout(kind, cfg)
    out[name] = hf[hf_name] if shape is None else hf[hf_name].T.reshape(shape or hf[hf_name].T.shape)
  return out


def maxtext_to_hf(params: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Our dotted parameter names -> HF state dict; the exact inverse of `hf_to_maxtext`."""
  out = {}
  for hf_name, name, kind in _table(cfg):
    value = params[name]
    if _layout(kind, cfg) is not None:
      value = value.reshape(-1, value.shape[-1]).T if kind == "o" else value.reshape(value.shape[0], -1).T
    out[hf_name] = np.ascontiguousarray(value)
  return out
