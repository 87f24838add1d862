"""Reads Llama-architecture GGUF files (llama.cpp) into Hugging Face tensor names and layouts."""

from __future__ import annotations

import os

import gguf
import numpy as np

from maxtext.utils import errors

_GLOBAL_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
  "attn_norm": "input_layernorm",
  "ffn_norm": "post_attention_layernorm",
  "attn_q": "self_attn.q_proj",
  "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj",
  "attn_output": "self_attn.o_proj",
  "attn_q_norm": "self_attn.q_norm",
  "attn_k_norm": "self_attn.k_norm",
  "ffn_gate": "mlp.gate_proj",
  "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj",
}


def open_gguf(path: str) -> gguf.GGUFReader:
  if not os.path.isfile(path):
    raise errors.MissingInputError(f"{path}: GGUF file not found")
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # the gguf package raises several types for corrupt files
    raise errors.InputError(f"{path}: not a readable GGUF file ({e})") from e


def field(reader: gguf.GGUFReader, key: str, default=None):
  f = reader.fields.get(key)
  return default if f is None else f.contents()


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's interleaving of q/k rows so the weight suits rotate-half RoPE.

  llama.cpp stores each head's rows as pairs (r0, r_{D/2}, r1, r_{D/2+1}, ...); HF keeps the two
  halves contiguous. w: [num_heads * head_dim, in].
  """
  head_dim = w.shape[0] // num_heads
  return w.reshape(num_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_hf_state_dict(path: str) -> dict[str, np.ndarray]:
  """Dequantised float32 tensors of a llama-architecture GGUF, named and laid out as in HF."""
  reader = open_gguf(path)
  arch = field(reader, "general.architecture")
  if arch not in ("llama", "qwen3"):
    raise errors.InputError(f"{path}: GGUF architecture {arch!r} is not supported (expected llama or qwen3)")
  n_head = field(reader, f"{arch}.attention.head_count")
  n_kv = field(reader, f"{arch}.attention.head_count_kv", n_head)
  out = {}
  for t in reader.tensors:
    arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    if t.name in _GLOBAL_NAMES:
      out[_GLOBAL_NAMES[t.name]] = arr
      continue
    _, layer, kind, _ = t.name.split(".")
    if kind not in _BLOCK_NAMES:
      raise errors.InputError(f"{path}: unexpected tensor {t.name}")
    if arch == "llama" and kind in ("attn_q", "attn_k"):
      arr = unpermute_rope_rows(arr, n_head if kind == "attn_q" else n_kv)
    out[f"model.layers.{layer}.{_BLOCK_NAMES[kind]}.weight"] = arr
  return out
