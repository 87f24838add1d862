"""Which decoder weights a LoRA regex (lora_module_path) selects, under our names and the peers'.

Our weights that take adapters are named by dotted path, `layers.3.attn.q_proj`. A regex written for
another program names the same weights otherwise: Tunix's Gemma models `q_einsum`, `kv_einsum` (k and
v together) and `attn_vec_einsum` (o), transformers and PEFT `self_attn.q_proj`, MaxText
`self_attention.query` ... `mlp.wi_0` / `wi_1` / `wo`, with `/` as well as `.` between the parts. A
regex selects a weight when it fully matches any of its names (re.fullmatch, as Tunix and we match), so
Tunix's and MaxText's documented regexes adapt what they adapt there. Each alternative of the regex
(`a|b|c` at its top level) must select some weight: one that selects none is a regex written for a
model with other weights, refused rather than silently adapting less.
"""

from __future__ import annotations

import re

# Per weight (module.name in a layer): the peers' names of it.
PEER_NAMES: dict[str, tuple[str, ...]] = {
  "attn.q_proj": ("attn.q_einsum", "self_attn.q_proj", "self_attention.query"),
  "attn.k_proj": ("attn.kv_einsum", "self_attn.k_proj", "self_attention.key"),
  "attn.v_proj": ("attn.kv_einsum", "self_attn.v_proj", "self_attention.value"),
  "attn.o_proj": ("attn.attn_vec_einsum", "self_attn.o_proj", "self_attention.out"),
  "mlp.gate_proj": ("mlp.wi_0",),
  "mlp.up_proj": ("mlp.wi_1",),
  "mlp.down_proj": ("mlp.wo",),
}
WEIGHTS = tuple(PEER_NAMES)


def names(weight_name: str) -> list[str]:
  """A dotted weight name (layers.3.attn.q_proj) and its peers' names, each with `.` and with `/`."""
  layer, _, weight = weight_name.rpartition(".")
  layer, _, module = layer.rpartition(".")
  dotted = [weight_name, *(f"{layer}.{alias}" for alias in PEER_NAMES.get(f"{module}.{weight}", ()))]
  return [*dotted, *(n.replace(".", "/") for n in dotted)]


def selects(pattern: str, weight_name: str) -> bool:
  """Whether `pattern` fully matches one of the weight's names."""
  return any(re.fullmatch(pattern, n) for n in names(weight_name))


def alternatives(pattern: str) -> list[str]:
  """The regex's top-level alternatives (`a|b` outside groups and classes), or [pattern]."""
  parts, depth, in_class, start, i = [], 0, False, 0, 0
  while i < len(pattern):
    c = pattern[i]
    if c == "\\":
      i += 2
      continue
    if in_class:
      in_class = c != "]"
    elif c == "[":
      in_class = True
    elif c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
    elif c == "|" and depth == 0:
      parts.append(pattern[start:i])
      start = i + 1
    i += 1
  return [*parts, pattern[start:]]


def layer_weights(num_layers: int) -> list[str]:
  """The dotted names of every weight that takes an adapter, layer by layer."""
  return [f"layers.{i}.{w}" for i in range(num_layers) for w in WEIGHTS]


def unused_alternatives(pattern: str, num_layers: int) -> list[str]:
  """The top-level alternatives of `pattern` that select no weight of a num_layers decoder."""
  weights = layer_weights(num_layers)
  parts = alternatives(pattern)
  return [] if len(parts) == 1 else [p for p in parts if not any(selects(p, w) for w in weights)]


def describe(pattern: str, num_layers: int) -> str:
  """Which weights `pattern` adapts, by weight: 'attn.q_proj, mlp.up_proj in all 28 layers' (and
  'attn.k_proj in layers 0, 5' where it selects some layers only)."""
  by_layers: dict[tuple[int, ...], list[str]] = {}
  for weight in WEIGHTS:
    layers = tuple(i for i in range(num_layers) if selects(pattern, f"layers.{i}.{weight}"))
    if layers:
      by_layers.setdefault(layers, []).append(weight)
  parts = []
  for layers, weights in by_layers.items():
    where = f"all {num_layers} layers" if len(layers) == num_layers else f"layers {', '.join(map(str, layers))}"
    parts.append(f"{', '.join(weights)} in {where}")
  return "; ".join(parts) or "no weight"
