# pylint: disable=invalid-name
"""experiments/agents/spo_chain.py: its advantage step on a hand-made batch, the Monte-Carlo prefix
batch and the scoring of MC responses in the real arithmetic env.

Golden values: MC values at hand-placed cuts give the segment differences V(s_k) - V(s_{k-1})
on the low-probability tokens only; prompt and pad tokens get exactly 0 (even where their
log-prob is low); a group whose MC values all equal its scores gets exactly 0.
"""
import importlib
import types as pytypes

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from agentrl.credit import spo
from agentrl.envs import arithmetic
from agentrl.harness import recipe
from agentrl import types

spo_chain = importlib.import_module("experiments.agents.spo_chain")

# Two prompt columns, a response of 5 (row 0) or 4 (rows 1-3) tokens, then padding. The
# prompt's second token and the pads have p < 0.9 too: only the loss mask keeps them out.
PROBS = np.array([[1.0, 0.5, 0.5, 0.95, 0.3, 0.99, 0.2, 0.1],
                  [1.0, 0.5, 0.4, 0.99, 0.6, 0.97, 0.1, 0.1],
                  [1.0, 0.5, 0.5, 0.5, 0.95, 0.5, 0.1, 0.1],
                  [1.0, 0.5, 0.95, 0.5, 0.95, 0.5, 0.1, 0.1]])
LOSS_MASK = np.array([[0, 0, 1, 1, 1, 1, 1, 0]] + [[0, 0, 1, 1, 1, 1, 0, 0]] * 3, np.float32)
SCORE = np.array([1.0, 0.0, 1.0, 0.0], np.float32)
# Cuts of spo.interval = 1: before every low-probability response token.
CUT = np.array([[1, 3, 5], [1, 3, -1], [1, 2, 4], [2, 4, -1]], np.int32)
VALID = CUT >= 0
# Row 0: V = .2, .6, .5, score 1. Row 1: V = .5, .25, score 0. Rows 2-3 (one group): every
# MC value equals the row's score.
VALUE = np.array([[0.2, 0.6, 0.5], [0.5, 0.25, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]],
                 np.float32)
# Row 0: tokens 2-3 get V(3) - V(1) = .4 (token 3 has p .95: masked), 4-5 get -.1, 6 gets
# 1 - .5. Row 1: tokens 2-3 get .25 - .5, tokens 4-5 score - .25 (token 5 masked).
GOLDEN = np.array([[0, 0, 0.4, 0, -0.1, 0, 0.5, 0],
                   [0, 0, -0.25, 0, -0.25, 0, 0, 0],
                   [0] * 8, [0] * 8], np.float32)


def _batch(rows=slice(None)):
  B, T = PROBS[rows].shape
  return types.Batch(tokens_BT=jnp.ones((B, T), jnp.int32),
                     positions_BT=jnp.broadcast_to(jnp.arange(T), (B, T)),
                     input_mask_BT=jnp.asarray(LOSS_MASK[rows] + (np.arange(T) < 2) > 0),
                     loss_mask_BT=jnp.asarray(LOSS_MASK[rows]), reward_B=jnp.asarray(SCORE[rows]),
                     old_logp_BT=jnp.asarray(np.log(PROBS[rows]), jnp.float32))


def _advantages(whiten, rows=slice(None)):
  config = spo_chain.get_config("smoke")
  config.spo.whiten = whiten
  extras = {"value_BK": jnp.asarray(VALUE[rows]), "cut_BK": jnp.asarray(CUT[rows]),
            "cut_valid_BK": jnp.asarray(VALID[rows])}
  batch, metrics = spo_chain.make_advantage_fn(config)(_batch(rows), extras)
  return np.asarray(batch.adv_BT), np.asarray(batch.loss_mask_BT), metrics


class AdvantageStepTest(absltest.TestCase):

  def test_cuts_are_the_library_cutpoints(self):
    cut, valid = spo.cutpoints(np.log(PROBS), LOSS_MASK, interval=1, max_cuts=3)
    np.testing.assert_array_equal(cut, CUT)
    np.testing.assert_array_equal(valid, VALID)

  def test_golden_values_with_the_probability_mask(self):
    adv, loss_mask, metrics = _advantages(whiten=False)
    np.testing.assert_allclose(adv, GOLDEN, atol=1e-6)
    keep = (LOSS_MASK > 0) & (PROBS < 0.9)
    np.testing.assert_array_equal(loss_mask, keep.astype(np.float32))  # the loss's mask
    self.assertTrue(np.all(adv[LOSS_MASK == 0] == 0.0))  # prompt and pad: exactly 0
    np.testing.assert_allclose(metrics["adv_abs_mean"], np.abs(GOLDEN[keep]).mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["spo/lowprob_frac"], keep.sum() / LOSS_MASK.sum())

  def test_whitened_over_the_probability_masked_tokens(self):
    adv, _, _ = _advantages(whiten=True)
    keep = (LOSS_MASK > 0) & (PROBS < 0.9)
    raw = GOLDEN[keep].astype(np.float64)
    np.testing.assert_allclose(adv[keep], (raw - raw.mean()) / np.sqrt(raw.var(ddof=1) + 1e-8),
                               rtol=1e-5)
    self.assertTrue(np.all(adv[~keep] == 0.0))

  def test_values_equal_to_the_scores_give_zero(self):
    for whiten in (False, True):  # whitened alone, the group's zeros stay zeros
      adv, _, _ = _advantages(whiten, rows=slice(2, 4))
      np.testing.assert_array_equal(adv, 0.0)


class MonteCarloTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = recipe.task_tokenizer(spo_chain.get_config("smoke").task)
    self.make_env = lambda: arithmetic.ArithmeticEnv(digits=3)
    self.problems = [arithmetic.make_problem(s, digits=3) for s in (5, 6)]
    # Gold responses: BOS + prompt, then answer + EOS (what the policy samples at best).
    self.trajs = []
    for p in self.problems:
      prompt = [self.tok.bos_id] + self.tok.encode(p["prompt"])
      tokens = np.asarray(prompt + self.tok.encode(p["answer"]) + [self.tok.eos_id], np.int32)
      self.trajs.append(pytypes.SimpleNamespace(tokens=tokens, prompt_len=len(prompt)))

  def test_prefix_batch_holds_the_prefix_tokens(self):
    P = self.trajs[0].prompt_len
    cut = np.array([[P - 1, P + 2], [P, -1]], np.int32)  # prompt only; 3 answer digits; 1
    requests = spo.mc_requests([t.tokens for t in self.trajs], cut, cut >= 0, num_samples=3,
                               end_B=[P + 6, P + 6])
    t0, t1 = (list(t.tokens) for t in self.trajs)
    self.assertEqual(requests.contexts, [t0[:P]] * 3 + [t0[:P + 3]] * 3 + [t1[:P + 1]] * 3)
    np.testing.assert_array_equal(requests.budget_N, [6] * 3 + [3] * 3 + [5] * 3)
    np.testing.assert_array_equal(requests.row_N, [0] * 6 + [1] * 3)
    np.testing.assert_array_equal(requests.slot_N, [0] * 3 + [1] * 3 + [0] * 3)

  def test_mc_scores_decode_prefix_and_continuation_as_the_engine(self):
    tok, (p0, _), P = self.tok, self.problems, self.trajs[0].prompt_len
    answer = tok.encode(p0["answer"])
    cut = np.array([[P], [-1]], np.int32)  # after the first answer digit
    requests = spo.mc_requests([t.tokens for t in self.trajs], cut, cut >= 0, num_samples=4,
                               end_B=[P + 4, P + 4])  # budget 3 after the first digit
    wrong = tok.encode("1" if p0["answer"][1] != "1" else "2")
    sampled = [answer[1:] + [tok.eos_id],          # 3 digits; EOS past the budget: right
               answer[1:3] + [tok.eos_id],         # one digit short, stops: wrong
               wrong + answer[2:],                 # a wrong digit: wrong
               answer[1:] + wrong + [tok.eos_id]]  # an extra digit, cut by the budget: right
    conts = [pytypes.SimpleNamespace(tokens=np.asarray(c + s, np.int32), prompt_len=len(c))
             for c, s in zip(requests.contexts, sampled)]
    scores = spo_chain.mc_scores(conts, requests, self.trajs, [5, 6], self.make_env, tok)
    np.testing.assert_array_equal(scores, [1.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(spo.mc_values(scores, requests, cut.shape), [[0.5], [0.0]])


if __name__ == "__main__":
  absltest.main()
