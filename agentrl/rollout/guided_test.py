"""Tests for agentrl.rollout.guided: the splice of a guided row under its original prompt, the
group layout, and a real engine run whose spliced rows score like a direct forward."""
from absl.testing import absltest
from flax import nnx
import jax
import numpy as np

from agentrl.envs import arithmetic
from agentrl.models import policy as policy_lib
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import guided


def _traj(prompt, turns):
  """A row: `prompt`, then per turn (sampled ids, observation ids); log-prob −(k+1) on the
  k-th sampled id."""
  tokens, mask, turn, logp = list(prompt), [0.0] * len(prompt), [-1] * len(prompt), []
  logp = [0.0] * len(prompt)
  k = 0
  for u, (ids, obs) in enumerate(turns):
    tokens += list(ids) + list(obs)
    mask += [1.0] * len(ids) + [0.0] * len(obs)
    turn += [u] * (len(ids) + len(obs))
    logp += [-(k + i + 1.0) for i in range(len(ids))] + [0.0] * len(obs)
    k += len(ids)
  return agent_loop.Trajectory(
      tokens=np.asarray(tokens, np.int32), loss_mask=np.asarray(mask, np.float32),
      turn=np.asarray(turn, np.int32), sampler_logp=np.asarray(logp, np.float32),
      turn_rewards=[1.0], reward=1.0, done=True, truncated=False, prompt_len=len(prompt))


class HintTokenizer:
  """Ids: 0 pad, 1 bos, 2 eos, 3 end of turn; a character c is 4 + ord(c) % 60."""
  pad_id, bos_id, eos_id, end_of_turn_ids, vocab_size = 0, 1, 2, [3], 64

  def encode(self, text, add_bos=False):
    return ([self.bos_id] if add_bos else []) + [4 + ord(c) % 60 for c in text]

  def decode(self, ids):
    return "".join(chr(97 + int(t) % 26) for t in ids if int(t) >= 4)


class QuestionEnv:
  """reset(seed) -> 'q<seed>'; any answer ending in 'a' scores 1."""
  system_prompt = ""
  max_turns = 1

  def reset(self, seed):
    return f"q{seed}"

  def step(self, action):
    win = action.endswith("a")
    return "", float(win), True, {"reward": float(win), "success": win}


class RepromptTest(absltest.TestCase):

  def test_spliced_positions_masks_and_logps(self):
    # Guided prompt [9, 8, 7, 5, 6] (hint 9 8 7 before the original 5 6), two turns.
    traj = _traj([9, 8, 7, 5, 6], [([20, 21], [30]), ([22], [])])
    out = guided.reprompt(traj, [5, 6])
    np.testing.assert_array_equal(out.tokens, [5, 6, 20, 21, 30, 22])
    np.testing.assert_array_equal(out.loss_mask, [0, 0, 1, 1, 0, 1])
    np.testing.assert_array_equal(out.turn, [-1, -1, 0, 0, 0, 1])
    np.testing.assert_array_equal(out.sampler_logp, [0, 0, -1, -2, 0, -3])
    self.assertEqual(out.prompt_len, 2)
    self.assertEqual(out.reward, traj.reward)
    # A longer original prompt (Lens: the sampler saw a purified, shorter one).
    longer = guided.reprompt(_traj([5], [([20], [])]), [4, 4, 5])
    np.testing.assert_array_equal(longer.tokens, [4, 4, 5, 20])
    np.testing.assert_array_equal(longer.loss_mask, [0, 0, 0, 1])

  def test_branches_are_refused(self):
    traj = _traj([5], [([20], [])])
    traj.parent, traj.fork_at = 0, 1
    with self.assertRaisesRegex(ValueError, "root"):
      guided.reprompt(traj, [5])

  def test_group_layout(self):
    self.assertEqual(guided.group_layout(["a0", "a1", "b0", "b1"], ["A", "B"], 2),
                     ["a0", "a1", "A", "b0", "b1", "B"])
    with self.assertRaisesRegex(ValueError, "split"):
      guided.group_layout(["a"], ["A", "B"], 2)

  def test_guided_env_rewrites_only_the_first_observation(self):
    env = guided.GuidedEnv(QuestionEnv(), lambda obs, seed: f"hint{seed}:{obs}", examples=())
    self.assertEqual(env.reset(3), "hint3:q3")
    self.assertEqual(env.step("ba")[1], 1.0)
    self.assertEqual(env.max_turns, 1)


class DemonstrationTest(absltest.TestCase):

  def test_demonstrations_and_the_gold_answer(self):
    solved = lambda seed: "".join(arithmetic.make_problem(seed)[k] for k in ("prompt", "answer"))
    rewrite = guided.demonstration_rewrite(arithmetic.ArithmeticEnv, shots=2, seed_base=100,
                                           sep="|")
    self.assertEqual(rewrite("Q", 5), solved(100) + "|" + solved(101) + "|Q")
    gold = guided.demonstration_rewrite(arithmetic.ArithmeticEnv, shots=0, seed_base=100,
                                        gold=True)
    self.assertEqual(gold("Q", 5), solved(5) + "Q")
    tagged = guided.demonstration_rewrite(arithmetic.ArithmeticEnv, shots=1, seed_base=100,
                                          answer_prefix=" A: ")
    problem = arithmetic.make_problem(100)
    self.assertEqual(tagged("Q", 5), problem["prompt"] + " A: " + problem["answer"] + "Q")
    with self.assertRaisesRegex(ValueError, "shots"):
      guided.demonstration_rewrite(arithmetic.ArithmeticEnv, shots=0, seed_base=0)
    with self.assertRaisesRegex(ValueError, "target"):
      guided.solved_example(QuestionEnv, 0)


class EngineTest(absltest.TestCase):
  """Through the real engine: the guided rows' sampler log-probs are a forward of the GUIDED
  sequence, and the stored rows' log-probs are a direct forward of the ORIGINAL one."""

  def test_real_engine(self):
    cfg = transformer.Config.named("tiny", vocab=HintTokenizer.vocab_size)
    model = transformer.Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    engine = engine_lib.Engine(graphdef, pad_id=0, slots=4, chunk=8)
    tok = HintTokenizer()
    rewrite = lambda obs, seed: f"hint {seed} " + obs
    out = guided.guided_rollout(engine, params, tok, QuestionEnv, [3, 4], rewrite=rewrite,
                                num_guided=1, rng=jax.random.key(0), group_size=2,
                                max_turns=1, max_new_tokens=5, max_len=32, temperature=1.0,
                                chat_template=False, min_len=32)
    np.testing.assert_array_equal(out.extras["guided_B"], [0, 1, 0, 1])
    self.assertIn("rollout/guided_reward", out.metrics)
    batch = out.batch
    logp = np.asarray(policy_lib.token_logprobs(model, batch.tokens_BT, batch.positions_BT,
                                                batch.input_mask_BT))
    for i, traj in enumerate(out.trajectories):
      seed = [3, 4][i // 2]
      prompt = tok.encode(f"q{seed}", add_bos=True)
      np.testing.assert_array_equal(traj.tokens[:len(prompt)], prompt)
      sampled = traj.tokens[len(prompt):]
      on = traj.loss_mask > 0
      # The stored row is exactly the original prompt + the sampled ids: its log-probs in the
      # batch are those of a forward of that sequence built by hand.
      seq = np.asarray(prompt + list(sampled))
      want = np.asarray(policy_lib.token_logprobs(model, seq[None], np.arange(len(seq))[None],
                                                  np.ones((1, len(seq)), bool)))[0]
      np.testing.assert_allclose(logp[i, :len(seq)][on], want[on], atol=1e-5)
      if i % 2 == 1:   # guided: the sampler's log-probs are the guided context's forward
        hinted = np.asarray(tok.encode(rewrite(f"q{seed}", seed), add_bos=True) + list(sampled))
        n = len(hinted)
        g = policy_lib.token_logprobs(model, hinted[None], np.arange(n)[None],
                                      np.ones((1, n), bool))
        g = np.asarray(g)[0][len(hinted) - len(sampled):]
        np.testing.assert_allclose(traj.sampler_logp[on], g[on[len(prompt):]], atol=1e-4)
        self.assertFalse(np.allclose(traj.sampler_logp[on], logp[i, :len(traj.tokens)][on],
                                     atol=1e-4))
      else:
        np.testing.assert_allclose(traj.sampler_logp[on], logp[i, :len(traj.tokens)][on],
                                   atol=1e-4)


if __name__ == "__main__":
  absltest.main()
