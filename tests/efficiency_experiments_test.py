# pylint: disable=invalid-name
"""The advantage steps of the efficiency experiments, and HAPO's history across a resume.

Each experiment's smoke run is in tests/experiments_smoke_test.py; here, hand-sized batches
through each file's advantage step (golden values and numpy references of the official
formulas, RL invariants, the neutral setting that reduces to GRPO or PPO), and HAPO's history
table through `loop.run`, killed after step 2 and resumed, against an uninterrupted run.
Experiments are imported by module name (no BUILD dependency on a binary).
"""
import importlib
import math
import shutil
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.envs import arithmetic
from agentrl.envs import verbose_arithmetic
from agentrl.harness import recipe
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.models import testing
from agentrl.models import transformer
from agentrl.records import metrics
from agentrl.records import study
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def _module(name):
  return importlib.import_module(study.experiment_module(name))


def _batch(lengths, reward, *, prompt=2, T=12, tokens=None, cls=types.Batch, **extra):
  """Rows of `prompt` context tokens then `lengths[b]` sampled ones (ids 5, or `tokens`)."""
  B = len(lengths)
  mask = np.zeros((B, T), np.float32)
  for b, n in enumerate(lengths):
    mask[b, prompt:prompt + n] = 1.0
  tokens = np.full((B, T), 5, np.int32) if tokens is None else np.asarray(tokens, np.int32)
  return cls(tokens_BT=jnp.asarray(tokens), positions_BT=jnp.tile(jnp.arange(T), (B, 1)),
             input_mask_BT=jnp.ones((B, T), bool), loss_mask_BT=jnp.asarray(mask),
             reward_B=jnp.asarray(reward, jnp.float32), **extra)


def _row_adv(batch):
  """The advantage of each row's first sampled token."""
  first = np.argmax(np.asarray(batch.loss_mask_BT) > 0, axis=1)
  return np.asarray(batch.adv_BT)[np.arange(len(first)), first]


class HapoTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.hapo = _module("hapo_length")
    self.config = self.hapo.get_config("smoke")   # G = 2

  def _history(self, h):
    table = self.hapo.length_rewards.LengthHistory.create(4)
    return table.replace(h_N=jnp.asarray(h, jnp.float32))

  def test_golden_reward_advantage_and_history_update(self):
    # Prompt 0 (slot 0, h = 8): correct rows of 4 and 8 tokens; r_len = cos(pi/4) = 0.7071 and
    # cos(pi/2) = 0, so R = [1.7071, 1.0] and GRPO gives -+0.7071 (unbiased std). Prompt 1
    # (slot 1, h undefined): r_len = 0, R = [1, 0] -> +-0.7071.
    batch = _batch([4, 8, 6, 3], [1, 1, 1, 0], cls=self.hapo.Batch,
                   slot_B=jnp.asarray([0, 0, 1, 1], jnp.int32))
    out, history, metrics = self.hapo.hapo_advantage(
        self.config, self._history([8.0, np.inf, np.inf, np.inf]), batch)
    np.testing.assert_allclose(_row_adv(out), [0.70710, -0.70710, 0.70710, -0.70710],
                               atol=1e-4)
    np.testing.assert_allclose(metrics["hapo/length_reward"], math.cos(math.pi / 4) / 4,
                               atol=1e-6)
    self.assertEqual(float(metrics["hapo/history_defined"]), 0.5)
    # h <- min(h, shortest correct length of the batch); the incorrect row changes nothing.
    np.testing.assert_array_equal(history.h_N, [4.0, 6.0, np.inf, np.inf])
    # Masked (prompt, padding) tokens get exactly zero advantage.
    self.assertTrue(np.all(np.asarray(out.adv_BT)[np.asarray(batch.loss_mask_BT) == 0] == 0))

  def test_w_zero_is_grpo_and_identical_groups_get_zero(self):
    self.config.loss.w = 0.0
    batch = _batch([4, 8, 6, 3], [1, 0, 1, 1], cls=self.hapo.Batch,
                   slot_B=jnp.asarray([0, 0, 1, 1], jnp.int32))
    out, _, _ = self.hapo.hapo_advantage(self.config, self._history([5.0, 3.0, 1.0, 1.0]), batch)
    expected = estimators.grpo(batch.reward_B, group_size=2)
    np.testing.assert_allclose(_row_adv(out), expected, atol=1e-6)
    self.assertEqual(list(_row_adv(out)[2:]), [0.0, 0.0])   # both correct, same length

  def test_stored_history_is_finite_and_round_trips(self):
    table = self._history([4.0, np.inf, 2.5, np.inf])
    # pylint: disable=protected-access
    stored = self.hapo._stored(table)
    self.assertTrue(np.all(np.isfinite(stored.h_N)))
    np.testing.assert_array_equal(self.hapo._table(stored).h_N, table.h_N)


class _ScriptedHapo:
  """HAPO's real state and update step on a random tiny model, driven by scripted rows: step
  s's lengths and rewards are fixed, so the history is a known function of the steps. The
  jitted steps are built once and shared by every run."""

  SCRIPT = {1: ([5, 3, 4, 6], [1, 1, 0, 1]), 2: ([2, 4, 5, 5], [1, 0, 1, 1]),
            3: ([6, 6, 3, 3], [1, 1, 1, 0])}

  def __init__(self, hapo, config):
    self.hapo, self.config = hapo, config
    self.cfg = transformer.Config.named("tiny", vocab=16, width=16, depth=1, heads=2,
                                        kv_heads=2, head_dim=8, mlp=32)
    self.graphdef, _ = testing.random_params(self.cfg)
    self.mesh, self.tx = sharding.make_mesh(config.mesh), recipe.make_optimizer(config.optim)
    _, shardings = self.fresh_state()
    self.score_step = jax.jit(loop.make_score_step(self.graphdef, temperature=1.0,
                                                   logprob_impl="xla", with_ref=True))
    self.update_step = jax.jit(
        loop.skip_nonfinite(hapo.make_update_step(config, self.graphdef, self.tx)),
        donate_argnames="state", out_shardings=(shardings, None))

  def fresh_state(self):
    return self.hapo.init_state(self.config, testing.random_params(self.cfg)[1], self.tx,
                                self.mesh)

  def rollout_fn(self, params, rng, step):
    del params, rng
    lengths, reward = self.SCRIPT[step]
    tokens = np.random.default_rng(step).integers(4, 16, (4, 12))
    batch = _batch(lengths, reward, tokens=tokens, cls=self.hapo.Batch,
                   slot_B=jnp.asarray([0, 0, 1, 1], jnp.int32))
    return loop.Rollout(batch=jax.device_put(batch, sharding.batch_sharding(self.mesh)),
                        metrics={"reward": 0.0})

  def run(self, workdir: str, total_steps: int) -> loop.Result:
    state, _ = self.fresh_state()
    ref_params = jax.tree.map(jnp.copy, state.params)
    with jax.set_mesh(self.mesh):
      return loop.run(state, rng=jax.random.key(0), total_steps=total_steps, workdir=workdir,
                      rollout_fn=self.rollout_fn,
                      score_fn=lambda params, batch: self.score_step(params, ref_params, batch),
                      advantage_fn=lambda batch, extras: (batch, {}),
                      update_fn=self.update_step, shuffle=False, save_every=1,
                      tensorboard=False, console=False, async_save=False)


class HapoResumeTest(absltest.TestCase):

  def test_history_is_checkpointed_and_restored_exactly(self):
    hapo = _module("hapo_length")
    config = hapo.get_config("smoke")
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    scripted = _ScriptedHapo(hapo, config)
    straight = scripted.run(f"{root}/straight", 3)
    scripted.run(f"{root}/resumed", 2)
    resumed = scripted.run(f"{root}/resumed", 3)   # restores step 2
    self.assertEqual(resumed.steps_run, 1)
    # Correct lengths per slot over the 3 steps: slot 0 {5, 3, 2, 6, 6}, slot 1 {6, 5, 5, 3}.
    # A resume that lost the table would hold slot 0 = 6 (step 3's rows only).
    h = np.asarray(jax.device_get(resumed.state.history.h_N))
    np.testing.assert_array_equal(h[:3], [2.0, 3.0, 0.0])           # 0: never defined
    np.testing.assert_array_equal(h, jax.device_get(straight.state.history.h_N))
    clean = lambda rs: [{k: v for k, v in r.items() if k not in metrics.TIMING_KEYS} for r in rs]
    self.assertEqual(clean(resumed.records), clean(straight.records))


class HbpoTest(absltest.TestCase):

  def test_budget_rows_and_prompts(self):
    hbpo = _module("hbpo")
    rows = hbpo.BudgetRows(verbose_arithmetic.VerboseArithmeticEnv, [6, 6, 12, 12], "[{budget}]")
    envs = [rows() for _ in range(8)]
    self.assertEqual([e.budget for e in envs], [6, 6, 12, 12] * 2)
    self.assertTrue(envs[2].reset(3).endswith("=[12]"))
    self.assertFalse(envs[2].formatted)                  # not stepped yet
    envs[2].step("..>" + arithmetic.make_problem(3)["answer"])
    self.assertTrue(envs[2].formatted)
    envs[3].reset(3)
    envs[3].step("...")                                   # no answer: an error
    self.assertFalse(envs[3].formatted)

  def test_advantage_matches_a_numpy_reference(self):
    hbpo = _module("hbpo")
    config = hbpo.get_config("smoke")                     # G = 4: budgets 6, 8, 10, 12
    hc = config.hbpo
    lengths, correct, formatted = [6, 9, 5, 12, 7, 7, 7, 7], [1, 1, 0, 1, 1, 1, 1, 1], [1] * 8
    formatted[3] = 0
    budget = np.tile([6.0, 8.0, 10.0, 12.0], 2)
    batch = _batch(lengths, correct, T=16)
    out, metrics = hbpo.make_advantage_fn(config)(
        batch, {"budget_B": jnp.asarray(budget), "formatted_B": jnp.asarray(formatted, bool)})
    # The released math_reward.py rule and core_algos.py advantage, written out in numpy.
    L, b, pi, beta, lmax = np.asarray(lengths, float), budget, 3.1416, hc.beta, hc.max_len
    f1 = beta * np.cos(pi * L / (2 * lmax)) - np.abs(L - b) / lmax
    f2 = beta * np.cos(pi * b / (2 * lmax))
    R = np.where(np.asarray(correct) > 0, np.minimum(f1, f2), 0.0)
    R = np.where(np.asarray(formatted) > 0, R, -1.0)
    expected = []
    for g in range(2):
      r = R[4 * g:4 * g + 4]
      # Each budget has one row here: the subgroup mean is the row's own reward.
      expected += list((r - r.mean()) / (r.std(ddof=1) + 1e-6) + (r - f2[:4]))
    np.testing.assert_allclose(_row_adv(out), expected, rtol=1e-5, atol=1e-5)
    self.assertEqual(float(metrics["hbpo/within_budget"]), 6 / 8)
    self.assertTrue(np.all(np.asarray(out.adv_BT)[np.asarray(batch.loss_mask_BT) == 0] == 0))


class DecsTest(absltest.TestCase):

  def test_trailing_filler_is_penalised_and_beta_zero_is_grpo(self):
    decs = _module("decs")
    config = decs.get_config("smoke")                     # G = 2, T (response budget) = 16
    dot, digit, eos = 4, 7, 3
    # Two correct responses of one prompt: ">7777" + EOS, and ">7777.." + EOS.
    tokens = np.zeros((2, 12), np.int32)
    tokens[0, 2:8] = [9, digit, digit, digit, digit, eos]
    tokens[1, 2:10] = [9, digit, digit, digit, digit, dot, dot, eos]
    batch = _batch([6, 8], [1, 1], tokens=tokens)
    adv_fn = decs.make_advantage_fn(config, filler_id=dot, stop_ids=(eos,))
    out, metrics = adv_fn(batch, {})
    adv = np.asarray(out.adv_BT)
    # Position-wise z-score over the 2 rows: at the two dots (positions 7, 8) row 1 has
    # 1 + 0.1 (1 - 8/16) = 1.05 against row 0's 1.1: -0.7071 for row 1, +0.7071 for row 0
    # where row 0 still has a sampled token (position 7: its EOS). Elsewhere equal: 0.
    np.testing.assert_allclose(adv[1, 7:9], [-0.70710, -0.70710], atol=1e-4)
    np.testing.assert_allclose(adv[0, 7], 0.70710, atol=1e-4)
    self.assertEqual(adv[0, 8], 0.0)                      # row 0's padding
    self.assertTrue(np.all(adv[:, :7] == 0) and adv[1, 9] == 0)
    self.assertAlmostEqual(float(metrics["decs/redundant_frac"]), 2 / 14, places=6)
    config.loss.beta = 0.0
    batch = _batch([6, 8], [1, 0], tokens=tokens)
    out, _ = decs.make_advantage_fn(config, filler_id=dot, stop_ids=(eos,))(batch, {})
    np.testing.assert_allclose(
        out.adv_BT, estimators.broadcast_to_tokens(estimators.grpo(batch.reward_B, group_size=2),
                                                   batch.loss_mask_BT), atol=1e-6)


class EapoTest(absltest.TestCase):

  def test_discounted_reward_and_gamma_one_is_grpo(self):
    eapo = _module("eapo")
    config = eapo.get_config("smoke")
    config.loss.gamma = 0.9
    batch = _batch([6, 10, 4, 4], [1, 1, 1, 0])
    out, metrics = eapo.make_advantage_fn(config)(batch, {})
    # 0.9^6 = 0.531441 > 0.9^10 = 0.348678: the shorter correct answer is preferred.
    np.testing.assert_allclose(_row_adv(out), [0.70710, -0.70710, 0.70710, -0.70710],
                               atol=1e-4)
    np.testing.assert_allclose(metrics["eapo/discounted_reward"],
                               (0.9**6 + 0.9**10 + 0.9**4) / 4, rtol=1e-6)
    config.loss.gamma = 1.0
    out, _ = eapo.make_advantage_fn(config)(_batch([6, 10, 4, 4], [1, 1, 1, 0]), {})
    self.assertEqual(list(_row_adv(out)[:2]), [0.0, 0.0])  # both correct: GRPO's zero


class TppoTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tppo = _module("tppo")

  def test_window_cut(self):
    mask = np.zeros((2, 10), np.float32)
    mask[0, 2:5], mask[1, 2:9] = 1, 1                   # 3 and 7 sampled tokens
    keep, truncated, last = self.tppo.window_cut(jnp.asarray(mask), 4)
    np.testing.assert_array_equal(np.asarray(keep)[0], mask[0])
    np.testing.assert_array_equal(np.nonzero(np.asarray(keep)[1])[0], [2, 3, 4, 5])
    np.testing.assert_array_equal(truncated, [False, True])
    np.testing.assert_array_equal(last, [4, 5])

  def _ppo_batch(self, lengths, reward, value):
    batch = _batch(lengths, reward, T=10)
    B, T = batch.loss_mask_BT.shape
    logp = jnp.asarray(np.random.default_rng(0).normal(size=(B, T)) * 0.1, jnp.float32)
    return batch.replace(old_logp_BT=logp, ref_logp_BT=logp * 0.5,
                         value_BT=jnp.asarray(value, jnp.float32))

  def test_wide_window_is_ppo(self):
    config = self.tppo.get_config("smoke")
    config.loss.window = 100
    value = np.random.default_rng(1).normal(size=(3, 10))
    batch = self._ppo_batch([3, 5, 2], [1.0, 0.0, 1.0], value)
    out, _ = self.tppo.make_advantage_fn(config)(batch, {})
    lc = config.loss
    reward_BT, _ = kl.kl_in_reward(batch.reward_B, batch.old_logp_BT, batch.ref_logp_BT,
                                   batch.loss_mask_BT, beta=lc.kl_coef, kind="k1")
    adv, ret = estimators.gae(reward_BT, batch.value_BT, batch.loss_mask_BT, gamma=lc.gamma,
                              lam=lc.lam)
    np.testing.assert_allclose(out.adv_BT, aggregation.masked_whiten(adv, batch.loss_mask_BT),
                               atol=1e-5)
    np.testing.assert_allclose(out.ret_BT, ret, atol=1e-6)
    np.testing.assert_array_equal(out.value_mask_BT, batch.loss_mask_BT)

  def test_truncated_row_bootstraps_and_leaves_the_critic(self):
    config = self.tppo.get_config("smoke")                # window 4
    config.loss.update(gamma=1.0, lam=1.0, kl_coef=0.0)
    value = np.zeros((2, 10))
    value[1, 6] = 0.25                                     # V before token 6 = V(s_trunc) of row 1
    batch = self._ppo_batch([3, 6], [1.0, 1.0], value)
    out, metrics = self.tppo.make_advantage_fn(config)(batch, {})
    # Row 1 keeps tokens 2..5; its env reward is dropped and, with gamma = lam = 1 and no KL,
    # every kept token's return is the bootstrap value 0.25. Row 0 (3 tokens) returns 1.0.
    np.testing.assert_allclose(np.asarray(out.ret_BT)[1, 2:6], [0.25] * 4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.ret_BT)[0, 2:5], [1.0] * 3, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.loss_mask_BT)[1], [0, 0, 1, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(out.value_mask_BT)[1], np.zeros(10))
    np.testing.assert_array_equal(out.value_mask_BT[0], batch.loss_mask_BT[0])
    self.assertEqual(float(metrics["tppo/truncated_frac"]), 0.5)
    self.assertAlmostEqual(float(metrics["tppo/bootstrap_value"]), 0.25, places=6)


class DelethinkTest(absltest.TestCase):

  def test_trace_mean_is_a_token_mean_over_each_whole_trace(self):
    delethink = _module("delethink")
    # Trace 0 = chunk rows 0 (3 tokens) and 1 (2 tokens), 5 tokens; trace 1 = row 2 (4 tokens);
    # row 3 pads. Token means over the traces: (1+2+3+4+5)/5 = 3 and 2, so the loss is 2.5.
    loss = jnp.asarray([[1, 2, 3, 0], [4, 5, 0, 0], [2, 2, 2, 2], [9, 9, 9, 9]], jnp.float32)
    mask = jnp.asarray([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], jnp.float32)
    value = delethink.trace_mean(loss, mask, jnp.asarray([5.0, 5.0, 4.0, 1.0]), 2.0)
    self.assertAlmostEqual(float(value), 2.5, places=6)

  def test_chunks_share_their_trace_advantage(self):
    delethink = _module("delethink")
    config = delethink.get_config("smoke")                # G = 2
    batch = _batch([2, 3, 1, 4, 0], [0, 0, 0, 1, 0])
    extras = {"trace_reward_B": jnp.asarray([1.0, 0.0, 1.0, 1.0]),
              "owner_C": jnp.asarray([0, 0, 1, 2, 0], jnp.int32)}    # row 4 pads
    out, metrics = delethink.make_advantage_fn(config)(batch, extras)
    np.testing.assert_allclose(_row_adv(out)[:4], [0.70710, 0.70710, -0.70710, 0.0], atol=1e-4)
    self.assertFalse(np.asarray(out.adv_BT)[4].any())     # padding row: no tokens, no advantage
    self.assertEqual(float(metrics["groups_with_signal"]), 0.5)

  def test_trace_metrics(self):
    delethink = _module("delethink")
    trace = lambda chunks, truncated, success: delethink.delethink.Trace(
        chunks=[None] * chunks, reward=float(success), done=True, truncated=truncated,
        prompt_len=3, infos=[{"success": success}])
    metrics = delethink.trace_metrics([trace(1, False, True), trace(3, False, False),
                                       trace(2, True, False)])
    # Cut chunks: 0, 2 (the first two of 3) and 2 (both of a truncated trace) out of 6.
    self.assertEqual(metrics, {"success": 1 / 3, "reward": 1 / 3, "rollout/turns_mean": 2.0,
                               "rollout/turn_cut_frac": 4 / 6})


def _reference_cot_advantage(R, probs, G):
  """compute_cot_advantage's loops (variance_reduction "brpo"), in numpy."""
  BG, S = R.shape
  probs = np.asarray(probs) / np.sum(probs)
  d = 2.0 ** np.arange(S)
  out = np.zeros_like(R)
  for i in range(BG):
    group = R[(i // G) * G:(i // G + 1) * G]
    for s in range(S):
      ret = (R[i, s:] * probs[s:]).sum()
      v2 = (group[:, s:] * probs[s:]).sum(-1).mean() if G > 1 else 0.0
      v1 = (R[i, :s] * d[:s]).sum() / d[:s].sum() * probs[s:].sum() if s > 0 else 0.0
      out[i, s] = ret - (s * v1 + (S - s) * v2) / S
  return out


class BrpoTest(absltest.TestCase):

  def test_budget_priors(self):
    brpo = _module("brpo")
    np.testing.assert_allclose(brpo.budget_prior("linear", [2, 4, 6, 8]), [0.1, 0.2, 0.3, 0.4])
    self.assertEqual(brpo.budget_prior("uniform", [2, 4]), [0.5, 0.5])
    self.assertEqual(brpo.budget_prior("base", [2, 4, 6]), [0.0, 0.0, 1.0])

  def test_thinking_and_summary_rows_get_the_official_advantages(self):
    brpo = _module("brpo")
    config = brpo.get_config("smoke")                     # P = 2, G = 2: B = 4
    config.brpo.budgets = "2,4"
    budgets, A = [2, 4], 1
    thinking = [3, 1, 4, 2]                               # sampled thinking tokens per row
    score = np.asarray([[[0.0], [1.0]], [[1.0], [1.0]], [[0.0], [0.0]], [[1.0], [0.0]]])
    lengths = thinking + [2] * (4 * 2 * A)                # then the 8 summary rows
    batch = _batch(lengths, [0.0] * len(lengths))
    out, _ = brpo.make_advantage_fn(config, budgets)(batch, {"score_BSA": jnp.asarray(score)})
    adv = np.asarray(out.adv_BT)
    cot = _reference_cot_advantage(score[..., 0], brpo.budget_prior("linear", budgets), G=2)
    for b, n in enumerate(thinking):
      # Thinking token k lies in segment 0 for k < 2, segment 1 for 2 <= k < 4.
      expected = [cot[b, 0] if k < 2 else cot[b, 1] for k in range(n)]
      np.testing.assert_allclose(adv[b, 2:2 + n], expected, atol=1e-6)
    # Summaries (A = 1): score minus the group's mean at the same budget.
    for b in range(4):
      g = (b // 2) * 2
      for s in range(2):
        row = 4 + b * 2 + s
        base = score[g:g + 2, s, 0].mean()
        np.testing.assert_allclose(adv[row, 2:4], score[b, s, 0] - base, atol=1e-6)
    self.assertTrue(np.all(adv[np.asarray(batch.loss_mask_BT) == 0] == 0))


if __name__ == "__main__":
  absltest.main()
