# pylint: disable=invalid-name
"""One decoder-only transformer for the Llama, Qwen2/3 and Gemma 1/2/3 families (Flax NNX).

`Config` flags switch between the published variants:
  Llama 2/3 (Touvron et al. 2023; Grattafiori et al. 2024): RMSNorm, SwiGLU MLP, RoPE (Su et
    al. 2021) with the Llama-3 frequency rescaling, grouped-query attention (Ainslie et al. 2023).
  Qwen2 / Qwen2.5 (Yang et al. 2024): biases on the q, k and v projections.
  Qwen3 (Yang et al. 2025): an RMSNorm over each query and key head.
  Gemma (Gemma Team 2024a): embeddings scaled by sqrt(D), RMSNorm with (1 + w), GeGLU.
  Gemma 2 (Gemma Team 2024b): tanh soft-capping of attention and final logits, sliding-window
    layers alternating with global ones, norms after as well as before each sub-block, and
    the attention scale query_pre_attn_scalar ** -0.5.
  Gemma 3 (Gemma Team 2025): q/k norm, 5 local : 1 global layers, RoPE base 10k on local
    layers and 1M (optionally linearly scaled) on global ones.

Layers are stored stacked on a leading L axis and run with `lax.scan`, so compile time does not
grow with depth (`Config.unroll_layers` loops over static per-layer slices instead in the
cache-free forward: same values, about twice the compile time). Attention rule, shared by the
full forward and the KV-cache path: the token in slot j attends to slot i iff i <= j, slot i
holds a real token (input mask), and on sliding layers pos_j - pos_i < window. Rows may be
left- or right-padded; positions are explicit. Parameters are stored in `param_dtype`, matmuls
run in `dtype`, norms, softmax and logits in f32.
"""
import dataclasses
import functools
import math
from typing import Any

import flax
from flax import nnx
import jax
import jax.numpy as jnp

from agentrl.models import decoder_math as dm
from agentrl.models import presets

FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")
ROPE_SCALINGS = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class Config:
  """Architecture and precision of a decoder. Hashable, so jitted code may close over it."""
  vocab: int                                # V
  width: int                                # D
  depth: int                                # L
  heads: int                                # H (query heads)
  kv_heads: int                             # key/value heads (GQA groups)
  head_dim: int                             # K
  mlp: int                                  # F
  family: str = "llama"                     # HF export format, one of FAMILIES
  act: str = "silu"                         # gate activation: silu (SwiGLU) or gelu_tanh (GeGLU)
  norm_eps: float = 1e-6
  norm_plus_one: bool = False               # Gemma: RMSNorm scales by (1 + w)
  embed_scale: bool = False                 # Gemma: embeddings times sqrt(D)
  post_norms: bool = False                  # Gemma 2/3: RMSNorm after attention and MLP too
  qkv_bias: bool = False                    # Qwen2
  qk_norm: bool = False                     # Qwen3, Gemma 3
  tie_embeddings: bool = True               # unembedding = embedding.T
  rope_theta: float = 10000.0               # base on global layers
  rope_local_theta: float | None = None     # Gemma 3 sliding layers (unscaled); None: as global
  rope_scaling: str = "default"             # default | linear | llama3 (global layers)
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0         # llama3 only
  rope_high_freq_factor: float = 4.0        # llama3 only
  rope_original_max_len: int = 8192         # llama3 only
  query_pre_attn_scalar: float | None = None  # attention scale is this ** -0.5 (None: K)
  attn_logit_softcap: float | None = None   # Gemma 2
  final_logit_softcap: float | None = None  # Gemma 2
  sliding_window: int | None = None         # None: every layer is global
  sliding_window_pattern: int = 1           # layer i is global iff (i + 1) % pattern == 0
  max_len: int = 8192                       # max_position_embeddings (exported, not enforced)
  param_dtype: Any = jnp.float32            # storage and optimizer precision
  dtype: Any = jnp.bfloat16                 # matmul and activation precision
  remat: bool = False                       # recompute each layer in the backward pass
  attention: str = "xla"                    # cache-free forwards: xla | fused (ATTENTIONS)
  decode_attention: str = "xla"             # decode steps: xla | pallas (DECODE_ATTENTIONS)
  unroll_layers: bool = False               # cache-free forward: a Python loop, not a scan

  def __post_init__(self):
    for name in ("param_dtype", "dtype"):
      object.__setattr__(self, name, jnp.dtype(getattr(self, name)))
    checks = [
        (self.family in FAMILIES, f"family={self.family!r}; expected one of {FAMILIES}"),
        (self.act in dm.ACTIVATIONS,
         f"act={self.act!r}; expected one of {tuple(dm.ACTIVATIONS)}"),
        (self.rope_scaling in ROPE_SCALINGS,
         f"rope_scaling={self.rope_scaling!r}; expected one of {ROPE_SCALINGS}"),
        (self.attention in dm.ATTENTIONS,
         f"attention={self.attention!r}; expected one of {dm.ATTENTIONS}"),
        (self.decode_attention in dm.DECODE_ATTENTIONS,
         f"decode_attention={self.decode_attention!r}; expected one of "
         f"{dm.DECODE_ATTENTIONS}"),
        (self.attention != "fused" or not self.attn_logit_softcap,
         "attention='fused' has no logit soft-capping (Gemma 2); use attention='xla'"),
        (self.heads % self.kv_heads == 0,
         f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}"),
        (self.head_dim % 2 == 0, f"head_dim={self.head_dim} must be even for RoPE"),
        (self.sliding_window_pattern >= 1,
         f"sliding_window_pattern={self.sliding_window_pattern} must be >= 1"),
        (min(self.vocab, self.width, self.depth, self.heads, self.mlp) > 0,
         "vocab, width, depth, heads and mlp must be positive"),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(f"Invalid transformer.Config: {message}.")

  @classmethod
  def named(cls, name: str, **overrides) -> "Config":
    """A preset from `presets.PRESETS` ("tiny", "qwen3-0.6b", ...) with fields overridden."""
    if name not in presets.PRESETS:
      raise ValueError(f"Unknown model preset {name!r}; known: {sorted(presets.PRESETS)}.")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
      raise ValueError(f"Unknown Config field(s) {unknown} in overrides for preset {name!r}.")
    return cls(**{**presets.PRESETS[name], **overrides})

  @property
  def local_layers(self) -> tuple[bool, ...]:
    """Whether each layer uses sliding-window attention (and the local RoPE base)."""
    if self.sliding_window is None:
      return (False,) * self.depth
    return tuple((i + 1) % self.sliding_window_pattern != 0 for i in range(self.depth))


@flax.struct.dataclass
class KVCache:
  """Keys/values of every layer for S slots; G is the number of KV heads.

  Heads come before slots so that a decode step's attention is a batched matmul over (B, G)
  as stored (with slots first, every layer and step would transpose the whole cache). With
  `init_cache(..., per_layer=True)` k and v are tuples of L [B, G, S, K] buffers, for
  `Transformer.decode(..., layers=)`: reading one layer out of the stacked array is a copy of
  that layer's cache at every step.
  """
  k_LBGSK: jax.Array | tuple[jax.Array, ...]
  v_LBGSK: jax.Array | tuple[jax.Array, ...]
  valid_BS: jax.Array   # bool: the slot holds a real token
  pos_BS: jax.Array     # int32 rotary position of the token in each slot


def kv_batch_axis(cache: KVCache) -> int:
  """The B axis of the cache's key/value buffers (1 stacked, 0 per layer); S is 2 after it."""
  return 0 if isinstance(cache.k_LBGSK, tuple) else 1


def init_cache(cfg: Config, batch: int, max_len: int, dtype=None, *,
               per_layer: bool = False) -> KVCache:
  """An empty cache with `max_len` slots (all invalid); per_layer: one buffer per layer."""
  shape = (batch, cfg.kv_heads, max_len, cfg.head_dim)
  dtype = cfg.dtype if dtype is None else dtype
  if per_layer:
    zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.depth))
  else:
    zeros = lambda: jnp.zeros((cfg.depth, *shape), dtype)
  return KVCache(k_LBGSK=zeros(), v_LBGSK=zeros(),
                 valid_BS=jnp.zeros((batch, max_len), bool),
                 pos_BS=jnp.zeros((batch, max_len), jnp.int32))


def logical_param(value: jax.Array, names: tuple[str, ...]) -> nnx.Param:
  """An nnx.Param carrying logical axis names (sharded at creation only if a mesh is set)."""
  # Flax shards a Param at creation when a mesh is set and raises without one; with no mesh
  # the logical names are kept as metadata only, so models also run unsharded.
  eager = None if not jax.sharding.get_abstract_mesh().empty else False
  return nnx.Param(value, out_sharding=names, eager_sharding=eager)


def _normal(rngs: nnx.Rngs, cfg: Config, shape, names, fan_in: int) -> nnx.Param:
  w = jax.random.normal(rngs.params(), shape, jnp.float32) / math.sqrt(fan_in)
  return logical_param(w.astype(cfg.param_dtype), names)


def _const(cfg: Config, value: float, shape, names) -> nnx.Param:
  return logical_param(jnp.full(shape, value, cfg.param_dtype), names)


class Attention(nnx.Module):
  """Stacked attention projections [L, ...], with optional q/k/v biases and q/k norms."""

  def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
    L, D, H, G, K = cfg.depth, cfg.width, cfg.heads, cfg.kv_heads, cfg.head_dim
    self.q_LDHK = _normal(rngs, cfg, (L, D, H, K), ("layers", "embed", "heads", "head_dim"), D)
    self.k_LDHK = _normal(rngs, cfg, (L, D, G, K), ("layers", "embed", "kv_heads", "head_dim"), D)
    self.v_LDHK = _normal(rngs, cfg, (L, D, G, K), ("layers", "embed", "kv_heads", "head_dim"), D)
    self.o_LHKD = _normal(rngs, cfg, (L, H, K, D), ("layers", "heads", "head_dim", "embed"), H * K)
    if cfg.qkv_bias:
      self.q_bias_LHK = _const(cfg, 0.0, (L, H, K), ("layers", "heads", "head_dim"))
      self.k_bias_LHK = _const(cfg, 0.0, (L, G, K), ("layers", "kv_heads", "head_dim"))
      self.v_bias_LHK = _const(cfg, 0.0, (L, G, K), ("layers", "kv_heads", "head_dim"))
    if cfg.qk_norm:
      one = 0.0 if cfg.norm_plus_one else 1.0
      self.q_norm_LK = _const(cfg, one, (L, K), ("layers", "head_dim"))
      self.k_norm_LK = _const(cfg, one, (L, K), ("layers", "head_dim"))


class Mlp(nnx.Module):
  """Stacked gated MLP [L, ...]: down(act(gate(x)) * up(x))."""

  def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
    L, D, F = cfg.depth, cfg.width, cfg.mlp
    self.gate_LDF = _normal(rngs, cfg, (L, D, F), ("layers", "embed", "mlp"), D)
    self.up_LDF = _normal(rngs, cfg, (L, D, F), ("layers", "embed", "mlp"), D)
    self.down_LFD = _normal(rngs, cfg, (L, F, D), ("layers", "mlp", "embed"), F)


class Layers(nnx.Module):
  """All decoder layers, stacked on a leading L axis."""

  def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
    one = 0.0 if cfg.norm_plus_one else 1.0
    norm = lambda: _const(cfg, one, (cfg.depth, cfg.width), ("layers", "embed"))
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp = Mlp(cfg, rngs=rngs)
    self.pre_attn_norm_LD = norm()
    self.pre_mlp_norm_LD = norm()
    if cfg.post_norms:
      self.post_attn_norm_LD = norm()
      self.post_mlp_norm_LD = norm()


# ------------------------------------------------------------------------------------------
# The model.
# ------------------------------------------------------------------------------------------


class Transformer(nnx.Module):
  """Decoder-only LM. Use functionally: `graphdef, params = nnx.split(model)`."""

  def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embedding_VD = _normal(rngs, cfg, (cfg.vocab, cfg.width), ("vocab", "embed"), cfg.width)
    self.layers = Layers(cfg, rngs=rngs)
    self.final_norm_D = _const(cfg, 0.0 if cfg.norm_plus_one else 1.0, (cfg.width,), ("embed",))
    if not cfg.tie_embeddings:
      self.lm_head_DV = _normal(rngs, cfg, (cfg.width, cfg.vocab), ("embed", "vocab"), cfg.width)

  def __call__(self, tokens_BT, positions_BT, input_mask_BT=None) -> jax.Array:
    """Float32 logits [B, T, V]; logits at t predict token t + 1."""
    return self.logits(self.hidden(tokens_BT, positions_BT, input_mask_BT))

  def hidden(self, tokens_BT, positions_BT, input_mask_BT=None, *, adapter=None) -> jax.Array:
    """Final hidden states [B, T, D] (after the final norm), in `cfg.dtype`.

    `adapter` (LoRA, agentrl/models/lora.py) is (params with a leading L axis, fn): layer i
    computes each projection y = x W named q, k, v, o, gate, up or down as
    fn(params[i], i, name, x, y), e.g. y plus a low-rank term.
    """
    if input_mask_BT is None:
      input_mask_BT = jnp.ones(tokens_BT.shape, bool)
    positions_BT = positions_BT.astype(jnp.int32)
    slot_T = jnp.arange(tokens_BT.shape[1], dtype=jnp.int32)
    masks = dm.allowed(self.cfg, positions_BT, positions_BT, slot_T, input_mask_BT.astype(bool))
    x_BTD, _ = self._run_layers(self._embed(tokens_BT), positions_BT, masks, None, adapter)
    return dm.rms_norm(self.cfg, x_BTD, self.final_norm_D[...])

  def unembed_DV(self) -> jax.Array:
    """The output projection [D, V] in `cfg.dtype` (the embedding transposed when tied)."""
    w_DV = self.embedding_VD[...].T if self.cfg.tie_embeddings else self.lm_head_DV[...]
    return w_DV.astype(self.cfg.dtype)

  def logits(self, h_BTD) -> jax.Array:
    """Float32 logits from final hidden states, with Gemma 2's final soft-cap if set."""
    logits_BTV = jnp.einsum("btd,dv->btv", h_BTD.astype(self.cfg.dtype), self.unembed_DV(),
                            preferred_element_type=jnp.float32)
    if self.cfg.final_logit_softcap:
      cap = self.cfg.final_logit_softcap
      logits_BTV = cap * jnp.tanh(logits_BTV / cap)
    return logits_BTV

  def decode(self, tokens_BT, positions_BT, input_mask_BT, cache: KVCache, cache_index, *,
             adapter=None, layers=None):
    """Runs T new tokens against the cache; returns (f32 logits [B, T, V], updated cache).

    The new keys/values go to slots [cache_index, cache_index + T) (the caller keeps this in
    range: out-of-range writes are clamped by XLA). Prefill a left-padded batch with
    cache_index=0, then decode with T=1. Gives the same logits as `__call__` on the
    concatenated tokens. `adapter` as in `hidden`. `layers` = `unstack_layers(params)` runs the
    layers as an unrolled loop over those per-layer buffers instead of scanning the stacked
    weights: the same math, without the scan's per-layer copy of every weight (a large share
    of a memory-bound CPU decode step; the rollout engine does this on CPU).
    """
    cfg = self.cfg
    idx = jnp.asarray(cache_index, jnp.int32)
    positions_BT = positions_BT.astype(jnp.int32)
    if input_mask_BT is None:
      input_mask_BT = jnp.ones(tokens_BT.shape, bool)
    valid_BS = jax.lax.dynamic_update_slice(cache.valid_BS, input_mask_BT.astype(bool), (0, idx))
    pos_BS = jax.lax.dynamic_update_slice(cache.pos_BS, positions_BT, (0, idx))
    slot_T = idx + jnp.arange(tokens_BT.shape[1], dtype=jnp.int32)
    mask_fn = dm.cache_masks if cfg.decode_attention == "pallas" else dm.allowed
    masks = mask_fn(cfg, positions_BT, pos_BS, slot_T, valid_BS)
    kv = (cache.k_LBGSK, cache.v_LBGSK, idx)
    x_BTD, (k_LBGSK, v_LBGSK, _) = self._run_layers(self._embed(tokens_BT), positions_BT,
                                                     masks, kv, adapter, layers)
    logits_BTV = self.logits(dm.rms_norm(cfg, x_BTD, self.final_norm_D[...]))
    return logits_BTV, KVCache(k_LBGSK, v_LBGSK, valid_BS, pos_BS)

  def _embed(self, tokens_BT):
    # Clip, not NaN-fill: a stray out-of-range pad id must not poison attention sums.
    x_BTD = jnp.take(self.embedding_VD[...], tokens_BT, axis=0, mode="clip")
    x_BTD = x_BTD.astype(self.cfg.dtype)
    if self.cfg.embed_scale:  # Gemma rounds sqrt(D) to the compute dtype first
      x_BTD = x_BTD * jnp.asarray(math.sqrt(self.cfg.width), self.cfg.dtype)
    return x_BTD

  def _run_layers(self, x_BTD, positions_BT, masks, kv, adapter, layers=None):
    """Scans the stacked layers (or loops over `layers`, per-layer params without the L axis).
    kv is None (no cache) or (k_LBGSK, v_LBGSK, write index)."""
    cfg = self.cfg
    params = nnx.to_pure_dict(nnx.state(self.layers, nnx.Param))
    has_local = any(cfg.local_layers)
    rope_global = dm.rope_tables(cfg, positions_BT, local=False)
    rope_local = dm.rope_tables(cfg, positions_BT, local=True) if has_local else rope_global
    adapter_params, adapter_fn = adapter or (None, None)
    xs = (params, jnp.arange(cfg.depth, dtype=jnp.int32), jnp.asarray(cfg.local_layers),
          adapter_params)

    def body(carry, xs, static_layer=None):
      x_BTD, kv = carry
      p, layer, local, a = xs
      adapt = dm.no_adapter if adapter is None else functools.partial(adapter_fn, a, layer)
      pick = lambda a, b: jnp.where(local, a, b) if has_local and a is not b else b
      sin_cos = jax.tree.map(pick, rope_local, rope_global)
      allowed_BTS = jax.tree.map(pick, masks[1], masks[0])   # an array or a CacheMask
      if kv is None:
        no_cache = lambda k, v: (dm.heads_first(k), dm.heads_first(v))
        return (dm.layer(cfg, p, x_BTD, sin_cos, allowed_BTS, no_cache, adapt), None), None
      k_LBGSK, v_LBGSK, idx = kv
      written = {}

      def kv_fn(k_BTGK, v_BTGK):
        if isinstance(k_LBGSK, tuple):   # per-layer buffers: this layer's only
          write = lambda buf, x: jax.lax.dynamic_update_slice(
              buf, dm.heads_first(x).astype(buf.dtype), (0, 0, idx, 0))
          k_BGSK = write(k_LBGSK[static_layer], k_BTGK)
          v_BGSK = write(v_LBGSK[static_layer], v_BTGK)
          swap = lambda buf, x: buf[:static_layer] + (x,) + buf[static_layer + 1:]
          written["k"], written["v"] = swap(k_LBGSK, k_BGSK), swap(v_LBGSK, v_BGSK)
          return k_BGSK.astype(cfg.dtype), v_BGSK.astype(cfg.dtype)
        start = (layer, 0, 0, idx, 0)
        written["k"] = jax.lax.dynamic_update_slice(
            k_LBGSK, dm.heads_first(k_BTGK)[None].astype(k_LBGSK.dtype), start)
        written["v"] = jax.lax.dynamic_update_slice(
            v_LBGSK, dm.heads_first(v_BTGK)[None].astype(v_LBGSK.dtype), start)
        dt = cfg.dtype
        return written["k"][layer].astype(dt), written["v"][layer].astype(dt)

      x_BTD = dm.layer(cfg, p, x_BTD, sin_cos, allowed_BTS, kv_fn, adapt)
      return (x_BTD, (written["k"], written["v"], idx)), None

    if layers is not None and (adapter is not None or len(layers) != cfg.depth):
      raise ValueError(f"layers= needs {cfg.depth} per-layer params and no adapter.")
    if kv is not None and isinstance(kv[0], tuple) and layers is None:
      raise ValueError("a per-layer KV cache needs decode(..., layers=unstack_layers(params)).")
    if cfg.remat:
      body = jax.checkpoint(body, static_argnums=(2,))
    # A Python loop instead of the scan: over `layers` (per-layer buffers, no per-step copy of
    # the weights out of the stack: the engine's CPU decode), or, with Config.unroll_layers,
    # over static slices of the stack (per-layer residuals instead of the scan's [L, ...]
    # stacks; interleaved timings showed no net gain on XLA:CPU, docs/performance.md).
    if layers is not None or (kv is None and cfg.unroll_layers):
      carry = (x_BTD, kv)
      for i in range(cfg.depth):
        xs_i = jax.tree.map(lambda a, i=i: a[i], xs[1:])
        p = layers[i] if layers is not None else jax.tree.map(lambda a, i=i: a[i], xs[0])
        carry, _ = body(carry, (p, *xs_i), i)
      return carry
    (x_BTD, kv), _ = jax.lax.scan(lambda c, x: body(c, x, None), (x_BTD, kv), xs)
    return x_BTD, kv


def unstack_layers(params) -> list[dict]:
  """A Transformer's stacked layer params as one pure dict per layer (separate buffers when
  returned from a jitted function), for `Transformer.decode(..., layers=)`."""
  stacked = nnx.to_pure_dict(params["layers"])
  depth = jax.tree.leaves(stacked)[0].shape[0]
  return [jax.tree.map(lambda w, i=i: w[i], stacked) for i in range(depth)]
