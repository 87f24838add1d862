"""MaxText-style decoder for the Llama, Qwen3 and Gemma 3 families, in flax.nnx.

Parameters carry logical axis names (`out_sharding`) and the config's logical->mesh rules
(`sharding_rules`), so `nnx.get_partition_spec` yields mesh PartitionSpecs anywhere, Tunix's
resharding included. The call signature and KV cache follow Tunix's sampler contract:
`model(input_tokens, positions, cache, attention_mask) -> (logits, new_cache)`, with the cache
`{'layer_i': {'k', 'v', 'end_index'}}` whose slot i holds the token at buffer index i; each row
writes from its own end_index, so rows of one batch may be at different positions (continuous
batching). Tunix's sampler only makes the cache (`init_cache`) and passes it back, so the cache of a
decoder with scan_layers is one stacked entry `{'layers': {'k', 'v', 'end_index'}}` whose keys and
values hold every layer's on an axis after the rows: every cache array keeps its rows on axis 0.

With scan_layers the decoder layers are one layer module whose parameters are stacked along a leading
axis (logical name 'layers'), run by one jax.lax.scan: the compiled programs hold one layer's code
instead of num_layers copies. Its parameters' dotted names have no layer number
(layers.attn.q_proj [layers, ...] instead of layers.3.attn.q_proj); `builder` converts between the two.

Gemma 3 (family gemma3) interleaves sliding-window layers with global ones. A sliding-window layer's
query at position q attends the keys at positions q - window + 1 .. q. Its mask is the layer's
attention mask restricted to each query's last `window` attended keys: the keys a query attends (the
causal and padding masks every caller makes) are its sequence's tokens at consecutive positions up to
its own, wherever they lie in the cache (a left-padded prompt, rows at different positions), so the
k-th last of them is at position q - k + 1. Which layers are global is a per-layer flag: a Python bool
for unrolled layers, one of the scan's inputs with scan_layers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.configs.sections import MatmulPrecision, ModelSection
from maxtext.models import attention as attention_lib
from maxtext.utils import lora_names

Cache = dict[str, dict[str, jax.Array]]
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of one decoder; built from the run config's model section by `from_config`."""

  family: str
  vocab_size: int
  emb_dim: int
  num_layers: int
  num_query_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float
  rope_scaling: tuple[tuple[str, float], ...] | None
  norm_eps: float
  use_qk_norm: bool
  tie_embeddings: bool
  dtype: Any
  weight_dtype: Any
  remat: bool
  logical_axis_rules: tuple[tuple[str, tuple[str, ...]], ...]
  lora_rank: int = 0  # 0: no adapters
  lora_alpha: float = 0.0
  lora_module_path: str = ""  # regex over dotted weight names (layers.3.attn.q_proj) that get adapters
  # The weight matmuls' input dtype (weights and activations rounded to it), accumulating in dtype;
  # None: dtype. Set by `DecodeCopy`.
  matmul_dtype: Any = None
  # Every matmul's precision (jax.lax.Precision's name: default, high, highest), passed to each dot.
  matmul_precision: MatmulPrecision = "default"
  # How attention is computed (attention_lib.select's choice for the run): cudnn_flash computes a
  # sequence's (more than one query position) with cuDNN's flash attention, a decode step's with
  # dot_product's einsums.
  attention: attention_lib.Selected = "dot_product"
  scan_layers: bool = False  # the layers as one scanned layer over stacked parameters
  # gemma3: the sliding-window layers' window (in positions), their (unscaled) RoPE theta, and the
  # layers that attend globally (True) instead; () and 0 for the other families (every layer global).
  sliding_window: int = 0
  rope_local_theta: float = 0.0
  global_layers: tuple[bool, ...] = ()
  # Attention scores are scaled by query_pre_attn_scalar ** -0.5; 0: by head_dim ** -0.5.
  query_pre_attn_scalar: int = 0

  @classmethod
  def from_config(cls, model: ModelSection) -> ModelConfig:
    scaling = model.rope_scaling
    return cls(
      family=model.decoder_family,
      vocab_size=model.vocab_size,
      emb_dim=model.emb_dim,
      num_layers=model.num_decoder_layers,
      num_query_heads=model.num_query_heads,
      num_kv_heads=model.num_kv_heads,
      head_dim=model.head_dim,
      mlp_dim=model.mlp_dim,
      rope_theta=model.rope_max_timescale,
      rope_scaling=tuple(sorted(scaling.items())) if scaling else None,
      norm_eps=model.normalization_layer_epsilon,
      use_qk_norm=model.use_qk_norm,
      tie_embeddings=model.logits_via_embedding,
      dtype=jnp.dtype(model.dtype),
      weight_dtype=jnp.dtype(model.weight_dtype),
      remat=model.remat_policy == "full",
      logical_axis_rules=tuple((name, tuple(axes)) for name, axes in model.logical_axis_rules),
      lora_rank=model.lora_rank,
      lora_alpha=float(model.lora_alpha),
      lora_module_path=model.lora_module_path,
      matmul_precision=model.matmul_precision,
      attention=attention_lib.select(model),
      scan_layers=model.scan_layers,
      sliding_window=model.sliding_window_size,
      rope_local_theta=model.rope_local_max_timescale,
      global_layers=global_layers(model.num_decoder_layers, model.sliding_window_pattern),
      query_pre_attn_scalar=model.query_pre_attn_scalar,
    )

  @property
  def gemma(self) -> bool:
    """Gemma 3's layer: norms scaled by 1 + w, norms after attention and MLP too, GeGLU, a scaled embedding."""
    return self.family == "gemma3"

  def is_global(self, layer: int) -> bool:
    """Whether a layer attends every earlier position (else through the sliding window)."""
    return not self.global_layers or self.global_layers[layer]

  @property
  def has_local_layers(self) -> bool:
    return not all(self.is_global(i) for i in range(self.num_layers))

  @property
  def attention_scale(self) -> float:
    """What attention scores (q . k) are multiplied by."""
    return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

  @property
  def precision(self) -> jax.lax.Precision:
    """The precision every matmul of the decoder, and of scoring its tokens, is given."""
    return jax.lax.Precision(self.matmul_precision)

  @property
  def lora_scale(self) -> float:
    """alpha / rank: what an adapter's A B is multiplied by (0 without adapters)."""
    return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

  def adapts(self, weight_name: str) -> bool:
    """Whether the weight (dotted name) gets a LoRA adapter: lora_module_path selects it by our name or
    a peer's (utils/lora_names.py)."""
    return self.lora_rank > 0 and lora_names.selects(self.lora_module_path, weight_name)


def global_layers(num_layers: int, pattern: int) -> tuple[bool, ...]:
  """Per layer, whether it attends globally: layer i does when (i + 1) % pattern == 0 (Gemma 3's
  sliding_window_pattern); () for pattern 0 (no sliding-window layers)."""
  return tuple((i + 1) % pattern == 0 for i in range(num_layers)) if pattern else ()


def sliding_window_mask(attention_mask: jax.Array, window: int) -> jax.Array:
  """attention_mask [B, T, S] (True attends) kept at each query's last `window` attended keys: those
  at positions q - window + 1 .. q, since the keys a query attends are its sequence's tokens at
  consecutive positions up to its own (in whichever cache slots they lie)."""
  after = jnp.cumsum(attention_mask[..., ::-1].astype(jnp.int32), axis=-1)[..., ::-1]  # attended keys at or after
  return attention_mask & (after <= window)


def _param(cfg: ModelConfig, rngs: nnx.Rngs, init, shape, axes) -> nnx.Param:
  """A parameter annotated with its logical axes. The builder lays the values out on the mesh;
  without eager sharding, state made from a parameter (the optimizer's zeros_like, which keep its
  layout) is not copied by one sharding constraint per array."""
  value = init(rngs.params(), shape, cfg.weight_dtype)
  return nnx.Param(value, out_sharding=axes, sharding_rules=cfg.logical_axis_rules, eager_sharding=False)


# Weights that may take a LoRA adapter, with the number of their leading (input) axes.
LORA_INPUT_AXES = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate_proj": 1, "up_proj": 1, "down_proj": 1}


class _Projections(nnx.Module):
  """A module of projection weights, each optionally with a LoRA adapter: W + (alpha / rank) A B with
  A [inputs..., rank] and B [rank, outputs...] as nnx.LoRAParam (Tunix trains only those when any
  exist), stored beside the weight as <name>_lora_a / <name>_lora_b. B starts at zero, so an adapted
  model starts as its base. `paths`: the dotted module paths (layers.3.attn) whose weights the module
  holds: one, or with scan_layers every layer's; their weights get adapters all or none."""

  def _weight(self, cfg: ModelConfig, rngs: nnx.Rngs, paths: tuple[str, ...], name: str, shape, axes) -> None:
    setattr(self, name, _param(cfg, rngs, nnx.initializers.lecun_normal(), shape, axes))
    adapted = [path for path in paths if cfg.adapts(f"{path}.{name}")]
    if not adapted:
      return
    if len(adapted) < len(paths):
      raise ValueError(
        f"lora_module_path={cfg.lora_module_path!r} selects {name} of {len(adapted)} of the {len(paths)} "
        "layers; with scan_layers=true the layers share one stacked adapter per weight, so a weight is "
        "adapted in every layer or in none (set scan_layers=false to adapt some layers only)"
      )
    n_in = LORA_INPUT_AXES[name]
    init_a = nnx.initializers.he_uniform(in_axis=tuple(range(n_in)), out_axis=-1)
    lora = lambda value, lora_axes: nnx.LoRAParam(
      value, out_sharding=lora_axes, sharding_rules=cfg.logical_axis_rules, eager_sharding=False
    )
    setattr(
      self,
      f"{name}_lora_a",
      lora(init_a(rngs.params(), (*shape[:n_in], cfg.lora_rank), jnp.float32), (*axes[:n_in], None)),
    )
    setattr(self, f"{name}_lora_b", lora(jnp.zeros((cfg.lora_rank, *shape[n_in:]), jnp.float32), (None, *axes[n_in:])))

  def _project(self, cfg: ModelConfig, name: str, x: jax.Array) -> jax.Array:
    """x [..., inputs...] times the weight [inputs..., outputs...] (its first LORA_INPUT_AXES[name]
    axes contract), plus the adapter's (alpha / rank) x A B where it has one; in dtype, from inputs
    in matmul_dtype."""
    n_in = LORA_INPUT_AXES[name]
    weight = getattr(self, name)[...]
    y = _weight_matmul(cfg, x, weight, n_in)
    if not hasattr(self, f"{name}_lora_a"):
      return y
    a, b = getattr(self, f"{name}_lora_a")[...], getattr(self, f"{name}_lora_b")[...]
    return y + _weight_matmul(cfg, _weight_matmul(cfg, x, a, n_in), b, 1) * cfg.lora_scale


def _weight_matmul(cfg: ModelConfig, x: jax.Array, w: jax.Array, n_in: int) -> jax.Array:
  """_tokens_matmul of x and a weight, both taken in matmul_dtype (dtype when unset), giving dtype, at
  the config's precision."""
  operands = cfg.matmul_dtype or cfg.dtype
  return _tokens_matmul(
    x.astype(operands), w.astype(operands), n_in, preferred_element_type=cfg.dtype, precision=cfg.precision
  )


def _tokens_matmul(x: jax.Array, w: jax.Array, n_in: int, **dot_kwargs) -> jax.Array:
  """Contracts x's last n_in axes with w's first n_in as one 2-D matmul over all tokens: [B, T, ...]
  flattened to rows. Written as an einsum over [B, T, ...], the backward pass's weight gradient
  contracts two axes at once and XLA:CPU first copies the activations and output gradients into a
  transposed layout (benchmarks/RESULTS.md, "After the decoder's layout changes")."""
  lead = x.shape[: x.ndim - n_in]
  rows = x.reshape(math.prod(lead), math.prod(x.shape[x.ndim - n_in :]))
  y = jnp.dot(rows, w.reshape(math.prod(w.shape[:n_in]), math.prod(w.shape[n_in:])), **dot_kwargs)
  return y.reshape(*lead, *w.shape[n_in:])


class RMSNorm(nnx.Module):
  """RMSNorm in float32, times its scale w (Gemma 3: times 1 + w, w starting at zero, as HF stores it)."""

  def __init__(self, dim: int, cfg: ModelConfig, rngs: nnx.Rngs):
    self.eps = cfg.norm_eps
    self.offset = 1.0 if cfg.gemma else 0.0
    init = nnx.initializers.zeros if cfg.gemma else nnx.initializers.ones
    self.scale = _param(cfg, rngs, init, (dim,), ("norm",))

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * (self.offset + self.scale[...].astype(jnp.float32))).astype(x.dtype)


def rope_inverse_frequencies(cfg: ModelConfig, local: bool = False) -> jax.Array:
  """RoPE inverse frequencies, with Llama-3 wavelength-dependent or linear scaling when configured;
  `local`: a sliding-window layer's (theta rope_local_theta, never scaled)."""
  theta = cfg.rope_local_theta if local else cfg.rope_theta
  inv_freq = 1.0 / (theta ** (jnp.arange(0, cfg.head_dim, 2, dtype=jnp.float32) / cfg.head_dim))
  if cfg.rope_scaling is None or local:
    return inv_freq
  s = dict(cfg.rope_scaling)
  if set(s) == {"factor"}:  # linear: positions divided by the factor
    return inv_freq / s["factor"]
  factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
  old_context = s["original_max_position_embeddings"]
  wavelen = 2 * math.pi / inv_freq
  smooth = (old_context / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
  scaled = jnp.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
  is_medium = (wavelen <= old_context / low) & (wavelen >= old_context / high)
  return jnp.where(is_medium, smoothed, scaled)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotates halves of each head (the Hugging Face layout). x: [B, T, H, D], positions: [B, T]."""
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def _write_at(buffer: jax.Array, new: jax.Array, start: jax.Array, axis: int, layer=None) -> jax.Array:
  """buffer [B, ...] with row b's new [...] written from index start[b] of its axis `axis` (of the
  row) on; with `layer`, buffer is a stacked cache's [B, layers, ...] and new goes into that layer."""
  row_axes = range(new.ndim - 1)
  at = lambda i: tuple(i if a == axis else 0 for a in row_axes)
  if layer is not None:
    new, in_layer = new[:, None], at
    at = lambda i: (layer, *in_layer(i))
  return jax.vmap(lambda buf, n, i: jax.lax.dynamic_update_slice(buf, n, at(i)))(buffer, new, start)


class Attention(_Projections):
  """Grouped-query attention with optional per-head q/k RMSNorm and a KV cache."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, paths: tuple[str, ...]):
    self.cfg = cfg
    e, hq, hkv, d = cfg.emb_dim, cfg.num_query_heads, cfg.num_kv_heads, cfg.head_dim
    self._weight(cfg, rngs, paths, "q_proj", (e, hq, d), ("embed", "q_heads", "kv"))
    self._weight(cfg, rngs, paths, "k_proj", (e, hkv, d), ("embed", "kv_heads", "kv"))
    self._weight(cfg, rngs, paths, "v_proj", (e, hkv, d), ("embed", "kv_heads", "kv"))
    self._weight(cfg, rngs, paths, "o_proj", (hq, d, e), ("heads", "kv", "embed"))
    if cfg.use_qk_norm:
      self.q_norm = RMSNorm(d, cfg, rngs)
      self.k_norm = RMSNorm(d, cfg, rngs)

  def __call__(self, x, positions, layer_cache, attention_mask, layer=None, is_global=True):
    """layer_cache: one layer's cache, or with `layer` (this layer's index) a stacked cache's.
    attention_mask: this layer's (a sliding-window layer's restricted to its window); is_global
    (a bool, or a traced one with scan_layers): whether the layer takes the global layers' RoPE."""
    cfg = self.cfg
    dt = cfg.dtype
    q = self._project(cfg, "q_proj", x)
    k = self._project(cfg, "k_proj", x)
    v = self._project(cfg, "v_proj", x)
    if cfg.use_qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    inv_freq = rope_inverse_frequencies(cfg)
    if cfg.has_local_layers and is_global is not True:
      local = rope_inverse_frequencies(cfg, local=True)
      inv_freq = local if is_global is False else jnp.where(is_global, inv_freq, local)
    q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)

    # The cache's layouts: keys [B, KV heads, D, positions], values [B, KV heads, positions, D]. Both
    # attention dots are then plain batched matrix products that need no transposed copy of the
    # cache on XLA:CPU (benchmarks/RESULTS.md, "After the decoder's layout changes").
    k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
    new_cache = None
    if layer_cache is not None:
      start = layer_cache["end_index"]
      # A stacked cache's keys and values may come as the `_bits` of its dtype (Decoder._scan).
      dtype = layer_cache.get("dtype", layer_cache["k"].dtype)
      put = (lambda a: _bits(a.astype(dtype))) if layer_cache["k"].dtype != dtype else (lambda a: a.astype(dtype))
      k = _write_at(layer_cache["k"], put(k), start, axis=2, layer=layer)
      v = _write_at(layer_cache["v"], put(v), start, axis=1, layer=layer)
      new_cache = {"k": k, "v": v, "end_index": start + x.shape[1]}
      if layer is not None:
        k, v = _from_bits(k[:, layer], dtype), _from_bits(v[:, layer], dtype)

    b, t, hq, d = q.shape
    if cfg.attention == "cudnn_flash" and t > 1:
      out = _dot_product_attention(q, k, v, attention_mask, "cudnn", cfg.attention_scale)
      return self._project(cfg, "o_proj", out), new_cache
    groups = hq // cfg.num_kv_heads
    q = q.reshape(b, t, cfg.num_kv_heads, groups, d).transpose(0, 2, 3, 1, 4)
    precision = cfg.precision
    scores = jnp.einsum("bkgtd,bkds->bkgts", q, k.astype(dt), preferred_element_type=jnp.float32, precision=precision)
    scores = scores * cfg.attention_scale
    scores = jnp.where(attention_mask[:, None, None, :, :], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    if t == 1:  # the values' dot in its plain form, then the (one-position) output transposed
      out = jnp.einsum("bkgts,bksd->bkgtd", probs, v.astype(dt), precision=precision).transpose(0, 3, 1, 2, 4)
    else:  # for a sequence the transposed output keeps less for the backward pass
      out = jnp.einsum("bkgts,bksd->btkgd", probs, v.astype(dt), precision=precision)
    out = out.reshape(b, t, hq, d)
    return self._project(cfg, "o_proj", out), new_cache


def _dot_product_attention(q, k, v, mask, implementation: Literal["cudnn", "xla"], scale=None) -> jax.Array:
  """Attention through jax.nn.dot_product_attention with `implementation` (cudnn: cuDNN's flash
  attention, what attention=cudnn_flash runs; xla: the same call through XLA): queries q [B, T, N, D],
  keys k [B, K, D, S] and values v [B, K, S, D] (the KV cache's layouts; N a multiple of K), mask
  [B, T, S] (True attends) for every head, logits scaled by `scale` (None: 1 / sqrt(D)). Keys and values are taken in
  q's dtype; returns [B, T, N, D] in it. A query row that attends no key (a left-padded position,
  whose output nothing reads) attends every key instead: cuDNN's backward pass gives NaN gradients
  for a row whose keys are all masked (on an NVIDIA H200; tests/unit/test_model.py's GPU test)."""
  dt = q.dtype
  mask = mask | ~mask.any(axis=-1, keepdims=True)
  return jax.nn.dot_product_attention(
    q,
    k.transpose(0, 3, 1, 2).astype(dt),
    v.transpose(0, 2, 1, 3).astype(dt),
    mask=mask[:, None],
    scale=q.shape[-1] ** -0.5 if scale is None else scale,
    implementation=implementation,
  )


class MLP(_Projections):
  """SwiGLU feed-forward block (Gemma 3: GeGLU, gelu's tanh approximation of the gate times up)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, paths: tuple[str, ...]):
    self.cfg = cfg
    self._weight(cfg, rngs, paths, "gate_proj", (cfg.emb_dim, cfg.mlp_dim), ("embed", "mlp"))
    self._weight(cfg, rngs, paths, "up_proj", (cfg.emb_dim, cfg.mlp_dim), ("embed", "mlp"))
    self._weight(cfg, rngs, paths, "down_proj", (cfg.mlp_dim, cfg.emb_dim), ("mlp", "embed"))

  def __call__(self, x):
    cfg = self.cfg
    gate, up = self._project(cfg, "gate_proj", x), self._project(cfg, "up_proj", x)
    h = jax.nn.gelu(gate, approximate=True) * up if cfg.gemma else _swiglu(gate, up)
    return self._project(cfg, "down_proj", h)


@jax.custom_vjp
def _swiglu(gate, up):
  """silu(gate) * up. Its backward pass keeps only gate and up and recomputes the sigmoid, where
  autodiff of the expression kept silu's intermediate values too (two more [tokens, mlp_dim] arrays
  per layer until the backward pass reaches it)."""
  return jax.nn.silu(gate) * up


def _swiglu_fwd(gate, up):
  return _swiglu(gate, up), (gate, up)


def _swiglu_bwd(residuals, d_h):
  gate, up = residuals
  g = gate.astype(jnp.float32)
  # Written unlike jax.nn.sigmoid's 1 / (1 + exp(-g)): XLA:CPU would merge the two and keep the
  # forward pass's [tokens, mlp_dim] sigmoid for the backward pass.
  sigmoid = 0.5 * jnp.tanh(0.5 * g) + 0.5
  d_gate = d_h * up * (sigmoid * (1.0 + g * (1.0 - sigmoid)))
  d_up = d_h * g * sigmoid
  return d_gate.astype(gate.dtype), d_up.astype(up.dtype)


_swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


class DecoderLayer(nnx.Module):
  """Pre-norm attention and MLP blocks; Gemma 3 also normalises each block's output (post_attn_norm,
  post_mlp_norm) before adding it to the residual stream."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, paths: tuple[str, ...]):
    self.attn_norm = RMSNorm(cfg.emb_dim, cfg, rngs)
    self.attn = Attention(cfg, rngs, tuple(f"{path}.attn" for path in paths))
    if cfg.gemma:
      self.post_attn_norm = RMSNorm(cfg.emb_dim, cfg, rngs)
    self.mlp_norm = RMSNorm(cfg.emb_dim, cfg, rngs)
    self.mlp = MLP(cfg, rngs, tuple(f"{path}.mlp" for path in paths))
    if cfg.gemma:
      self.post_mlp_norm = RMSNorm(cfg.emb_dim, cfg, rngs)

  def __call__(self, x, positions, layer_cache, attention_mask, layer=None, is_global=True):
    h, new_cache = self.attn(self.attn_norm(x), positions, layer_cache, attention_mask, layer, is_global)
    if hasattr(self, "post_attn_norm"):
      h = self.post_attn_norm(h)
    x = x + h
    h = self.mlp(self.mlp_norm(x))
    if hasattr(self, "post_mlp_norm"):
      h = self.post_mlp_norm(h)
    return x + h, new_cache


def _stacked_layers(cfg: ModelConfig, rngs: nnx.Rngs) -> DecoderLayer:
  """One DecoderLayer whose parameters hold every layer's, stacked on a leading axis named 'layers'."""
  paths = tuple(f"layers.{i}" for i in range(cfg.num_layers))

  @nnx.split_rngs(splits=cfg.num_layers)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
  def make(layer_rngs: nnx.Rngs) -> DecoderLayer:
    return DecoderLayer(cfg, layer_rngs, paths)

  return make(rngs)


class Decoder(nnx.Module):
  """Token embedding, decoder layers, final norm and output projection."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.embed = _param(cfg, rngs, nnx.initializers.normal(0.02), (cfg.vocab_size, cfg.emb_dim), ("vocab", "embed"))
    self.layers: DecoderLayer | nnx.List[DecoderLayer]
    if cfg.scan_layers:
      self.layers = _stacked_layers(cfg, rngs)
    else:
      self.layers = nnx.List([DecoderLayer(cfg, rngs, (f"layers.{i}",)) for i in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.emb_dim, cfg, rngs)
    if not cfg.tie_embeddings:
      self.lm_head = _param(
        cfg, rngs, nnx.initializers.lecun_normal(), (cfg.emb_dim, cfg.vocab_size), ("embed", "vocab")
      )

  @property
  def num_embed(self) -> int:
    return self.config.vocab_size

  def __call__(
    self,
    input_tokens: jax.Array,
    positions: jax.Array,
    cache: Cache | None,
    attention_mask: jax.Array,
    logits_from: int = 0,
    decode_only_last_token: bool = False,
  ) -> tuple[jax.Array, Cache | None]:
    """input_tokens/positions: [B, T]; attention_mask: [B, T, S] (True attends), S = T or cache size.

    Returns float32 logits [B, T - logits_from, V] (of positions logits_from and later) and the
    updated cache (None without a cache). decode_only_last_token: the last position's logits only,
    [B, 1, V] (Tunix's sampler asks for them so in its prefill when the parameter exists).
    A call with a KV cache is a sampler's, which nothing differentiates: hidden_states' `inference`.
    """
    first = input_tokens.shape[1] - 1 if decode_only_last_token else logits_from
    inference = cache is not None
    hidden, new_cache = self.hidden_states(input_tokens, positions, cache, attention_mask, first, inference)
    return self.logits(hidden), new_cache

  def hidden_states(
    self,
    input_tokens: jax.Array,
    positions: jax.Array,
    cache: Cache | None,
    attention_mask: jax.Array,
    first: int = 0,
    inference: bool = False,
  ) -> tuple[jax.Array, Cache | None]:
    """As __call__, but returns the final norm's output [B, T - first, D] (of positions first and
    later), from which `logits` gives the logits. inference: nothing differentiates the call (a
    sampler's), so no layer is rematerialized (remat_policy) and 16-bit float weights and a stacked
    cache are gathered, sliced and written as their bits (`_bits`), the same values without XLA:CPU's
    float32 copies of them. Scoring with a cache (SharedPrefix) is differentiated: not inference."""
    cfg = self.config
    x = _take(self.embed[...], input_tokens, inference).astype(cfg.dtype)
    if cfg.gemma:  # scaled by sqrt(emb_dim), rounded to the activations' dtype as transformers does
      x = x * jnp.asarray(math.sqrt(cfg.emb_dim), cfg.dtype)
    local_mask = sliding_window_mask(attention_mask, cfg.sliding_window) if cfg.has_local_layers else None
    if cfg.scan_layers:
      x, stacked_cache = self._scan(x, positions, cache, attention_mask, local_mask, inference)
      return self.final_norm(x[:, first:]), stacked_cache
    assert isinstance(self.layers, nnx.List)
    new_cache: Cache | None = None if cache is None else {}
    for i, layer in enumerate(self.layers):
      name = f"layer_{i}"
      layer_cache = None if cache is None else cache[name]
      is_global = cfg.is_global(i)
      mask = attention_mask if is_global else local_mask
      if cfg.remat and not inference:
        call = functools.partial(lambda g, lyr, *a: lyr(*a, None, g), is_global)
        x, updated = nnx.remat(call)(layer, x, positions, layer_cache, mask)
      else:
        x, updated = layer(x, positions, layer_cache, mask, None, is_global)
      if new_cache is not None:
        new_cache[name] = updated
    return self.final_norm(x[:, first:]), new_cache

  def _scan(
    self, x, positions, cache: Cache | None, attention_mask, local_mask=None, inference: bool = False
  ) -> tuple[jax.Array, Cache | None]:
    """The stacked layers run in turn on x by one jax.lax.scan (with remat, unless inference, each layer's
    step under jax.checkpoint). With inference the stacked cache's keys and values are carried through it
    and written in place, and the scan slices the weights and the cache as their `_bits`. Otherwise
    (scoring through a cache, which is differentiated: SharedPrefix) each layer's keys and values are the
    scan's inputs and outputs, so a rematerialized step keeps its own layer's cache, not the whole
    carried one. With sliding-window layers (local_mask: their mask), each layer's global flag is a scan
    input."""
    cfg = self.config
    assert isinstance(self.layers, DecoderLayer)
    graphdef, params = nnx.split(self.layers)
    stacked = None if cache is None else cache["layers"]
    dtypes = jax.tree.map(lambda p: p.dtype, params)
    as_bits = _bits if inference else lambda a: a
    params = jax.tree.map(as_bits, params)
    carried = stacked is not None and inference

    def step(carry, layer_inputs):
      x, kv = carry
      layer_state, index, is_global, own = layer_inputs
      layer_state = jax.tree.map(_from_bits, layer_state, dtypes)
      mask = attention_mask if local_mask is None else jnp.where(is_global, attention_mask, local_mask)
      flag = True if local_mask is None else is_global
      layer_cache, at = None, None
      if carried:
        layer_cache = {"k": kv[0], "v": kv[1], "end_index": stacked["end_index"], "dtype": stacked["k"].dtype}
        at = index
      elif own is not None:
        layer_cache = {"k": own[0], "v": own[1], "end_index": stacked["end_index"]}
      x, updated = nnx.merge(graphdef, layer_state)(x, positions, layer_cache, mask, at, flag)
      if carried:
        return (x, (updated["k"], updated["v"])), None
      return (x, None), None if updated is None else (updated["k"], updated["v"])

    if cfg.remat and not inference:
      step = jax.checkpoint(step)
    kv = own = None
    if stacked is not None and carried:
      kv = (as_bits(stacked["k"]), as_bits(stacked["v"]))
    elif stacked is not None:
      own = (jnp.moveaxis(stacked["k"], 1, 0), jnp.moveaxis(stacked["v"], 1, 0))
    flags = jnp.asarray([cfg.is_global(i) for i in range(cfg.num_layers)])
    (x, kv), layers = jax.lax.scan(step, (x, kv), (params, jnp.arange(cfg.num_layers), flags, own))
    if stacked is None:
      return x, None
    dtype = stacked["k"].dtype
    k, v = (
      (_from_bits(kv[0], dtype), _from_bits(kv[1], dtype))
      if kv is not None
      else (jnp.moveaxis(a, 0, 1) for a in layers)
    )
    return x, {
      "layers": {
        "k": k,
        "v": v,
        "end_index": stacked["end_index"] + x.shape[1],
      }
    }

  def output_head(self) -> jax.Array:
    """The output layer's weights [D, V] in the matmul dtype (the embedding's transpose when tied)."""
    head = self.embed[...].T if self.config.tie_embeddings else self.lm_head[...]
    return head.astype(self.config.matmul_dtype or self.config.dtype)

  def logits(self, hidden: jax.Array) -> jax.Array:
    """float32 logits [B, T, V] of hidden states [B, T, D] from hidden_states."""
    head = self.output_head()
    return _tokens_matmul(
      hidden.astype(head.dtype), head, 1, preferred_element_type=jnp.float32, precision=self.config.precision
    )

  def init_cache(self, batch_size: int, cache_size: int, dtype) -> Cache:
    return init_cache(self.config, batch_size, cache_size, dtype)


def _bits(x: jax.Array) -> jax.Array:
  """A 16-bit float array as its bit pattern (uint16); other arrays as they are. XLA:CPU gathers,
  slices and scatters 16-bit floats by converting the whole operand to float32 first: the embedding
  and every stacked weight once per decode program (it hoists the conversion out of the loop), a
  stacked cache at every layer of every step. Their bits it moves where they lie. Bits carry no
  gradient: only calls that nothing differentiates (`inference`) take them."""
  is_16_bit_float = jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize == 2
  return jax.lax.bitcast_convert_type(x, jnp.uint16) if is_16_bit_float else x


def _from_bits(x: jax.Array, dtype) -> jax.Array:
  """The inverse of `_bits` for an array that was of `dtype`."""
  return x if x.dtype == dtype else jax.lax.bitcast_convert_type(x, dtype)


def _take(table: jax.Array, tokens: jax.Array, as_bits: bool) -> jax.Array:
  """table[tokens] along axis 0; with as_bits gathered as `_bits` (the same values)."""
  if not as_bits:
    return jnp.take(table, tokens, axis=0)
  return _from_bits(jnp.take(_bits(table), tokens, axis=0), table.dtype)


def init_cache(cfg: ModelConfig, batch_size: int, cache_size: int, dtype) -> Cache:
  """An empty KV cache of `batch_size` rows of `cache_size` positions for a decoder of `cfg` (the
  module docstring's layouts)."""
  keys = (batch_size, cfg.num_kv_heads, cfg.head_dim, cache_size)
  values = (batch_size, cfg.num_kv_heads, cache_size, cfg.head_dim)
  if cfg.scan_layers:  # each row's keys and values of every layer: [B, layers, ...]
    layers = lambda shape: (shape[0], cfg.num_layers, *shape[1:])
    return {
      "layers": {
        "k": jnp.zeros(layers(keys), dtype),
        "v": jnp.zeros(layers(values), dtype),
        "end_index": jnp.zeros((batch_size,), jnp.int32),
      }
    }
  return {
    f"layer_{i}": {
      "k": jnp.zeros(keys, dtype),
      "v": jnp.zeros(values, dtype),
      "end_index": jnp.zeros((batch_size,), jnp.int32),
    }
    for i in range(cfg.num_layers)
  }


class DecodeCopy:
  """A copy of a decoder for sampling. With `unrolled` its layers are unrolled: each layer's weights are
  arrays of their own, so a decode step reads them, and each layer's KV cache (`init_cache`: one entry
  per layer), where they lie. A scanned decoder's step instead slices each layer's weights and cache out
  of the stacked arrays, a copy of each per layer and step in the compiled program
  (tests/unit/test_decode_copy.py counts them; benchmarks/RESULTS.md, "Decode from unrolled layers").
  Without it the copy keeps the source's layout.

  matmul_dtype None: the weights keep their dtypes, so the copy computes what a decoder of its layout
  with the same weights computes, and the leaves outside the layers (embedding, final norm, output layer)
  are the source's own arrays, not copied. Else the weights are stored in matmul_dtype and the weight
  matmuls (projections and output layer) take their inputs rounded to it, accumulating in the model's
  dtype: norms, attention, the residual stream and the logits stay in the model's dtypes. The output
  layer is then stored [D, V] (a tied model's embedding transposed), the layout XLA:CPU multiplies by
  without first converting it; a decode step reads half a float32 model's weight bytes, at bfloat16's
  rounding of weights and matmul inputs (benchmarks/RESULTS.md, "Rollouts in bfloat16").

  `config` and `graphdef` are fixed; `state()` copies the source model's current values (its own
  variables, so in-place updates show) in one compiled program; `nbytes`: the copy's weights (what a
  decode step reads), `added_bytes`: the memory it adds to the source's."""

  def __init__(self, model: Decoder, matmul_dtype=None, unrolled: bool = True):
    cfg = dataclasses.replace(model.config, scan_layers=False) if unrolled else model.config
    self._dtype = None if matmul_dtype is None else jnp.dtype(matmul_dtype)
    if self._dtype is not None:
      cfg = dataclasses.replace(cfg, weight_dtype=self._dtype, matmul_dtype=self._dtype, tie_embeddings=False)
    self.config = cfg
    self.graphdef, target = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    self._source = nnx.state(model)
    sources = {path: i for i, (path, _) in enumerate(jax.tree_util.tree_flatten_with_path(self._source)[0])}
    paths, self._target = jax.tree_util.tree_flatten_with_path(target)
    embed = next(i for path, i in sources.items() if _top_name(path) == "embed")
    split = model.config.scan_layers and not cfg.scan_layers

    def plan(path, leaf) -> tuple[int, int | None, bool, bool]:
      """(index of the source leaf, the layer it is sliced at (None: whole), whether it is transposed,
      whether it is cast to matmul_dtype) of one leaf of the copy: a tied model's output layer is its
      embedding's transpose, an unrolled layer's leaf (layers.3.attn.q_proj) a stacked leaf's slice;
      a stacked leaf has one more axis than the matrix or vector it stacks."""
      layers = _top_name(path) == "layers"
      cast = self._dtype is not None and leaf.ndim - int(cfg.scan_layers and layers) >= 2
      if _top_name(path) == "lm_head" and model.config.tie_embeddings:
        return embed, None, True, True
      if split and layers:
        return sources[path[:1] + path[2:]], path[1].key, False, cast
      return sources[path], None, False, cast

    self._plan = tuple(plan(path, leaf) for path, leaf in paths)
    made = (i for i, (_, layer, transposed, cast) in enumerate(self._plan) if layer is not None or transposed or cast)
    self._made = tuple(made)  # the leaves _copy_leaves makes (the others are the source's own)
    self._made_plan = tuple(self._plan[i] for i in self._made)
    leaves = tuple(jax.tree.leaves(self._source))
    shapes = jax.eval_shape(_copy_leaves, leaves, self._made_plan, self._dtype)
    self.added_bytes = sum(x.size * x.dtype.itemsize for x in shapes)
    kept = set(range(len(self._plan))) - set(self._made)
    self.nbytes = self.added_bytes + sum(leaves[self._plan[i][0]].nbytes for i in kept)

  def state(self) -> nnx.State:
    leaves = tuple(jax.tree.leaves(self._source))
    values = [leaves[index] for index, *_ in self._plan]
    for i, value in zip(self._made, _copy_leaves(leaves, self._made_plan, self._dtype)):
      values[i] = value
    return jax.tree.unflatten(self._target, values)

  def init_cache(self, batch_size: int, cache_size: int, dtype) -> Cache:
    return init_cache(self.config, batch_size, cache_size, dtype)


def _top_name(path) -> str | None:
  """The attribute of the Decoder a state path starts at (embed, layers, lm_head, ...)."""
  return getattr(path[0], "key", None)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _copy_leaves(leaves: tuple, plan: tuple, dtype) -> list:
  """DecodeCopy's made leaves from the source's (its plan's entries for them)."""
  out = []
  for index, layer, transposed, cast in plan:
    x = leaves[index] if layer is None else leaves[index][layer]
    x = x.T if transposed else x
    out.append(x.astype(dtype) if cast else x)
  return out


def cache_length(cache: Cache) -> int:
  """How many positions each row of a cache from Decoder.init_cache holds."""
  return next(iter(cache.values()))["v"].shape[-2]


def cache_rows(cache: Cache) -> int:
  """How many rows a cache from Decoder.init_cache holds."""
  return next(iter(cache.values()))["end_index"].shape[0]
