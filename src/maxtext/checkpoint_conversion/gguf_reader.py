"""Reads llama.cpp GGUF files of the llama, qwen3 and gemma3 architectures into Hugging Face tensor
names and layouts (dequantised float32, as the HF checkpoint of the same model would hold them).

The file is parsed here rather than with gguf.GGUFReader, which builds numpy views for every item of
the metadata arrays (a 262144-token vocabulary takes it 10 s or more); tensors are still dequantised
by the gguf package. What llama.cpp's converter changed is undone: llama's q/k rows are interleaved
for its RoPE (gemma3's and qwen3's are not), and gemma3's RMSNorm weights are stored as 1 + w (HF's
Gemma3RMSNorm multiplies by 1 + w and keeps w).
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Any

import gguf
import numpy as np

from maxtext.utils import errors

SUPPORTED_ARCHITECTURES = ("llama", "qwen3", "gemma3")

_GLOBAL_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {  # llama and qwen3
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
# Gemma3 has four norms per block: llama.cpp's ffn_norm is HF's pre_feedforward_layernorm there, and
# its post_attention_norm is HF's post_attention_layernorm (gguf's tensor_mapping.py).
_GEMMA3_BLOCK_NAMES = {
  **_BLOCK_NAMES,
  "post_attention_norm": "post_attention_layernorm",
  "ffn_norm": "pre_feedforward_layernorm",
  "post_ffw_norm": "post_feedforward_layernorm",
}
_BLOCK_NAMES_BY_ARCH = {"llama": _BLOCK_NAMES, "qwen3": _BLOCK_NAMES, "gemma3": _GEMMA3_BLOCK_NAMES}
# llama.cpp's convert_hf_to_gguf.py adds this to every tensor whose name ends in "norm.weight".
NORM_SHIFT = {"gemma3": 1.0}

# Model-config keys and the GGUF metadata key (after "<arch>.") holding each, for checking a file
# against the config that is to load it.
ARCHITECTURE_KEYS = {
  "num_decoder_layers": "block_count",
  "emb_dim": "embedding_length",
  "mlp_dim": "feed_forward_length",
  "num_query_heads": "attention.head_count",
  "num_kv_heads": "attention.head_count_kv",
  "head_dim": "attention.key_length",
  "vocab_size": "vocab_size",
  "sliding_window_size": "attention.sliding_window",  # MaxText's name of the key
  "rope_max_timescale": "rope.freq_base",
  "normalization_layer_epsilon": "attention.layer_norm_rms_epsilon",
}

_GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
# GGUF metadata value types: struct format of the scalar ones; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_FLOAT_TYPES = {
  gguf.GGMLQuantizationType.F32: np.float32,
  gguf.GGMLQuantizationType.F16: np.float16,
  gguf.GGMLQuantizationType.F64: np.float64,
}


@dataclasses.dataclass(frozen=True)
class Tensor:
  name: str
  tensor_type: gguf.GGMLQuantizationType
  shape: tuple[int, ...]  # numpy order (HF's [out, in]); GGUF lists the dimensions innermost first
  data: np.ndarray  # float types as their dtype in `shape`; quantised ones as uint8 rows of blocks


@dataclasses.dataclass(frozen=True)
class GGUFFile:
  path: str
  fields: dict[str, Any]  # metadata: Python scalars, strings, and lists of them
  tensors: list[Tensor]


class _Truncated(Exception):
  pass


class _Cursor:
  def __init__(self, buf: memoryview):
    self.buf, self.pos = buf, 0

  def unpack(self, fmt: str):
    size = struct.calcsize("<" + fmt)
    if self.pos + size > len(self.buf):
      raise _Truncated
    out = struct.unpack_from("<" + fmt, self.buf, self.pos)
    self.pos += size
    return out[0] if len(out) == 1 else out

  def string(self) -> str:
    n = self.unpack("Q")
    if self.pos + n > len(self.buf):
      raise _Truncated
    s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
    self.pos += n
    return s

  def value(self, vtype: int):
    if vtype in _SCALARS:
      return self.unpack(_SCALARS[vtype])
    if vtype == _STRING:
      return self.string()
    if vtype != _ARRAY:
      raise ValueError(f"unknown metadata value type {vtype}")
    itype, count = self.unpack("I"), self.unpack("Q")
    if itype in _SCALARS and itype != 7:
      dtype = np.dtype("<" + _SCALARS[itype])
      if self.pos + count * dtype.itemsize > len(self.buf):
        raise _Truncated
      arr = np.frombuffer(self.buf, dtype, count, self.pos)
      self.pos += count * dtype.itemsize
      return arr.tolist()
    return [self.value(itype) for _ in range(count)]


def open_gguf(path: str) -> GGUFFile:
  """The file's metadata and (memory-mapped, undecoded) tensors; one-line errors for a missing,
  truncated or malformed file."""
  if not os.path.isfile(path):
    raise errors.MissingInputError(f"{path}: GGUF file not found")
  try:
    mm = np.memmap(path, mode="r") if os.path.getsize(path) else np.zeros(0, np.uint8)
    cur = _Cursor(mm.data)
    if bytes(cur.buf[:4]) != _GGUF_MAGIC:
      raise ValueError("no GGUF magic at its start")
    cur.pos = 4
    version = cur.unpack("I")
    if version not in (2, 3):
      raise ValueError(f"GGUF version {version} (expected 2 or 3, little-endian)")
    n_tensors, n_fields = cur.unpack("Q"), cur.unpack("Q")
    fields = {}
    for _ in range(n_fields):
      key = cur.string()
      fields[key] = cur.value(cur.unpack("I"))
    infos = []
    for _ in range(n_tensors):
      name = cur.string()
      dims = [cur.unpack("Q") for _ in range(cur.unpack("I"))]
      infos.append((name, dims, gguf.GGMLQuantizationType(cur.unpack("I")), cur.unpack("Q")))
    align = int(fields.get("general.alignment", _DEFAULT_ALIGNMENT))
    start = -(-cur.pos // align) * align
    tensors = []
    for name, dims, qtype, offset in infos:
      shape = tuple(int(d) for d in reversed(dims))
      block, type_size = gguf.GGML_QUANT_SIZES[qtype]
      n_bytes = int(np.prod(shape)) // block * type_size
      begin = start + offset
      if begin + n_bytes > len(mm):
        raise _Truncated
      raw = mm[begin : begin + n_bytes]
      if qtype in _FLOAT_TYPES:
        data = raw.view(_FLOAT_TYPES[qtype]).reshape(shape)
      else:
        data = raw.reshape(gguf.quant_shape_to_byte_shape(shape, qtype))
      tensors.append(Tensor(name, qtype, shape, data))
  except _Truncated:
    raise errors.InputError(f"{path}: truncated GGUF file (it ends before the data its header lists)") from None
  except (ValueError, KeyError, UnicodeDecodeError, OverflowError) as e:
    raise errors.InputError(f"{path}: not a readable GGUF file ({e})") from e
  return GGUFFile(path, fields, tensors)


def field(reader: GGUFFile, key: str, default=None):
  return reader.fields.get(key, default)


def architecture(reader: GGUFFile) -> str:
  """general.architecture, refused with a one-line error naming the supported ones."""
  arch = field(reader, "general.architecture")
  if arch not in SUPPORTED_ARCHITECTURES:
    raise errors.InputError(
      f"{reader.path}: GGUF architecture {arch!r} is not supported "
      f"(expected one of {', '.join(SUPPORTED_ARCHITECTURES)})"
    )
  return arch


def hyperparameters(reader: GGUFFile) -> dict[str, Any]:
  """The model-config keys of ARCHITECTURE_KEYS that the file states, with its values."""
  arch = architecture(reader)
  out = {}
  for key, gguf_key in ARCHITECTURE_KEYS.items():
    value = field(reader, f"{arch}.{gguf_key}")
    if value is not None:
      out[key] = value
  embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
  if "vocab_size" not in out and embed is not None:
    out["vocab_size"] = embed.shape[0]
  return out


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's interleaving of q/k rows so the weight suits rotate-half RoPE.

  llama.cpp stores each head's rows as pairs (r0, r_{D/2}, r1, r_{D/2+1}, ...); HF keeps the two
  halves contiguous. w: [num_heads * head_dim, in].
  """
  head_dim = w.shape[0] // num_heads
  return w.reshape(num_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize(t: Tensor) -> np.ndarray:
  """The tensor as float32 in its numpy shape."""
  return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(t.shape)


def read_hf_state_dict(path: str) -> dict[str, np.ndarray]:
  """Dequantised float32 tensors of a llama, qwen3 or gemma3 GGUF, named and laid out as in HF."""
  reader = open_gguf(path)
  arch = architecture(reader)
  blocks = _BLOCK_NAMES_BY_ARCH[arch]
  shift = NORM_SHIFT.get(arch, 0.0)
  n_head = field(reader, f"{arch}.attention.head_count")
  n_kv = field(reader, f"{arch}.attention.head_count_kv", n_head)
  out = {}
  for t in reader.tensors:
    arr = dequantize(t)
    if shift and t.name.endswith("norm.weight"):
      arr = arr - np.float32(shift)
    if t.name in _GLOBAL_NAMES:
      out[_GLOBAL_NAMES[t.name]] = arr
      continue
    parts = t.name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[3] != "weight" or parts[2] not in blocks:
      raise errors.InputError(f"{path}: unexpected tensor {t.name} for architecture {arch}")
    _, layer, kind, _ = parts
    if arch == "llama" and kind in ("attn_q", "attn_k"):
      arr = unpermute_rope_rows(arr, n_head if kind == "attn_q" else n_kv)
    out[f"model.layers.{layer}.{blocks[kind]}.weight"] = arr
  return out
