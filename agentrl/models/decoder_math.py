# pylint: disable=invalid-name
"""The pure per-layer math of `transformer.Transformer`: norms, RoPE, attention, one layer.

Inside the layer scan (or loop) the leading L axis of every parameter is gone; `cfg` is the
model's `transformer.Config`. Kept apart from the module classes so the math reads on its own.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels.attention import ops as attention_ops

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}
_MASKED = float(np.finfo(np.float32).min)  # finite: a row with no visible key stays finite


def rms_norm(cfg, x, scale):
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + cfg.norm_eps)
  scale = scale.reshape((1,) * (x.ndim - 1) + scale.shape)
  if cfg.norm_plus_one:  # Gemma multiplies in f32 before casting back
    return (y * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)
  return y.astype(x.dtype) * scale.astype(x.dtype)


def rope_inv_freq(cfg, local: bool) -> np.ndarray:
  """RoPE inverse frequencies [K/2], with the rescaling of the layer's kind (HF conventions)."""
  theta = cfg.rope_local_theta if local and cfg.rope_local_theta is not None else cfg.rope_theta
  exponents = np.arange(0, cfg.head_dim, 2, dtype=np.float32) / np.float32(cfg.head_dim)
  inv = (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)
  if (local and cfg.rope_local_theta is not None) or cfg.rope_scaling == "default":
    return inv
  if cfg.rope_scaling == "linear":
    return inv / np.float32(cfg.rope_factor)
  # Llama 3: keep high frequencies, divide low ones by `factor`, interpolate in between.
  low_wavelen = cfg.rope_original_max_len / cfg.rope_low_freq_factor
  high_wavelen = cfg.rope_original_max_len / cfg.rope_high_freq_factor
  wavelen = 2 * np.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / cfg.rope_factor, inv)
  smooth = ((cfg.rope_original_max_len / wavelen - cfg.rope_low_freq_factor)
            / (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor))
  smoothed = (1 - smooth) * scaled / cfg.rope_factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(cfg, positions_BT, local: bool):
  angle_BTk = positions_BT.astype(jnp.float32)[..., None] * rope_inv_freq(cfg, local)[None, None]
  return jnp.sin(angle_BTk), jnp.cos(angle_BTk)


def apply_rope(x_BTHK, sin_BTk, cos_BTk):
  # Rotates the two halves of each head (HF "rotate_half" layout, not interleaved pairs).
  x1, x2 = jnp.split(x_BTHK.astype(jnp.float32), 2, axis=-1)
  sin, cos = sin_BTk[:, :, None], cos_BTk[:, :, None]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BTHK.dtype)


def no_adapter(name, x, y):
  del name, x
  return y


def _project_qkv(cfg, p, x_BTD, sin_cos, adapt):
  dt = cfg.dtype
  proj = lambda name, w: adapt(name, x_BTD, jnp.einsum("btd,dhk->bthk", x_BTD, w.astype(dt)))
  q_BTHK, k_BTHK, v_BTHK = proj("q", p["q_LDHK"]), proj("k", p["k_LDHK"]), proj("v", p["v_LDHK"])
  if cfg.qkv_bias:
    q_BTHK = q_BTHK + p["q_bias_LHK"].astype(dt)[None, None]
    k_BTHK = k_BTHK + p["k_bias_LHK"].astype(dt)[None, None]
    v_BTHK = v_BTHK + p["v_bias_LHK"].astype(dt)[None, None]
  if cfg.qk_norm:
    q_BTHK = rms_norm(cfg, q_BTHK, p["q_norm_LK"])
    k_BTHK = rms_norm(cfg, k_BTHK, p["k_norm_LK"])
  return apply_rope(q_BTHK, *sin_cos), apply_rope(k_BTHK, *sin_cos), v_BTHK


def heads_first(x_BTGK):
  """[B, T, G, K] -> [B, G, T, K], the layout `_attend` and the KV cache keep keys/values in."""
  return jnp.swapaxes(x_BTGK, 1, 2)


# Config.attention: "xla" computes the [B, G, R, T, S] scores in float32 and keeps them for the
# backward pass; "fused" never stores them: chosen when the program is lowered for its
# platform (`lax.platform_dependent`, so an ahead-of-time compile for a TPU gets the TPU one),
# on a TPU the Pallas flash attention kernel, on a GPU in bfloat16 cuDNN's flash attention
# (`jax.nn.dot_product_attention`), elsewhere that function's XLA path (the same math as
# "xla"). It applies to cache-free forwards (training and scoring, T = S); decode steps keep
# "xla", and on a TPU so do sliding-window models and lengths not a multiple of TPU_BLOCK.
ATTENTIONS = ("xla", "fused")
TPU_BLOCK = 128   # the TPU kernel's sequence tile: T must be a multiple of it
# Config.decode_attention, for steps against the KV cache (`Transformer.decode`): "xla" is
# `_attend` over all S slots with the dense masks of `allowed`; "pallas" the flash-decoding
# kernel of kernels/attention, masked by `cache_masks` and reading only the slots up to the
# last new token (the Mosaic kernel on a TPU, the Triton one on a GPU, chosen when the program
# is lowered; the Mosaic kernel in interpret mode elsewhere: slow, for tests).
DECODE_ATTENTIONS = ("xla", "pallas")


def _attend_cudnn(q_BTHK, k_BGSK, v_BGSK, allowed_BTS, scale):
  """cuDNN's flash attention, per device under a mesh: its partitioner rejects the shardings
  GSPMD gives q and k/v ("Query, key and value should have same sharding")."""
  def kernel(q_BTHK, k_BSGK, v_BSGK, allowed_BTS):
    return jax.nn.dot_product_attention(q_BTHK, k_BSGK, v_BSGK, mask=allowed_BTS[:, None],
                                        scale=scale, implementation="cudnn")

  args = (q_BTHK, heads_first(k_BGSK), heads_first(v_BGSK), allowed_BTS)
  return _per_device(kernel, args, heads_axis=2, kv_heads=k_BGSK.shape[1])


def _attend_dot_product(q_BTHK, k_BGSK, v_BGSK, allowed_BTS, scale):
  return jax.nn.dot_product_attention(
      q_BTHK, heads_first(k_BGSK), heads_first(v_BGSK), mask=allowed_BTS[:, None],
      scale=scale, implementation="xla")


def attend_tpu_flash(q_BTHK, k_BGSK, v_BGSK, allowed_BTS, scale):
  """The Pallas TPU flash attention kernel for a causal mask over valid keys (what `allowed`
  gives a cache-free forward: key s visible to query t iff s <= t and s is a real token).

  Validity is the kernel's segment id (real tokens 1, padding 0), so real queries see only
  real keys; padding queries see padding (their outputs are never read). The R query heads of
  a KV head share it by repetition (the kernel has no grouped-query form). Under a mesh the
  kernel runs per device (`shard_map`: a Mosaic kernel is not partitioned automatically), rows
  split as the batch is and heads over `tensor` when it divides them.
  """
  from jax.experimental.pallas.ops.tpu import flash_attention  # pylint: disable=g-import-not-at-top
  h = q_BTHK.shape[2]
  r = h // k_BGSK.shape[1]
  valid_BT = jnp.diagonal(allowed_BTS, axis1=1, axis2=2).astype(jnp.int32)

  def kernel(q_BHTK, k_BHSK, v_BHSK, valid_BT):
    segments = flash_attention.SegmentIds(q=valid_BT, kv=valid_BT)
    return flash_attention.flash_attention(q_BHTK, k_BHSK, v_BHSK, segment_ids=segments,
                                           causal=True, sm_scale=scale)

  args = (heads_first(q_BTHK), jnp.repeat(k_BGSK, r, axis=1), jnp.repeat(v_BGSK, r, axis=1),
          valid_BT)
  return heads_first(_per_device(kernel, args, heads_axis=1, kv_heads=h))


def _per_device(kernel, args, *, heads_axis: int, kv_heads: int):
  """`kernel(q, k, v, mask)` under the ambient mesh's `shard_map` (a custom kernel is not
  partitioned automatically; without a mesh, called as is): rows split as the batch is, and
  the heads (axis `heads_axis` of q, k, v and the output) over `tensor` when it divides both
  q's and k/v's (`kv_heads`) head counts; the mask is split by rows only."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return kernel(*args)
  rows, heads = _mesh_split(mesh, args[0].shape[heads_axis], kv_heads)
  spec = jax.sharding.PartitionSpec(rows, *[None] * (heads_axis - 1), heads)
  return jax.shard_map(kernel, in_specs=(spec, spec, spec, jax.sharding.PartitionSpec(rows)),
                       out_specs=spec, check_vma=False)(*args)


def _mesh_split(mesh, heads: int, kv_heads: int):
  """(the row axes, "tensor" or None) a per-device kernel splits over: rows as the batch is,
  heads over `tensor` when it divides both head counts."""
  # Imported here: sharding imports the model modules.
  from agentrl import sharding  # pylint: disable=g-import-not-at-top
  size = lambda axis: mesh.shape.get(axis, 1)
  rows = tuple(a for a in sharding.ROWS if size(a) > 1) or None
  tensor = size("tensor")
  split = tensor > 1 and heads % tensor == 0 and kv_heads % tensor == 0
  return rows, "tensor" if split else None


def _decode_attention(cfg, q_BTHK, k_BGSK, v_BGSK, mask, scale):
  """The Pallas decode-attention kernel, per device under a mesh (`shard_map`: a Mosaic or
  Triton kernel is not partitioned automatically; left to GSPMD, the cache would be gathered
  to every device): rows split as the batch is, KV heads over `tensor` when it divides them."""
  def kernel(q_BTHK, k_BGSK, v_BGSK, mask):
    return attention_ops.decode_attention(q_BTHK, k_BGSK, v_BGSK, mask, scale=scale,
                                          softcap=cfg.attn_logit_softcap, impl="pallas")

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return kernel(q_BTHK, k_BGSK, v_BGSK, mask)
  P = jax.sharding.PartitionSpec
  rows, heads = _mesh_split(mesh, q_BTHK.shape[2], k_BGSK.shape[1])
  q_spec, kv_spec = P(rows, None, heads), P(rows, heads)
  mask_spec = attention_ops.CacheMask(q_pos_BT=P(rows), q_slot_T=P(), k_pos_BS=P(rows),
                                      kv_start_B=P(rows), window=P())
  return jax.shard_map(kernel, in_specs=(q_spec, kv_spec, kv_spec, mask_spec),
                       out_specs=q_spec, check_vma=False)(q_BTHK, k_BGSK, v_BGSK, mask)


def _attend_fused(cfg, q_BTHK, k_BGSK, v_BGSK, allowed_BTS, scale):
  t = q_BTHK.shape[1]
  bind = lambda fn: functools.partial(fn, scale=scale)   # a static float, not an operand
  branches = {}
  if not cfg.sliding_window and t % TPU_BLOCK == 0:
    branches["tpu"] = bind(attend_tpu_flash)
  # Traced only where cuDNN is (tracing it elsewhere fails); half precision only.
  if jax.default_backend() == "gpu" and q_BTHK.dtype in (jnp.bfloat16, jnp.float16):
    branches["cuda"] = bind(_attend_cudnn)
  args = (q_BTHK, k_BGSK, v_BGSK, allowed_BTS)
  if not branches:
    return bind(_attend_dot_product)(*args)
  return jax.lax.platform_dependent(*args, default=bind(_attend_dot_product), **branches)


def _attend(cfg, q_BTHK, k_BGSK, v_BGSK, allowed_BTS):
  """Softmax attention; G is the KV-head count and R = H / G query heads share each KV head.

  allowed_BTS is a dense mask, or a `CacheMask` (`cache_masks`) for the Pallas decode kernel.
  """
  b, t, h, k = q_BTHK.shape
  g = k_BGSK.shape[1]
  scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
  if isinstance(allowed_BTS, attention_ops.CacheMask):
    return _decode_attention(cfg, q_BTHK, k_BGSK, v_BGSK, allowed_BTS, scale)
  if cfg.attention == "fused" and t == k_BGSK.shape[2]:
    return _attend_fused(cfg, q_BTHK, k_BGSK, v_BGSK, allowed_BTS, scale)
  q_BTGRK = q_BTHK.reshape(b, t, g, h // g, k)
  s_BGRTS = jnp.einsum("btgrk,bgsk->bgrts", q_BTGRK, k_BGSK,
                       preferred_element_type=jnp.float32) * scale
  if cfg.attn_logit_softcap:
    s_BGRTS = cfg.attn_logit_softcap * jnp.tanh(s_BGRTS / cfg.attn_logit_softcap)
  s_BGRTS = jnp.where(allowed_BTS[:, None, None], s_BGRTS, _MASKED)
  p_BGRTS = jax.nn.softmax(s_BGRTS, axis=-1).astype(v_BGSK.dtype)
  o_BTGRK = jnp.einsum("bgrts,bgsk->btgrk", p_BGRTS, v_BGSK)
  return o_BTGRK.reshape(b, t, h, k)


def layer(cfg, p, x_BTD, sin_cos, allowed_BTS, kv_fn, adapt=no_adapter):
  """One pre-norm decoder layer. kv_fn maps this step's (k, v) [B, T, G, K] to all visible
  (k, v) [B, G, S, K];
  adapt(name, x, y) may add a term to each projection y = x W (see `Transformer.hidden`)."""
  dt = cfg.dtype
  a, m = p["attn"], p["mlp"]
  h_BTD = rms_norm(cfg, x_BTD, p["pre_attn_norm_LD"])
  q_BTHK, k_BTGK, v_BTGK = _project_qkv(cfg, a, h_BTD, sin_cos, adapt)
  k_BGSK, v_BGSK = kv_fn(k_BTGK, v_BTGK)
  o_BTHK = _attend(cfg, q_BTHK, k_BGSK, v_BGSK, allowed_BTS)
  h_BTD = adapt("o", o_BTHK, jnp.einsum("bthk,hkd->btd", o_BTHK, a["o_LHKD"].astype(dt)))
  if cfg.post_norms:
    h_BTD = rms_norm(cfg, h_BTD, p["post_attn_norm_LD"])
  x_BTD = x_BTD + h_BTD
  h_BTD = rms_norm(cfg, x_BTD, p["pre_mlp_norm_LD"])
  gate_BTF = adapt("gate", h_BTD, jnp.einsum("btd,df->btf", h_BTD, m["gate_LDF"].astype(dt)))
  up_BTF = adapt("up", h_BTD, jnp.einsum("btd,df->btf", h_BTD, m["up_LDF"].astype(dt)))
  g_BTF = ACTIVATIONS[cfg.act](gate_BTF) * up_BTF
  h_BTD = adapt("down", g_BTF, jnp.einsum("btf,fd->btd", g_BTF, m["down_LFD"].astype(dt)))
  if cfg.post_norms:
    h_BTD = rms_norm(cfg, h_BTD, p["post_mlp_norm_LD"])
  return x_BTD + h_BTD


def allowed(cfg, q_pos_BT, k_pos_BS, q_slot_T, k_valid_BS):
  """(global, local) [B, T, S] masks of which slots each new token may attend to."""
  k_slot_S = jnp.arange(k_valid_BS.shape[1], dtype=jnp.int32)
  causal_BTS = (k_slot_S[None, None, :] <= q_slot_T[None, :, None]) & k_valid_BS[:, None, :]
  if cfg.sliding_window is None:
    return causal_BTS, causal_BTS
  near_BTS = (q_pos_BT[:, :, None] - k_pos_BS[:, None, :]) < cfg.sliding_window
  return causal_BTS, causal_BTS & near_BTS


def cache_masks(cfg, q_pos_BT, k_pos_BS, q_slot_T, k_valid_BS):
  """`allowed`'s (global, local) masks as `CacheMask`s: the factors, not [B, T, S] arrays.

  The two share every array but the window, so picking one per layer copies nothing.
  """
  mask = attention_ops.cache_mask(q_pos_BT, q_slot_T, k_pos_BS, k_valid_BS)
  if cfg.sliding_window is None:
    return mask, mask
  return mask, mask._replace(window=jnp.asarray(cfg.sliding_window, jnp.int32))
