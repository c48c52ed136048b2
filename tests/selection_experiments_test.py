# pylint: disable=invalid-name
"""The advantage steps of the selection, shaping and label-free experiments, by hand.

Each experiment's smoke run is in tests/experiments_smoke_test.py; here, hand-sized batches go
through each file's advantage step: golden values computed by hand (COPO, ETR, KTO), numpy
references of the selection (D3S) and of the confidences (ARM), the RL invariants (an
all-equal group gets exactly 0, masked tokens get 0) and the neutral settings that reduce to
GRPO (ARM alpha = 0, DelTA w_min = w_max = 1); HAPO's update writes the entropy statistics
its next rollout's adaptive temperature reads. Experiments are imported by module name.
"""
import importlib
import math
from unittest import mock

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.models import testing
from agentrl.models import transformer
from agentrl.records import study
from agentrl import types

PROMPT, T = 3, 8  # every row: BOS + 2 prompt tokens, then 5 sampled tokens


def _module(name):
  return importlib.import_module(study.experiment_module(name))


def _batch(reward, seed=0) -> types.Batch:
  B = len(reward)
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), np.float32)
  mask[:, PROMPT:] = 1.0
  logp = -rng.uniform(0.05, 3.0, (B, T)).astype(np.float32)
  logp[:, 0] = 0.0  # column 0 has no prediction
  return types.Batch(
      tokens_BT=jnp.asarray(rng.integers(1, 16, (B, T)), jnp.int32),
      positions_BT=jnp.tile(jnp.arange(T), (B, 1)), input_mask_BT=jnp.ones((B, T), bool),
      loss_mask_BT=jnp.asarray(mask), turn_BT=jnp.asarray(np.where(mask > 0, 0, -1), jnp.int32),
      reward_B=jnp.asarray(reward, jnp.float32), old_logp_BT=jnp.asarray(logp),
      entropy_BT=jnp.asarray(rng.uniform(0.1, 2.0, (B, T)), jnp.float32))


def _grpo_rows(reward, G):
  return np.asarray(estimators.grpo(jnp.asarray(reward, jnp.float32), group_size=G))


class D3STest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.config = _module("d3s").get_config()
    self.config.rollout.group_size = 4
    self.config.loss.update(keep_samples=2, keep_start=0.25, keep_end=1.0)
    self.advantage_fn = _module("d3s").make_advantage_fn(self.config)

  def test_rows_then_tokens(self):
    reward = [1.0, 0.0, 0.2, 0.6, 1, 1, 1, 1]
    batch = _batch(reward)
    out, metrics = self.advantage_fn(batch, {"step": jnp.int32(1)})
    # The two rows of largest advantage variance: the extremes, rows 0 and 1; in the all-equal
    # group every pair ties at variance 0 and the first candidate (the top two sorted) wins.
    adv_B = _grpo_rows(reward, 4)
    rows = [0, 1, 6, 7]
    score = np.full((8, T), -np.inf)
    score[rows, PROMPT:] = np.abs(adv_B[rows, None]) * np.asarray(batch.entropy_BT)[rows, PROMPT:]
    n_keep = math.ceil(0.25 * 4 * (T - PROMPT))  # rho = keep_start at step 1: 5 of 20 tokens
    want = np.zeros((8, T))
    want.flat[np.argsort(-score, axis=None, kind="stable")[:n_keep]] = 1.0
    np.testing.assert_array_equal(out.loss_mask_BT, want)
    np.testing.assert_allclose(out.adv_BT, want * adv_B[:, None], rtol=1e-6)
    self.assertAlmostEqual(float(metrics["d3s/keep_ratio"]), 0.25, places=6)
    self.assertAlmostEqual(float(metrics["d3s/token_frac"]), n_keep / 40)
    # At the end of the curriculum (rho = 1) every token of the kept rows stays.
    out, _ = self.advantage_fn(batch, {"step": jnp.int32(self.config.total_steps + 1)})
    want = np.zeros((8, T))
    want[rows, PROMPT:] = 1.0
    np.testing.assert_array_equal(out.loss_mask_BT, want)
    np.testing.assert_array_equal(np.asarray(out.adv_BT)[4:], 0.0)  # the all-equal group


class ArmTest(absltest.TestCase):

  def test_confidences_and_neutral_alpha(self):
    arm = _module("arm")
    config = arm.get_config()
    config.rollout.group_size = 4
    reward = [1, 0, 0, 0, 0, 0, 0, 0]  # the second group has no success: no re-weighting
    batch = _batch(reward, seed=1)
    logp = np.asarray(batch.old_logp_BT)
    # ceil(0.2 n) lowest log-probs: 1 of the 2 prompt tokens after BOS, 1 of the 5 sampled.
    prompt_conf, answer_conf = logp[:, 1:PROMPT].min(1), logp[:, PROMPT:].min(1)
    adv_B = _grpo_rows(reward, 4)
    want_B = np.where(np.arange(8) < 4, adv_B + 0.1 * (prompt_conf - answer_conf), adv_B)
    out, metrics = arm.make_advantage_fn(config)(batch, {})
    np.testing.assert_allclose(out.adv_BT[:, PROMPT:], np.repeat(want_B[:, None], 5, 1),
                               rtol=1e-6)
    np.testing.assert_array_equal(out.adv_BT[:, :PROMPT], 0.0)
    np.testing.assert_array_equal(out.adv_BT[4:], 0.0)
    self.assertAlmostEqual(float(metrics["arm/prompt_conf"]), prompt_conf.mean(), places=5)
    config.loss.alpha = 0.0  # GRPO
    out, _ = arm.make_advantage_fn(config)(batch, {})
    np.testing.assert_allclose(out.adv_BT[:, PROMPT:], np.repeat(adv_B[:, None], 5, 1))


class AuxTest(absltest.TestCase):
  """Per-row data the advantage step hands to the loss in batch.aux (hand-computed)."""

  def test_etr_group_variance(self):
    etr = _module("etr")
    config = etr.get_config()
    config.rollout.group_size = 4
    reward = [1, 0, 0, 0, 1, 1, 0, 0]
    out, metrics = etr.make_advantage_fn(config)(_batch(reward), {})
    np.testing.assert_allclose(out.aux["group_var_B"], [0.1875] * 4 + [0.25] * 4)  # p (1 - p)
    self.assertAlmostEqual(float(metrics["group_reward_var"]), 0.21875)
    np.testing.assert_allclose(out.adv_BT[:, PROMPT], _grpo_rows(reward, 4), rtol=1e-6)

  def test_copo_global_advantage_and_gate(self):
    copo = _module("copo")
    config = copo.get_config()
    config.rollout.group_size = 4
    reward = [1, 0, 0, 0, 1, 1, 1, 1]
    answer_id_B = jnp.asarray([0, 1, 1, -1, 0, 0, 0, 0], jnp.int32)
    out, metrics = copo.make_advantage_fn(config)(_batch(reward), {"answer_id_B": answer_id_B})
    # Pass rates 0.25 and 1: mean 0.625, unbiased std 0.375 sqrt(2), so -+1/sqrt(2).
    np.testing.assert_allclose(out.aux["global_adv_B"], [-0.5**0.5] * 4 + [0.5**0.5] * 4,
                               rtol=1e-5)
    # Answer entropy: counts (1, 2, 2, 1) of 4 give 1.5 bits, one answer 0 bits; the gate is
    # sigmoid(5 (H - 1)) where R != 0.
    sigmoid = lambda x: 1.0 / (1.0 + math.exp(-x))
    np.testing.assert_allclose(out.aux["local_weight_B"],
                               [sigmoid(2.5), 0, 0, 0] + [sigmoid(-5.0)] * 4, rtol=1e-6)
    self.assertAlmostEqual(float(metrics["copo/answer_entropy"]), 0.75, places=6)
    np.testing.assert_allclose(out.adv_BT[:, PROMPT], _grpo_rows(reward, 4), rtol=1e-6)
    np.testing.assert_array_equal(out.adv_BT[4:], 0.0)  # the local term of an all-equal group

  def test_kto_labels(self):
    kto = _module("kto")
    out, metrics = kto.make_advantage_fn(kto.get_config())(_batch([1.0, 0.0, 0.6, 0.5]), {})
    np.testing.assert_array_equal(out.aux["desirable_B"], [True, False, True, False])
    self.assertEqual(float(metrics["desirable_frac"]), 0.5)


class DeltaTest(absltest.TestCase):

  def test_weights_and_neutral_setting(self):
    delta = _module("delta")
    cfg = transformer.Config.named("tiny", vocab=16, width=16, depth=1, heads=2, kv_heads=2,
                                   head_dim=8, mlp=32)
    graphdef, params = testing.random_params(cfg)
    config = delta.get_config()
    config.rollout.group_size = 4
    reward = [1, 0, 0, 1, 1, 1, 1, 1]
    batch = _batch(reward, seed=2)
    adv_B = _grpo_rows(reward, 4)
    out, metrics = delta.make_advantage_fn(config, graphdef)(params, batch)
    adv_BT = np.asarray(out.adv_BT)
    np.testing.assert_array_equal(adv_BT[:, :PROMPT], 0.0)
    np.testing.assert_array_equal(adv_BT[4:], 0.0)  # all-equal group
    # w in [0.8, 1.2] rescaled to mean 1 over the batch: A w / A stays within [0.8/1.2, 1.2/0.8].
    ratio = adv_BT[:4, PROMPT:] / adv_B[:4, None]
    self.assertTrue(np.all((ratio > 0.8 / 1.2 - 1e-6) & (ratio < 1.2 / 0.8 + 1e-6)), ratio)
    self.assertGreater(float(ratio.std()), 1e-3)  # the weights differ between tokens
    self.assertLessEqual(float(metrics["delta/weight_min"]), float(metrics["delta/weight_max"]))
    config.loss.update(w_min=1.0, w_max=1.0)  # GRPO
    out, _ = delta.make_advantage_fn(config, graphdef)(params, batch)
    np.testing.assert_allclose(out.adv_BT[:, PROMPT:], np.repeat(adv_B[:, None], 5, 1),
                               rtol=1e-6)


class HapoTemperatureTest(absltest.TestCase):
  """HAPO's update writes the entropy statistics; the next rollout samples with them."""

  def test_update_writes_stats_and_rollout_reads_them(self):
    hapo = _module("hapo")
    cfg = transformer.Config.named("tiny", vocab=16, width=16, depth=1, heads=2, kv_heads=2,
                                   head_dim=8, mlp=32)
    graphdef, params = testing.random_params(cfg)
    config = hapo.get_config("smoke")
    tx = hapo.recipe.make_optimizer(config.optim)
    mesh = hapo.sharding.make_mesh(config.mesh)
    state, _ = hapo.init_state(config, params, tx, mesh)
    np.testing.assert_array_equal(state.entropy_stats, np.zeros(5))
    batch = _batch([1.0, 0.0, 1.0, 1.0]).replace(adv_BT=jnp.ones((4, T)))
    new_state, _ = hapo.make_update_step(config, graphdef, tx)(state, batch)
    _, entropy_BT = hapo.policy_lib.token_logprobs(
        hapo.nnx.merge(graphdef, params), batch.tokens_BT,
        batch.positions_BT, batch.input_mask_BT, temperature=config.rollout.temperature,
        return_entropy=True, impl=config.model.logprob_impl)
    want = hapo.trust_region.hapo_entropy_stats(entropy_BT, batch.loss_mask_BT, pivot=0.8)
    np.testing.assert_allclose(new_state.entropy_stats, np.concatenate([[1.0], want]),
                               rtol=1e-5)

    seen = []
    fake = lambda *args, **kwargs: seen.append(kwargs["adaptive_temperature"])
    data = mock.Mock(take=lambda n: [{"seed": i} for i in range(n)])
    rollout_fn = hapo.make_rollout_fn(config, None, mock.Mock(), None, data, mesh)
    with mock.patch.object(hapo.collect, "env_rollout", fake):
      rollout_fn((params, state.entropy_stats), None, 1)
      rollout_fn((params, new_state.entropy_stats), None, 2)
    self.assertIsNone(seen[0])  # before any update: the plain temperature
    np.testing.assert_allclose(seen[1], (0.05, 1.0, *np.asarray(want)), rtol=1e-6)


if __name__ == "__main__":
  absltest.main()
