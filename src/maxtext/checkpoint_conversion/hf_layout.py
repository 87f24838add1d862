"""Maps Hugging Face Llama/Qwen3 parameter names and layouts to this decoder's parameters.

HF linear weights are [out_features, in_features]; ours are einsum kernels laid out
[in, heads, head_dim] for q/k/v, [heads, head_dim, out] for o, and [in, out] for the MLP.
"""

from __future__ import annotations

import numpy as np

from maxtext.models.decoder import ModelConfig


def hf_to_maxtext(hf: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
  """HF state dict (model.layers.N.self_attn.q_proj.weight, ...) -> our dotted parameter names."""
  e, hq, hkv, d = cfg.emb_dim, cfg.num_query_heads, cfg.num_kv_heads, cfg.head_dim
  out = {"embed": hf["model.embed_tokens.weight"], "final_norm.scale": hf["model.norm.weight"]}
  if not cfg.tie_embeddings:
    out["lm_head"] = hf["lm_head.weight"].T
  for i in range(cfg.num_layers):
    src, dst = f"model.layers.{i}.", f"layers.{i}."
    out[dst + "attn_norm.scale"] = hf[src + "input_layernorm.weight"]
    out[dst + "mlp_norm.scale"] = hf[src + "post_attention_layernorm.weight"]
    out[dst + "attn.q_proj"] = hf[src + "self_attn.q_proj.weight"].T.reshape(e, hq, d)
    out[dst + "attn.k_proj"] = hf[src + "self_attn.k_proj.weight"].T.reshape(e, hkv, d)
    out[dst + "attn.v_proj"] = hf[src + "self_attn.v_proj.weight"].T.reshape(e, hkv, d)
    out[dst + "attn.o_proj"] = hf[src + "self_attn.o_proj.weight"].T.reshape(hq, d, e)
    if cfg.use_qk_norm:
      out[dst + "attn.q_norm.scale"] = hf[src + "self_attn.q_norm.weight"]
      out[dst + "attn.k_norm.scale"] = hf[src + "self_attn.k_norm.weight"]
    for proj in ("gate_proj", "up_proj", "down_proj"):
      out[dst + "mlp." + proj] = hf[src + "mlp." + proj + ".weight"].T
  return out
