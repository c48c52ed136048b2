"""Tests for agentrl.rollout.anytime: the cut contexts of `sample_partial_cot`, the format
check of `compute_reward_and_correct_answer`, and a scripted two-phase rollout."""
from absl.testing import absltest
import jax
import numpy as np

from agentrl.envs import arithmetic
from agentrl.envs import verbose_arithmetic as verbose
from agentrl.rollout import agent_loop
from agentrl.rollout import anytime
from agentrl.rollout import continuations

END = 9  # think-end id in the unit cases


class CutContextTest(absltest.TestCase):

  def test_official_cut_rule(self):
    prompt = [1, 2]
    # Closed thinking of 3 ids (the third is think-end): cut at budget 2, complete at 3 and 8.
    closed = [5, 5, END]
    self.assertEqual(anytime.cut_context(prompt, closed, 2, think_end_id=END), [1, 2, 5, 5, END])
    self.assertEqual(anytime.cut_context(prompt, closed, 3, think_end_id=END), [1, 2, 5, 5, END])
    self.assertEqual(anytime.cut_context(prompt, closed, 8, think_end_id=END), [1, 2, 5, 5, END])
    # A thinking that never closed always gets think-end appended, also when it is short.
    open_ = [5, 5, 5, 5]
    self.assertEqual(anytime.cut_context(prompt, open_, 2, think_end_id=END), [1, 2, 5, 5, END])
    self.assertEqual(anytime.cut_context(prompt, open_, 8, think_end_id=END),
                     [1, 2, 5, 5, 5, 5, END])
    self.assertEqual(anytime.cut_context(prompt, [], 4, think_end_id=END), [1, 2, END])

  def test_summary_score_format_check(self):
    self.assertEqual(anytime.summary_score(1.0, [5, END, 7], think_end_id=END,
                                           thinking_ends_on_eos=False), 1.0)
    # Two think-ends (the summary reopened one), or none: not formatted.
    self.assertEqual(anytime.summary_score(1.0, [5, END, END, 7], think_end_id=END,
                                           thinking_ends_on_eos=False), 0.0)
    self.assertEqual(anytime.summary_score(1.0, [5, 7], think_end_id=END,
                                           thinking_ends_on_eos=False), 0.0)
    # A thinking that ended on EOS scores 0 whatever the summary.
    self.assertEqual(anytime.summary_score(1.0, [5, END, 7], think_end_id=END,
                                           thinking_ends_on_eos=True), 0.0)


class ScriptedEngine:
  """Stands in for `Engine.run`: each episode's full response is script(context ids); the
  engine cuts it at the first stop id of `tok` or at max_new_tokens, as the real one."""

  def __init__(self, script):
    self.script, self.calls = script, []

  def run(self, params, tok, envs, seeds, *, rng, max_turns, max_new_tokens, max_len,
          chat_template, temperature=1.0, greedy=False, **kw):
    del params, rng, max_turns, temperature, greedy, kw
    assert not chat_template
    stops = set(tok.end_of_turn_ids) | {tok.eos_id}
    self.calls.append((max_new_tokens, sorted(stops)))
    trajs = []
    for env, seed in zip(envs, seeds):
      context = tok.encode(env.reset(seed), add_bos=True)
      ids = []
      for t in self.script(context)[:max_new_tokens]:
        ids.append(t)
        if t in stops:
          break
      env.step(tok.decode([t for t in ids if t not in stops]))
      n = len(context) + len(ids)
      assert n <= max_len
      trajs.append(agent_loop.Trajectory(
          tokens=np.asarray(context + ids, np.int32),
          loss_mask=np.r_[np.zeros(len(context)), np.ones(len(ids))].astype(np.float32),
          turn=np.r_[np.full(len(context), -1), np.zeros(len(ids))].astype(np.int32),
          sampler_logp=np.zeros(n, np.float32), turn_rewards=[0.0], reward=0.0, done=True,
          truncated=False, prompt_len=len(context)))
    return trajs, {"rollout/sampled_tokens": float(sum(t.loss_mask.sum() for t in trajs))}


class RunTest(absltest.TestCase):

  def test_two_phase_rollout_on_the_verbose_task(self):
    tok = verbose.build_tokenizer(3)
    dot, end = verbose.single_id(tok, "."), verbose.single_id(tok, ">")
    answer = arithmetic.make_problem(7)["answer"]
    gold, wrong = tok.encode(answer) + [tok.eos_id], tok.encode("0000") + [tok.eos_id]
    prompt = tok.encode(arithmetic.make_problem(7)["prompt"], add_bos=True)
    thinking = {0: [dot, dot, end] + gold,       # closes after 2 dots (the engine stops at ">")
                1: [dot] * 9,                    # never closes: cut by the budget b_{S-1} = 6
                2: [dot, tok.eos_id]}            # ends on EOS without closing
    row = iter(range(3))

    def script(context):
      if context == prompt:                      # thinking phase: rows in order
        return thinking[next(row)]
      # Summary phase: correct after at least 3 dots of thinking, else wrong.
      return gold if context.count(dot) >= 3 else wrong

    engine = ScriptedEngine(script)
    out = anytime.run(engine, None, tok, verbose.VerboseArithmeticEnv, [7], group_size=3,
                      budgets=[2, 4, 6], num_summaries=2, summary_tokens=8, think_end_id=end,
                      rng=jax.random.key(0), max_len=32)
    # Thinking phase: budget b_{S-1}, with ">" as an extra stop id; summaries stop at EOS.
    self.assertEqual(engine.calls[0], (6, sorted({tok.eos_id, end})))
    self.assertEqual(engine.calls[1], (8, [tok.eos_id]))
    sampled = [list(t.tokens[t.prompt_len:]) for t in out.thinking]
    self.assertEqual(sampled, [[dot, dot, end], [dot] * 6, [dot, tok.eos_id]])
    # Contexts: row-major (row, slot, summary); A = 2 summaries share each slot's context.
    self.assertLen(out.summaries, 3 * 3 * 2)
    contexts = [list(t.tokens[:t.prompt_len]) for t in out.summaries]
    expected = [prompt + [dot, dot, end]] * 6                                  # row 0
    expected += [prompt + [dot] * b + [end] for b in (2, 4, 6) for _ in range(2)]   # row 1
    expected += [prompt + [dot, tok.eos_id, end]] * 6                          # row 2
    self.assertEqual(contexts, expected)
    for t in out.summaries:                      # loss on the summary only
      np.testing.assert_array_equal(t.loss_mask, np.r_[np.zeros(t.prompt_len),
                                                       np.ones(len(t.tokens) - t.prompt_len)])
    # Scores: row 0 thinks 2 dots (wrong summaries), row 1 is right from budget 4 on, row 2
    # ended its thinking on EOS (0 whatever the summary).
    np.testing.assert_array_equal(out.score_BSA[..., 0], [[0, 0, 0], [0, 1, 1], [0, 0, 0]])
    np.testing.assert_array_equal(out.score_BSA[..., 0], out.score_BSA[..., 1])
    self.assertEqual(out.metrics["rollout/sampled_tokens"],
                     3 + 6 + 2 + sum(t.loss_mask.sum() for t in out.summaries))

  def test_continuations_are_token_in_token_out(self):
    tok = verbose.build_tokenizer(3)
    contexts = [[tok.bos_id, 4, 4], [tok.bos_id, 9]]
    engine = ScriptedEngine(lambda context: [len(context) + 5, tok.eos_id])
    trajs, _ = continuations.sample_continuations(engine, None, tok, contexts,
                                                  rng=jax.random.key(0), max_new_tokens=4)
    self.assertEqual([list(t.tokens) for t in trajs],
                     [[tok.bos_id, 4, 4, 8, tok.eos_id], [tok.bos_id, 9, 7, tok.eos_id]])
    self.assertEqual(continuations.sample_continuations(
        engine, None, tok, [], rng=jax.random.key(0), max_new_tokens=4), ([], {}))


if __name__ == "__main__":
  absltest.main()
