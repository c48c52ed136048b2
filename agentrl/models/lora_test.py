# pylint: disable=invalid-name
"""Tests of agentrl.models.lora: init, forward, merge, frozen base, optimizer, resume, sharding.

Golden facts come from PEFT (huggingface/peft @ 5d602fdb, src/peft/tuners/lora/layer.py:
lora_A ~ kaiming_uniform_(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), lora_B = 0, scaling =
lora_alpha / r, result + lora_B(lora_A(dropout(x))) * scaling) and verl (volcengine/verl @
b178a3cd, verl/trainer/config/model/hf_model.yaml: lora_alpha 16, all-linear targets).
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import math  # pylint: disable=g-import-not-at-top,wrong-import-position
import shutil
import tempfile

from absl.testing import absltest
from flax import nnx
import jax
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import optax

from agentrl.advantages import estimators
from agentrl import checkpoint
from agentrl.data import generators
from agentrl.data import stream
from agentrl.models import lora
from agentrl.models import policy
from agentrl.models import testing
from agentrl.models import transformer
from agentrl.records import metrics
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

jax.config.update("jax_numpy_rank_promotion", "raise")

CFG = transformer.Config.named("tiny", vocab=16, width=16, depth=2, heads=2, kv_heads=1,
                               head_dim=4, mlp=24, qkv_bias=True, dtype="float32")
SPEC = lora.LoraConfig(rank=2, alpha=4.0)
B, G, T = 8, 4, 6


def _lora(spec=SPEC, noise: float = 0.0, seed: int = 1):
  """(graphdef, params) of a LoraTransformer over random base params; B ~ noise * N(0, 1)."""
  graphdef, params = testing.random_params(CFG)
  adapters = lora.Adapters(CFG, spec, rngs=nnx.Rngs(seed))
  ad_def, ad = nnx.split(adapters)
  if noise:
    rng = np.random.default_rng(seed)
    ad = jax.tree_util.tree_map_with_path(
        lambda path, x: x + noise * rng.standard_normal(x.shape).astype(np.float32)
        if "_b_" in jax.tree_util.keystr(path) else x, ad)
  return (graphdef, params), lora.attach(graphdef, params, ad_def, ad)


def _tokens(seed: int = 0):
  tokens_BT = jnp.asarray(np.random.default_rng(seed).integers(0, CFG.vocab, (B, T)), jnp.int32)
  mask_BT = jnp.ones((B, T), bool).at[1, :2].set(False)  # one left-padded row
  return tokens_BT, jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0), mask_BT


def _nbytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


class ConfigAndInitTest(absltest.TestCase):

  def test_bad_configs_are_named(self):
    for kwargs, message in [(dict(rank=0), "rank=0"), (dict(rank=2, alpha=0.0), "alpha"),
                            (dict(rank=2, targets=("q", "x")), "targets"),
                            (dict(rank=2, targets=("q", "q")), "targets"),
                            (dict(rank=2, dropout=1.0), "dropout")]:
      with self.assertRaisesRegex(ValueError, message):
        lora.LoraConfig(**kwargs)
    self.assertEqual(lora.LoraConfig(rank=8).scale, 2.0)  # verl's alpha 16 at rank 8

  def test_shapes_names_and_peft_init(self):
    state = nnx.state(lora.Adapters(CFG, lora.LoraConfig(rank=3, targets=("q", "o", "down")),
                                    rngs=nnx.Rngs(0)))
    shapes = {k: (v.shape, v.dtype, tuple(v.get_metadata()["out_sharding"]))
              for k, v in state.items()}
    f32 = jnp.float32
    self.assertEqual(shapes, {
        "q_a_LDR": ((2, 16, 3), f32, ("layers", "embed", "lora_rank")),
        "q_b_LRHK": ((2, 3, 2, 4), f32, ("layers", "lora_rank", "heads", "head_dim")),
        "o_a_LHKR": ((2, 2, 4, 3), f32, ("layers", "heads", "head_dim", "lora_rank")),
        "o_b_LRD": ((2, 3, 16), f32, ("layers", "lora_rank", "embed")),
        "down_a_LFR": ((2, 24, 3), f32, ("layers", "mlp", "lora_rank")),
        "down_b_LRD": ((2, 3, 16), f32, ("layers", "lora_rank", "embed"))})
    for name, fan_in in (("q_a_LDR", 16), ("o_a_LHKR", 8), ("down_a_LFR", 24)):
      a = np.asarray(state[name][...])
      self.assertLessEqual(np.abs(a).max(), 1 / math.sqrt(fan_in))  # PEFT's bound
      self.assertGreater(np.abs(a).max(), 0.5 / math.sqrt(fan_in))
    for name in ("q_b_LRHK", "o_b_LRD", "down_b_LRD"):
      np.testing.assert_array_equal(state[name][...], 0.0)


class ForwardTest(absltest.TestCase):

  def test_adapter_term_golden(self):
    # y + (alpha / r) x A B by hand: x = [1, 2], A = [[1, 0], [0, 1]], B = [[1], [-1]]:
    # x A = [1, 2], x A B = 1 - 2 = -1, scale 4 / 2 = 2, y = 10 -> 10 + 2 * -1 = 8.
    p = {"up_a_LDR": jnp.eye(2), "up_b_LRF": jnp.array([[1.0], [-1.0]])}
    got = lora._adapt(lora.LoraConfig(rank=2, alpha=4.0, targets=("up",)), jnp.float32, None,
                      p, 0, "up", jnp.array([[[1.0, 2.0]]]), jnp.array([[[10.0]]]))
    np.testing.assert_array_equal(got, [[[8.0]]])

  def test_step_zero_is_the_base_model_exactly(self):
    (base_def, base), (graphdef, params) = _lora()
    tokens_BT, positions_BT, mask_BT = _tokens()
    want = nnx.merge(base_def, base)(tokens_BT, positions_BT, mask_BT)
    got = nnx.merge(graphdef, params)(tokens_BT, positions_BT, mask_BT)
    np.testing.assert_array_equal(got, want)
    want_logp = policy.token_logprobs(nnx.merge(base_def, base), tokens_BT, positions_BT,
                                      mask_BT)
    got_logp = policy.token_logprobs(nnx.merge(graphdef, params), tokens_BT, positions_BT,
                                     mask_BT)
    np.testing.assert_array_equal(got_logp, want_logp)
    # Dropout acts on the adapter's input only, so with B = 0 it changes nothing either.
    dropped = lora.LoraConfig(rank=2, alpha=4.0, dropout=0.5)
    _, (graphdef, params) = _lora(dropped)
    with lora.dropout_key(jax.random.key(3)):
      np.testing.assert_array_equal(nnx.merge(graphdef, params)(tokens_BT, positions_BT,
                                                                mask_BT), want)

  def test_merged_weights_equal_the_adapter_forward(self):
    (base_def, base), (graphdef, params) = _lora(noise=0.5)
    tokens_BT, positions_BT, mask_BT = _tokens()
    adapted = nnx.merge(graphdef, params)(tokens_BT, positions_BT, mask_BT)
    self.assertGreater(float(jnp.abs(adapted - nnx.merge(base_def, base)(
        tokens_BT, positions_BT, mask_BT)).max()), 0.1)  # the adapters matter
    merged_def, merged = lora.merge(graphdef, params)
    np.testing.assert_allclose(nnx.merge(merged_def, merged)(tokens_BT, positions_BT, mask_BT),
                               adapted, atol=1e-5)
    # An independent NumPy fold of one weight: W + (alpha / r) A B per layer.
    pure, ad = nnx.to_pure_dict(base), nnx.to_pure_dict(params["lora"])
    want = (np.asarray(pure["layers"]["mlp"]["down_LFD"])
            + 2.0 * np.einsum("lfr,lrd->lfd", ad["down_a_LFR"], ad["down_b_LRD"]))
    np.testing.assert_allclose(nnx.to_pure_dict(merged)["layers"]["mlp"]["down_LFD"], want,
                               atol=1e-6)
    # The caller's params are untouched and the KV-cache decode agrees with the full forward.
    np.testing.assert_array_equal(nnx.to_pure_dict(params["base"])["layers"]["mlp"]["down_LFD"],
                                  pure["layers"]["mlp"]["down_LFD"])
    cache = transformer.init_cache(CFG, B, T)
    decoded, _ = nnx.merge(graphdef, params).decode(tokens_BT, positions_BT, mask_BT, cache, 0)
    np.testing.assert_allclose(decoded, adapted, atol=1e-5)

  def test_only_the_targets_are_adapted(self):
    spec = lora.LoraConfig(rank=2, alpha=4.0, targets=("v", "gate"))
    _, (graphdef, params) = _lora(spec, noise=0.5)
    self.assertEqual(sorted(params["lora"].keys()),
                     ["gate_a_LDR", "gate_b_LRF", "v_a_LDR", "v_b_LRHK"])
    merged_def, merged = lora.merge(graphdef, params)
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), nnx.to_pure_dict(merged),
                           nnx.to_pure_dict(params["base"]))
    self.assertEqual(sorted(k for k, v in changed["layers"]["attn"].items() if v), ["v_LDHK"])
    self.assertEqual(sorted(k for k, v in changed["layers"]["mlp"].items() if v), ["gate_LDF"])
    tokens = _tokens()
    np.testing.assert_allclose(nnx.merge(merged_def, merged)(*tokens),
                               nnx.merge(graphdef, params)(*tokens), atol=1e-5)

  def test_dropout_is_deterministic_given_a_key_and_training_only(self):
    spec = lora.LoraConfig(rank=2, alpha=4.0, dropout=0.5)
    _, (graphdef, params) = _lora(spec, noise=0.5)
    tokens = _tokens()
    run = jax.jit(lambda p, key: _forward_with_dropout(graphdef, p, key, tokens))
    plain = nnx.merge(graphdef, params)(*tokens)
    first, again = run(params, jax.random.key(0)), run(params, jax.random.key(0))
    np.testing.assert_array_equal(first, again)
    self.assertGreater(float(jnp.abs(first - plain).max()), 1e-3)
    self.assertGreater(float(jnp.abs(first - run(params, jax.random.key(1))).max()), 1e-3)
    np.testing.assert_array_equal(nnx.merge(graphdef, params)(*tokens), plain)  # outside: none


def _forward_with_dropout(graphdef, params, key, tokens):
  with lora.dropout_key(key):
    return nnx.merge(graphdef, params)(*tokens)


def _pg_loss(graphdef):
  """A REINFORCE loss on the batch's advantages, for update steps."""

  def loss_fn(params, batch):
    logp_BT = policy.token_logprobs(nnx.merge(graphdef, params), batch.tokens_BT,
                                    batch.positions_BT, batch.input_mask_BT)
    loss = -(batch.adv_BT * logp_BT * batch.loss_mask_BT).sum() / batch.loss_mask_BT.sum()
    return loss, {"loss": loss}

  return loss_fn


def _batch(seed: int) -> types.Batch:
  tokens_BT, positions_BT, mask_BT = _tokens(seed)
  reward_B = (tokens_BT[:, -1] % 2).astype(jnp.float32)
  loss_BT = jnp.zeros((B, T)).at[:, 3:].set(1.0)
  adv_B = estimators.grpo(reward_B, group_size=G)
  return types.Batch(tokens_BT=tokens_BT, positions_BT=positions_BT, input_mask_BT=mask_BT,
                     loss_mask_BT=loss_BT, reward_B=reward_B, adv_BT=adv_B[:, None] * loss_BT)


class TrainingTest(absltest.TestCase):

  def test_only_adapters_train_and_the_optimizer_state_is_theirs(self):
    _, (graphdef, params) = _lora()
    grads = jax.grad(lambda p, b: _pg_loss(graphdef)(p, b)[0])(params, _batch(0))
    for leaf in jax.tree.leaves(grads["base"]):  # stop_gradient at the base weights
      np.testing.assert_array_equal(leaf, 0.0)
    self.assertGreater(max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads["lora"])), 0)

    tx = optax.adam(1e-2)
    mesh = sharding.make_mesh((1, 1, 1))
    state, shardings = sharding.create_train_state(params, tx, mesh, sharding.DEFAULT_RULES)
    # Adam's two moments are sized to the adapters (plus its int32 step count).
    adapter_bytes = _nbytes(params["lora"])
    self.assertEqual(_nbytes(state.opt_state), 2 * adapter_bytes + 4)
    self.assertLess(adapter_bytes, _nbytes(params["base"]) / 4)
    self.assertLen(jax.tree.leaves(state.opt_state), 2 * len(jax.tree.leaves(params["lora"])) + 1)
    base_before = jax.device_get(params["base"])
    lora_before = jax.device_get(params["lora"])
    update = jax.jit(loop.skip_nonfinite(loop.gradient_step(_pg_loss(graphdef), tx)),
                     donate_argnames="state", out_shardings=(shardings, None))
    state, metrics = update(state, _batch(0))
    self.assertEqual(float(metrics["skipped"]), 0.0)
    self.assertGreater(float(metrics["grad_norm"]), 0.0)
    for got, want in zip(jax.tree.leaves(state.params["base"]), jax.tree.leaves(base_before)):
      np.testing.assert_array_equal(got, want)  # bitwise
    self.assertGreater(max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(
        jax.tree.leaves(state.params["lora"]), jax.tree.leaves(lora_before))), 1e-4)

  def test_reference_is_the_base_with_adapters_off(self):
    (base_def, base), (graphdef, params) = _lora(noise=0.5)
    batch = _batch(0)
    score = jax.jit(loop.make_score_step(graphdef, temperature=1.0, with_ref=True))
    scored, metrics = score(params, None, batch)
    want_ref = policy.token_logprobs(nnx.merge(base_def, base), batch.tokens_BT,
                                     batch.positions_BT, batch.input_mask_BT)
    np.testing.assert_allclose(scored.ref_logp_BT, want_ref, atol=1e-6)
    self.assertGreater(float(jnp.abs(scored.old_logp_BT - want_ref).max()), 1e-2)
    self.assertGreater(float(metrics["kl"]), 0.0)
    plain = loop.make_score_step(base_def, temperature=1.0, with_ref=True)
    with self.assertRaisesRegex(ValueError, "LoraTransformer"):
      plain(base, None, batch)  # without LoRA a reference must be given

  def test_trainable_and_combine(self):
    _, (_, params) = _lora()
    nested = {"policy": params, "value": {"w": jnp.ones(3)}}
    state = types.TrainState(step=jnp.int32(0), params=nested, opt_state=())
    part = lora.trainable(state)
    self.assertEqual(list(part.params["policy"].keys()), ["lora"])
    self.assertIs(part.params["value"], nested["value"])
    back = lora.combine(state, part)
    self.assertEqual(jax.tree.structure(back), jax.tree.structure(state))
    self.assertTrue(all(a is b for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state))))
    plain = {"w": jnp.ones(2)}
    self.assertIs(lora.trainable(plain), plain)
    self.assertFalse(lora.has_adapters(plain))


class _Run:
  """loop.run on the LoRA model with rollouts drawn from fixed token batches; the jitted steps
  are built once, so the three runs of the resume test compile them once."""

  def __init__(self):
    _, (self.graphdef, self.params) = _lora()
    self.tx = optax.adam(3e-2)
    self.mesh = sharding.make_mesh((1, 1, 1))
    _, shardings = sharding.create_train_state(self.params, self.tx, self.mesh,
                                               sharding.DEFAULT_RULES)
    self.score = jax.jit(loop.make_score_step(self.graphdef, temperature=1.0, with_ref=True))
    self.update = jax.jit(
        loop.skip_nonfinite(loop.gradient_step(_pg_loss(self.graphdef), self.tx)),
        donate_argnames="state", out_shardings=(shardings, None))

  def __call__(self, workdir, total_steps):
    data = stream.PromptStream(generators.GeneratorSource(lambda s: {"prompt": str(s)}),
                               shuffle=False)

    def rollout(params, rng, step):
      del params, rng
      return loop.Rollout(batch=_batch(data.take(1)[0]["seed"] + 100 * step),
                          metrics={"reward": 0.5})

    state, _ = sharding.create_train_state(self.params, self.tx, self.mesh,
                                           sharding.DEFAULT_RULES)
    return loop.run(state, rng=jax.random.key(0), total_steps=total_steps, workdir=workdir,
                    rollout_fn=rollout, score_fn=lambda p, b: self.score(p, None, b),
                    advantage_fn=lambda b, e: (b, {}), update_fn=self.update, data=data,
                    save_every=2, tensorboard=False, console=False, async_save=False)


class ResumeTest(absltest.TestCase):

  def test_adapters_alone_are_saved_and_resume_exactly(self):
    dirs = [tempfile.mkdtemp() for _ in range(2)]
    for d in dirs:
      self.addCleanup(shutil.rmtree, d, ignore_errors=True)
    run = _Run()
    full = run(dirs[0], total_steps=4)
    run(dirs[1], total_steps=2)
    resumed = run(dirs[1], total_steps=4)
    strip = lambda records: [{k: v for k, v in r.items() if k not in metrics.TIMING_KEYS}
                             for r in records]
    self.assertEqual(strip(resumed.records), strip(full.records))
    for got, want in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(full.state)):
      np.testing.assert_array_equal(got, want)
    self.assertGreater(float(full.records[-1]["grad_norm"]), 0.0)
    # The checkpoint holds the adapters and their Adam moments, not the frozen base.
    saved = checkpoint.read_subtree(f"{dirs[1]}/ckpt", ("state", "params"),
                                    lora.trainable(full.state.params), step=4)
    self.assertEqual(list(saved.keys()), ["lora"])
    with self.assertRaisesRegex(KeyError, "base"):
      checkpoint.read_subtree(f"{dirs[1]}/ckpt", ("state", "params", "base"), {}, step=4)


class ShardingTest(absltest.TestCase):

  def test_adapters_shard_like_their_base_and_match_one_device(self):
    rules = [("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"),
             ("kv_heads", "tensor"), ("vocab", "tensor")]  # lora_rank: replicated
    cfg = transformer.Config.named("tiny", dtype="float32")
    mesh = sharding.make_mesh((2, 2, 2))
    base_def, base = sharding.create_sharded(
        lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0)), mesh, rules)
    ad_def, ad = sharding.create_sharded(
        lambda: lora.Adapters(cfg, lora.LoraConfig(rank=4), rngs=nnx.Rngs(1)), mesh, rules)
    specs = jax.tree.map(lambda x: x.sharding.spec, nnx.to_pure_dict(ad))
    self.assertEqual(specs["q_a_LDR"], P(None, "fsdp", None))
    self.assertEqual(specs["q_b_LRHK"], P(None, None, "tensor", None))
    self.assertEqual(specs["o_a_LHKR"], P(None, "tensor", None, None))
    self.assertEqual(specs["o_b_LRD"], P(None, None, "fsdp"))
    self.assertEqual(specs["down_a_LFR"], P(None, "tensor", None))
    ad = jax.tree.map(lambda x: x + 0.1, ad)  # non-zero B, so the adapters matter
    graphdef, params = lora.attach(base_def, base, ad_def, ad)
    tokens_BT = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab, (8, 8)), jnp.int32)
    positions_BT = jnp.broadcast_to(jnp.arange(8), (8, 8))
    forward = lambda p: policy.token_logprobs(nnx.merge(graphdef, p), tokens_BT, positions_BT)
    with jax.set_mesh(mesh):
      got = jax.jit(forward)(params)
    want = jax.jit(forward)(jax.device_put(jax.device_get(params), jax.devices()[0]))
    np.testing.assert_allclose(got, want, atol=1e-5)


if __name__ == "__main__":
  absltest.main()
