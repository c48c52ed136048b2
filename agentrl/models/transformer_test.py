# pylint: disable=invalid-name
"""Tests of the decoder: preset sizes, KV-cache decoding, causality, dtypes, sharding names."""
import dataclasses
import functools
import re
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.models import decoder_math
from agentrl.models import presets
from agentrl.models import testing
from agentrl.models import transformer
from kernels.attention import ops as attention_ops

jax.config.update("jax_numpy_rank_promotion", "raise")

# Every family feature at once: sliding windows with a local RoPE base, soft-caps, q/k norm,
# q/k/v biases, post-norms, (1 + w) norms, scaled embeddings, GeGLU, untied unembedding.
KITCHEN_SINK = dict(sliding_window=3, sliding_window_pattern=2, rope_local_theta=100.0,
                    rope_scaling="linear", rope_factor=2.0, attn_logit_softcap=5.0,
                    final_logit_softcap=3.0, qk_norm=True, qkv_bias=True, post_norms=True,
                    norm_plus_one=True, embed_scale=True, act="gelu_tanh",
                    query_pre_attn_scalar=24.0, tie_embeddings=False)


def _left_padded_batch(vocab, seed=0):
  mask_BT = np.ones((3, 9), bool)
  mask_BT[1, :2] = False
  mask_BT[2, :6] = False
  tokens_BT = np.where(mask_BT, np.random.default_rng(seed).integers(0, vocab, (3, 9)), 0)
  positions_BT = np.maximum(np.cumsum(mask_BT, axis=1) - 1, 0)
  return jnp.asarray(tokens_BT, jnp.int32), jnp.asarray(positions_BT, jnp.int32), jnp.asarray(
      mask_BT)


def _num_params(cfg):
  model = nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


class ConfigTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(presets.PUBLISHED_PARAMS))
  def test_preset_parameter_count_matches_release(self, name):
    self.assertEqual(_num_params(transformer.Config.named(name)), presets.PUBLISHED_PARAMS[name])

  def test_rounded_published_counts(self):
    for name, (total_b, non_embed_b) in presets.PUBLISHED_PARAMS_ROUNDED.items():
      cfg = transformer.Config.named(name)
      total = _num_params(cfg)
      self.assertAlmostEqual(total / 1e9, total_b, delta=0.005)
      self.assertAlmostEqual((total - cfg.vocab * cfg.width) / 1e9, non_embed_b, delta=0.005)

  def test_every_preset_builds_abstractly(self):
    for name in presets.PRESETS:
      self.assertGreater(_num_params(transformer.Config.named(name)), 0)

  def test_named_overrides_and_errors(self):
    cfg = transformer.Config.named("tiny", depth=3, dtype="bfloat16")
    self.assertEqual((cfg.depth, cfg.dtype), (3, jnp.bfloat16))
    with self.assertRaisesRegex(ValueError, "Unknown model preset 'nope'"):
      transformer.Config.named("nope")
    with self.assertRaisesRegex(ValueError, r"Unknown Config field\(s\) \['widht'\]"):
      transformer.Config.named("tiny", widht=3)
    with self.assertRaisesRegex(ValueError, "kv_heads=3"):
      transformer.Config.named("tiny", kv_heads=3)
    with self.assertRaisesRegex(ValueError, "family='gpt2'"):
      transformer.Config.named("tiny", family="gpt2")

  def test_local_layer_pattern(self):
    cfg = transformer.Config.named("gemma-3-1b")
    self.assertEqual(cfg.local_layers[:6], (True,) * 5 + (False,))
    self.assertEqual(sum(cfg.local_layers), 26 - 4)
    self.assertFalse(any(transformer.Config.named("tiny").local_layers))

  def test_llama3_rope_rescales_only_low_frequencies(self):
    cfg = transformer.Config.named("llama-3.1-8b")
    plain = dataclasses.replace(cfg, rope_scaling="default")
    ratio = decoder_math.rope_inv_freq(plain, False) / decoder_math.rope_inv_freq(cfg, False)
    np.testing.assert_allclose(ratio[:20], 1.0)      # wavelength < 8192 / 4: untouched
    np.testing.assert_allclose(ratio[-10:], 8.0, rtol=1e-6)  # wavelength > 8192: / factor
    self.assertNotEmpty(ratio[(ratio > 1.0 + 1e-3) & (ratio < 8.0 - 1e-3)])  # smoothed band


class TransformerTest(parameterized.TestCase):

  @parameterized.product(per_layer=(False, True), decode_attention=("xla", "pallas"))
  def test_kv_cache_decode_matches_full_forward(self, per_layer, decode_attention):
    # per_layer: the rollout engine's CPU path, per-layer weights and per-layer cache buffers.
    # decode_attention="pallas": the Pallas decode kernel (here interpreted) against the full
    # forward's XLA attention, with grouped-query heads, soft-caps and sliding windows.
    cfg = transformer.Config.named("tiny", decode_attention=decode_attention, **KITCHEN_SINK)
    graphdef, params = testing.random_params(cfg)
    tokens_BT, positions_BT, mask_BT = _left_padded_batch(cfg.vocab)

    @jax.jit
    def run(params):
      m = nnx.merge(graphdef, params)
      full_BTV = m(tokens_BT, positions_BT, mask_BT)
      alone_BTV = m(tokens_BT[2:, 6:], positions_BT[2:, 6:], mask_BT[2:, 6:])
      cache = transformer.init_cache(cfg, 3, 12, per_layer=per_layer)
      layers = transformer.unstack_layers(params) if per_layer else None
      # Prefill 6 tokens, a 2-token chunk, then a single token (the sampler's pattern).
      chunks = []
      for lo, hi in [(0, 6), (6, 8), (8, 9)]:
        out_BTV, cache = m.decode(tokens_BT[:, lo:hi], positions_BT[:, lo:hi],
                                  mask_BT[:, lo:hi], cache, lo, layers=layers)
        chunks.append(out_BTV)
      return full_BTV, alone_BTV, jnp.concatenate(chunks, axis=1), cache

    full_BTV, alone_BTV, decoded_BTV, cache = run(params)
    self.assertEqual(full_BTV.dtype, jnp.float32)
    mask = np.asarray(mask_BT)
    np.testing.assert_allclose(decoded_BTV[mask], full_BTV[mask], atol=2e-5, rtol=1e-5)
    np.testing.assert_array_equal(cache.valid_BS[:, :9], mask)
    np.testing.assert_array_equal(cache.pos_BS[:, :9], positions_BT)
    self.assertFalse(cache.valid_BS[:, 9:].any())
    k_LBGSK = jnp.stack(cache.k_LBGSK) if per_layer else cache.k_LBGSK
    self.assertEqual(k_LBGSK.shape, (cfg.depth, 3, cfg.kv_heads, 12, cfg.head_dim))
    self.assertTrue(bool(jnp.all(k_LBGSK[:, :, :, 9:] == 0)))   # nothing past the last write
    # Not vacuous: rows differ, and padding changes nothing for the real tokens of row 2.
    self.assertGreater(float(jnp.abs(full_BTV[0, -1] - full_BTV[1, -1]).max()), 1e-3)
    np.testing.assert_allclose(alone_BTV[0], full_BTV[2, 6:], atol=2e-5, rtol=1e-5)

  def test_pallas_decode_runs_per_device_under_a_mesh(self):
    # Rows over data, KV heads over tensor: the kernel under shard_map gives the single-device
    # result (GSPMD cannot partition a custom kernel; shard_map runs it on each shard).
    if jax.device_count() < 4:
      self.skipTest("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    cfg = transformer.Config.named("tiny", decode_attention="pallas", kv_heads=2)
    graphdef, params = testing.random_params(cfg)
    tokens_BT, positions_BT, mask_BT = _left_padded_batch(cfg.vocab)
    tokens_BT, positions_BT, mask_BT = (jnp.concatenate([x, x[:1]]) for x in
                                        (tokens_BT, positions_BT, mask_BT))   # 4 rows

    def run(params):
      m = nnx.merge(graphdef, params)
      cache = transformer.init_cache(cfg, 4, 12)
      _, cache = m.decode(tokens_BT[:, :8], positions_BT[:, :8], mask_BT[:, :8], cache, 0)
      return m.decode(tokens_BT[:, 8:9], positions_BT[:, 8:9], mask_BT[:, 8:9], cache, 8)[0]

    alone = jax.jit(run)(params)
    mesh = jax.make_mesh((2, 1, 2), ("data", "fsdp", "tensor"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh):
      meshed = jax.jit(run)(params)
      lowered = jax.jit(run).lower(params).as_text()
    self.assertTrue(re.search("manual_computation|shard_map", lowered), "no per-device kernel")
    np.testing.assert_allclose(meshed, alone, atol=2e-5, rtol=1e-5)

  def test_per_layer_cache_needs_per_layer_weights(self):
    cfg = transformer.Config.named("tiny")
    graphdef, params = testing.random_params(cfg)
    tokens_BT = jnp.zeros((1, 2), jnp.int32)
    with self.assertRaisesRegex(ValueError, "per-layer KV cache needs"):
      nnx.merge(graphdef, params).decode(tokens_BT, jnp.arange(2)[None], None,
                                         transformer.init_cache(cfg, 1, 4, per_layer=True), 0)

  def test_causality_by_gradient(self):
    # Untied, with distinct tokens: embedding row tokens[s] only feeds position s, so the
    # gradient of the logits at t with respect to it is zero exactly when s > t or s is pad.
    cfg = transformer.Config.named("tiny", **KITCHEN_SINK)
    graphdef, params = testing.random_params(cfg, seed=1)
    tokens_BT = jnp.arange(10, 18, dtype=jnp.int32)[None]
    mask_BT = jnp.array([[False, True, True, True, True, True, True, True]])
    positions_BT = jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0)

    def grads(params, t):
      def f(params):
        return nnx.merge(graphdef, params)(tokens_BT, positions_BT, mask_BT)[0, t].sum()
      g_VD = jax.grad(f)(params)["embedding_VD"][...]
      return jnp.abs(g_VD[tokens_BT[0]]).sum(-1)

    g = jax.jit(grads)
    for t in (3, 6):
      per_pos = np.asarray(g(params, t))
      np.testing.assert_array_equal(per_pos[t + 1:], 0.0)
      self.assertEqual(per_pos[0], 0.0)                     # padding
      self.assertTrue(np.all(per_pos[1:t + 1] > 0.0))       # real past and present tokens

  def test_remat_checkpoints_each_layer(self):
    def loss(cfg):
      graphdef, params = testing.random_params(cfg)
      f = lambda p: nnx.merge(graphdef, p)(jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4))).sum()
      return str(jax.make_jaxpr(jax.grad(f))(params))
    cfg = transformer.Config.named("tiny")
    # The primitive prints as remat2 (jax 0.10) or checkpoint, depending on the version.
    self.assertRegex(loss(dataclasses.replace(cfg, remat=True)), r"\b(remat2?|checkpoint)\[")
    self.assertNotRegex(loss(cfg), r"\b(remat2?|checkpoint)\[")

  def test_unrolled_layers_match_the_scan(self):
    cfg = transformer.Config.named("tiny", depth=3, sliding_window=2, sliding_window_pattern=2)
    graphdef, params = testing.random_params(cfg)
    tokens_BT = jax.random.randint(jax.random.key(1), (2, 5), 0, cfg.vocab)
    mask_BT = jnp.ones((2, 5), bool).at[1, 3:].set(False)

    def value_and_grad(unroll):
      gd = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(
          dataclasses.replace(cfg, unroll_layers=unroll), rngs=nnx.Rngs(0))))[0]
      positions_BT = jnp.broadcast_to(jnp.arange(5), (2, 5))
      f = lambda p: (nnx.merge(gd, p)(tokens_BT, positions_BT, mask_BT) ** 2).sum()
      jaxpr = str(jax.make_jaxpr(f)(params))
      return jax.jit(jax.value_and_grad(f))(params), "scan[" in jaxpr

    (looped, looped_g), looped_has_scan = value_and_grad(True)
    (scanned, scanned_g), scanned_has_scan = value_and_grad(False)
    self.assertFalse(looped_has_scan)
    self.assertTrue(scanned_has_scan)
    np.testing.assert_allclose(looped, scanned, rtol=1e-6)
    # f32 sums in a different order: gradients of size ~10-30 differ by ~1e-5.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4),
                 looped_g, scanned_g)

  @parameterized.parameters(dict(sliding_window=3, sliding_window_pattern=2),
                            dict(sliding_window=None))
  def test_fused_attention_matches_xla(self, **window):
    # GQA (4 query heads on 2 KV heads), sliding windows or not (without, the platform-
    # dependent choice: XLA's branch on a CPU), a custom scale and left padding (fully masked
    # query rows); values and every gradient agree.
    cfg = transformer.Config.named("tiny", query_pre_attn_scalar=24.0, qkv_bias=True, **window)
    graphdef, params = testing.random_params(cfg)
    tokens_BT, positions_BT, mask_BT = _left_padded_batch(cfg.vocab)
    weights_BT = mask_BT[:, :, None]

    def value_and_grad(attention):
      gd = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(
          dataclasses.replace(cfg, attention=attention), rngs=nnx.Rngs(0))))[0]
      f = lambda p: (weights_BT * nnx.merge(gd, p)(tokens_BT, positions_BT, mask_BT)).sum()
      with mock.patch.object(jax.nn, "dot_product_attention",
                             wraps=jax.nn.dot_product_attention) as fused_op:
        out = jax.jit(jax.value_and_grad(f))(params)
      return out, fused_op.call_count

    (fused, fused_g), fused_calls = value_and_grad("fused")
    (xla, xla_g), xla_calls = value_and_grad("xla")
    self.assertEqual((fused_calls, xla_calls), (1, 0))   # traced once: the layer scan's body
    np.testing.assert_allclose(fused, xla, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4),
                 fused_g, xla_g)

  def test_tpu_flash_attention_matches_xla_in_interpret_mode(self):
    # The TPU branch of attention="fused" (Pallas flash attention), run by Pallas's TPU
    # interpreter on this CPU: grouped-query heads, left padding; values and gradients at the
    # real tokens agree with the XLA path.
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
    cfg = transformer.Config.named("tiny", heads=2, kv_heads=1, head_dim=32)
    T = 128
    keys = jax.random.split(jax.random.key(0), 3)
    q_BTHK = jax.random.normal(keys[0], (1, T, 2, 32))
    k_BGSK, v_BGSK = (jax.random.normal(k, (1, 1, T, 32)) for k in keys[1:])
    valid_BT = jnp.arange(T)[None, :] >= 37     # 37 pads on the left
    slots = jnp.arange(T, dtype=jnp.int32)
    allowed_BTS = decoder_math.allowed(cfg, None, None, slots, valid_BT)[0]
    scale = cfg.head_dim ** -0.5
    weights_BT1 = valid_BT[:, :, None, None]

    def loss(attend, q, k, v):
      return (weights_BT1 * attend(q, k, v) ** 2).sum()

    xla = lambda q, k, v: jax.nn.dot_product_attention(
        q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), mask=allowed_BTS[:, None],
        scale=scale, implementation="xla")
    flash = lambda q, k, v: decoder_math.attend_tpu_flash(q, k, v, allowed_BTS, scale)
    want, want_g = jax.value_and_grad(functools.partial(loss, xla), (0, 1, 2))(
        q_BTHK, k_BGSK, v_BGSK)
    with pltpu.force_tpu_interpret_mode():
      got, got_g = jax.value_and_grad(functools.partial(loss, flash), (0, 1, 2))(
          q_BTHK, k_BGSK, v_BGSK)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    for a, b in zip(got_g, want_g):
      np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)

  def test_fused_attention_chooses_by_platform_at_tile_lengths(self):
    # At a multiple of the TPU tile the TPU kernel is staged out beside XLA's path and the
    # lowering platform picks (this CPU: XLA's, equal to attention="xla").
    cfg = transformer.Config.named("tiny")
    graphdef, params = testing.random_params(cfg)
    tokens_BT = jax.random.randint(jax.random.key(4), (1, decoder_math.TPU_BLOCK), 0, cfg.vocab)
    positions_BT = jnp.arange(decoder_math.TPU_BLOCK)[None]

    def logits(attention):
      gd = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(
          dataclasses.replace(cfg, attention=attention), rngs=nnx.Rngs(0))))[0]
      f = lambda p: nnx.merge(gd, p)(tokens_BT, positions_BT)
      return jax.jit(f)(params), str(jax.make_jaxpr(f)(params))

    (fused, fused_jaxpr), (xla, xla_jaxpr) = logits("fused"), logits("xla")
    self.assertIn("platform_index", fused_jaxpr)
    self.assertNotIn("platform_index", xla_jaxpr)
    np.testing.assert_allclose(fused, xla, rtol=1e-5, atol=1e-5)

  def test_cache_masks_are_the_dense_masks(self):
    # What the Pallas decode kernel is given (Config.decode_attention="pallas") stands for the
    # masks the XLA path applies: a row with a hole, a left-padded row, a sliding window.
    cfg = transformer.Config.named("tiny", sliding_window=3, sliding_window_pattern=2)
    valid_BS = np.ones((2, 10), bool)
    valid_BS[0, 3:5] = False
    valid_BS[1, :4] = False
    pos_BS = jnp.asarray(np.maximum(np.cumsum(valid_BS, axis=1) - 1, 0), jnp.int32)
    slot_T = jnp.arange(6, 8, dtype=jnp.int32)
    args = (cfg, pos_BS[:, 6:8], pos_BS, slot_T, jnp.asarray(valid_BS))
    for dense_BTS, factored in zip(decoder_math.allowed(*args), decoder_math.cache_masks(*args)):
      np.testing.assert_array_equal(attention_ops.dense_mask(factored, 10), dense_BTS)
    self.assertEqual(attention_ops.kv_len(factored, 10), 8)   # slots 8, 9 are never read

  def test_decode_attention_config_error(self):
    with self.assertRaisesRegex(ValueError, "decode_attention='flash'; expected one of"):
      transformer.Config.named("tiny", decode_attention="flash")

  def test_fused_attention_config_errors(self):
    with self.assertRaisesRegex(ValueError, "attention='flash'; expected one of"):
      transformer.Config.named("tiny", attention="flash")
    with self.assertRaisesRegex(ValueError, "no logit soft-capping"):
      transformer.Config.named("tiny", attention="fused", attn_logit_softcap=5.0)

  def test_dtypes(self):
    cfg = transformer.Config.named("tiny", param_dtype="bfloat16", dtype="bfloat16")
    model = nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
    self.assertEqual(nnx.to_pure_dict(nnx.state(model))["layers"]["attn"]["q_LDHK"].dtype,
                     jnp.bfloat16)
    tokens_BT = jnp.zeros((1, 4), jnp.int32)
    positions_BT = jnp.arange(4)[None]
    graphdef, params = nnx.split(model)
    call = lambda method: jax.eval_shape(
        lambda p: getattr(nnx.merge(graphdef, p), method)(tokens_BT, positions_BT), params)
    logits_BTV = call("__call__")
    self.assertEqual(logits_BTV.dtype, jnp.float32)
    self.assertEqual(logits_BTV.shape, (1, 4, cfg.vocab))
    self.assertEqual(call("hidden").dtype, jnp.bfloat16)
    self.assertEqual(jax.eval_shape(lambda p: nnx.merge(graphdef, p).unembed_DV(), params).shape,
                     (cfg.width, cfg.vocab))
    self.assertEqual(transformer.init_cache(cfg, 2, 8).k_LBGSK.shape, (2, 2, 2, 8, 16))

  def test_logical_axis_names_shard_on_a_mesh(self):
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
    rules = [("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("vocab", "tensor"),
             ("kv_heads", None), ("head_dim", None), ("layers", None)]
    cfg = transformer.Config.named("tiny", tie_embeddings=False)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
      abstract = nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
      specs = nnx.get_named_sharding(nnx.state(abstract, nnx.Param), mesh)
    P = jax.sharding.PartitionSpec
    self.assertEqual(specs["embedding_VD"].spec, P("tensor", "fsdp"))
    self.assertEqual(specs["lm_head_DV"].spec, P("fsdp", "tensor"))
    self.assertEqual(specs["layers"]["mlp"]["up_LDF"].spec, P(None, "fsdp", "tensor"))
    self.assertEqual(specs["layers"]["attn"]["q_LDHK"].spec, P(None, "fsdp", "tensor", None))


if __name__ == "__main__":
  absltest.main()
