# pylint: disable=invalid-name
"""experiments/policy/lens.py through the real engine and the tiny transformer: the deleted
token is the task-text token of largest |log π_θ − log π_ref| (direct forwards), a transferred
row's trainer log-probs under the original prompt equal a direct forward of original prompt +
sampled ids, its sampler log-probs one of the purified prompt + sampled ids; at π_θ = π_ref
nothing is purified; and the advantage step's CRPO row weights."""
import importlib

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.models import policy as policy_lib
from agentrl.models import transformer
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import purify
from agentrl.train import loop
from agentrl import types

lens = importlib.import_module("experiments.policy.lens")
ALPHABET = "q0123456789abcdef"


class Tok:
  """Ids: 0 pad, 1 bos, 2 eos, 3 end of turn, 4 + i for ALPHABET[i]; decode skips the rest."""
  pad_id, bos_id, eos_id, end_of_turn_ids, vocab_size = 0, 1, 2, [3], 32

  def encode(self, text, add_bos=False):
    return ([self.bos_id] if add_bos else []) + [4 + ALPHABET.index(c) for c in text]

  def decode(self, ids):
    return "".join(ALPHABET[int(t) - 4] for t in ids if 4 <= int(t) < 4 + len(ALPHABET))


class CoinEnv:
  """reset(seed) -> 'q<seed>'; an answer whose first character is a letter a-f scores 1."""
  system_prompt = ""
  max_turns = 1

  def reset(self, seed):
    return f"q{seed}"

  def step(self, action):
    win = action[:1] in tuple("abcdef")
    return "", float(win), True, {"reward": float(win), "success": win}


def _forward(model, ids):
  ids = np.asarray(ids)
  return np.asarray(policy_lib.token_logprobs(model, ids[None], np.arange(len(ids))[None],
                                              np.ones((1, len(ids)), bool)))[0]


class LensEngineTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    cfg = transformer.Config.named("tiny", vocab=Tok.vocab_size)
    self.model = transformer.Transformer(cfg, rngs=nnx.Rngs(0))
    self.graphdef, self.params = nnx.split(self.model)
    self.ref_model = transformer.Transformer(cfg, rngs=nnx.Rngs(1))  # a policy that moved
    self.ref_params = nnx.split(self.ref_model)[1]
    self.engine = engine_lib.Engine(self.graphdef, pad_id=0, slots=8, chunk=8)
    self.score = jax.jit(loop.make_score_step(self.graphdef, temperature=1.0, with_ref=True))
    self.seeds = [12, 345, 6789, 42]

  def _rollout(self, ref_params, **kw):
    return purify.purified_rollout(
        self.engine, self.params, Tok(), CoinEnv, self.seeds,
        score_fn=lambda p, b: self.score(p, ref_params, b), gamma=0.2, tau=1.01,
        num_purified=4, rng=jax.random.key(3), group_size=4, max_turns=1, max_new_tokens=4,
        max_len=32, temperature=1.0, chat_template=False, min_len=32, **kw)

  def test_transferred_rows_score_under_the_original_prompt(self):
    tok, out = Tok(), self._rollout(self.ref_params)
    flags = np.asarray(out.extras["guided_B"])
    self.assertEqual(out.metrics["rollout/purified_prompts"], 4.0)
    self.assertEqual(out.metrics["rollout/deleted_tokens"], 1.0)   # ⌈0.2·n⌉ = 1 for n <= 5
    self.assertGreater(flags.sum(), 0)
    self.assertEqual(out.metrics["rollout/transferred_rows"], flags.sum())
    batch = out.batch
    logp = np.asarray(policy_lib.token_logprobs(self.model, batch.tokens_BT, batch.positions_BT,
                                                batch.input_mask_BT))
    for i, traj in enumerate(out.trajectories):
      seed = self.seeds[i // 4]
      prompt = tok.encode(f"q{seed}", add_bos=True)
      np.testing.assert_array_equal(traj.tokens[:len(prompt)], prompt)
      sampled, on = list(traj.tokens[len(prompt):]), traj.loss_mask > 0
      want = _forward(self.model, prompt + sampled)
      np.testing.assert_allclose(logp[i, :len(traj.tokens)][on], want[on], atol=1e-5)
      if not flags[i]:
        np.testing.assert_allclose(traj.sampler_logp[on], want[on], atol=1e-4)
        continue
      self.assertEqual(traj.reward, 1.0)   # only successes are transferred
      # The deleted token: the task-text token (after the BOS) of largest |log π − log π_ref|.
      s = np.abs(_forward(self.model, prompt) - _forward(self.ref_model, prompt))
      drop = 1 + int(np.argmax(s[1:]))
      purified = prompt[:drop] + prompt[drop + 1:]
      g = _forward(self.model, purified + sampled)[len(purified):]
      np.testing.assert_allclose(traj.sampler_logp[on], g[on[len(prompt):]], atol=1e-4)
      self.assertFalse(np.allclose(traj.sampler_logp[on], want[on], atol=1e-4))

  def test_nothing_is_purified_at_the_reference(self):
    out = self._rollout(self.params)   # π_ref = π_θ: every S_I is 0
    self.assertEqual(out.metrics["rollout/low_success_prompts"], 4.0)
    self.assertEqual(out.metrics["rollout/purified_prompts"], 0.0)
    self.assertEqual(out.metrics["rollout/transferred_rows"], 0.0)
    np.testing.assert_array_equal(out.extras["guided_B"], np.zeros(16))


class LensAdvantageTest(absltest.TestCase):

  def test_advantages_and_row_weights(self):
    config = lens.get_config("smoke")
    config.rollout.group_size = 4
    # Group 0: one original success (row 0), a transferred one (row 2), ā = 1/4: weights
    # 1/4 on the original success, 3/4 on the rest. Group 1 has no transferred row: weight 1.
    reward = jnp.array([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    guided = jnp.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    batch = types.Batch(tokens_BT=jnp.zeros((8, 3), jnp.int32),
                        positions_BT=jnp.zeros((8, 3), jnp.int32),
                        input_mask_BT=jnp.ones((8, 3), bool), loss_mask_BT=jnp.ones((8, 3)),
                        turn_BT=jnp.zeros((8, 3), jnp.int32), reward_B=reward)
    out, metrics = lens.make_advantage_fn(config)(batch, {"guided_B": guided})
    np.testing.assert_allclose(out.aux["row_weight_B"], [0.25, 0.75, 0.75, 0.75] + [1.0] * 4)
    np.testing.assert_array_equal(out.aux["guided_B"], guided)
    adv = np.asarray(out.adv_BT)[:, 0]
    np.testing.assert_array_equal(adv[[0, 2]] > 0, True)     # GRPO over the rebuilt group
    np.testing.assert_array_equal(adv[[1, 3, 4]] < 0, True)
    self.assertEqual(float(metrics["groups_with_signal"]), 1.0)
    np.testing.assert_allclose(metrics["crpo_weight_mean"], 6.5 / 8)  # (1/4 + 3·3/4 + 4) / 8


if __name__ == "__main__":
  absltest.main()
