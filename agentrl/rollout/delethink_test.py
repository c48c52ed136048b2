"""Tests for agentrl.rollout.delethink: the chunk schedule of the official agent loop, bounded
contexts, token-in/token-out carry-overs, and a run through the real rollout engine."""
import dataclasses

from absl.testing import absltest
from flax import nnx
import jax
import numpy as np

from agentrl.envs import base
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import delethink
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import pack

EOS = 2


class ByteTokenizer:
  """Ids 0-2 special (pad, bos, eos), 3 end-of-turn; 4-127 decode lossily to letters, so a
  decoded-and-re-encoded carry-over would not be the sampled ids."""

  pad_id, bos_id, eos_id, end_of_turn_ids, vocab_size = 0, 1, EOS, [3], 128

  def __init__(self):
    self.encoded = []

  def encode(self, text, add_bos=False):
    self.encoded.append(text)
    return ([self.bos_id] if add_bos else []) + [4 + ord(c) % 100 for c in text]

  def decode(self, ids):
    return "".join(chr(97 + int(t) % 26) for t in ids if int(t) >= 4)

  def apply_chat_template(self, messages, add_generation_prompt=True):
    return "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]"


class AnswerEnv:
  """Single-turn task: reset(seed) -> 'question <seed>'; step(text) scores 1 if text ends 'z'."""
  system_prompt = ""
  max_turns = 1

  def __init__(self):
    self.actions = []

  def reset(self, seed):
    return f"question {seed}"

  def step(self, action):
    self.actions.append(action)
    win = action.endswith("z")
    return "", float(win), True, base.make_info(reward=float(win), success=win)


class ScriptedEngine:
  """Stands in for `Engine.run`: each episode samples ids 10, 11, ... (one counter per trace,
  across chunks), and emits EOS as the `stop_at`-th sampled id of its trace."""

  def __init__(self, stop_at, prompt_len):
    self.stop_at, self.prompt_len = stop_at, prompt_len
    self.calls, self.sampled = [], {}

  def run(self, params, tok, envs, seeds, *, rng, max_turns, max_new_tokens, max_len, greedy,
          chat_template, **kw):
    del params, rng, greedy, kw
    assert max_turns == 1 and not chat_template
    trajs = []
    for env, seed in zip(envs, seeds):
      context = tok.encode(env.reset(seed), add_bos=True)
      key = tuple(context[:self.prompt_len])              # the trace's prompt
      done_so_far = self.sampled.get(key, 0)
      ids = []
      while len(ids) < max_new_tokens:
        n = done_so_far + len(ids) + 1
        ids.append(EOS if n == self.stop_at.get(key) else 10 + n % 90)
        if ids[-1] == EOS:
          break
      self.sampled[key] = done_so_far + len(ids)
      self.calls.append((list(context), list(ids), max_new_tokens, max_len))
      env.step(tok.decode(ids))
      n = len(context) + len(ids)
      trajs.append(agent_loop.Trajectory(
          tokens=np.asarray(context + ids, np.int32),
          loss_mask=np.r_[np.zeros(len(context)), np.ones(len(ids))].astype(np.float32),
          turn=np.r_[np.full(len(context), -1), np.zeros(len(ids))].astype(np.int32),
          sampler_logp=np.r_[np.zeros(len(context)), np.full(len(ids), -0.5)].astype(np.float32),
          turn_rewards=[0.0], reward=0.0, done=True, truncated=False,
          prompt_len=len(context)))
      assert n <= max_len
    return trajs, {"rollout/sampled_tokens": float(sum(len(c[1]) for c in self.calls))}


class DelethinkScheduleTest(absltest.TestCase):

  def _run(self, stop_at, **kw):
    tok = ByteTokenizer()
    prompts = {s: [tok.bos_id] + ByteTokenizer().encode(f"question {s}") for s in range(3)}
    engine = ScriptedEngine({tuple(p): stop_at[s] for s, p in prompts.items()},
                            len(prompts[0]))
    envs = [AnswerEnv() for _ in range(3)]
    kw = dict(dict(chunk_size=8, keep_head=1, max_chunks=4, chat_template=False), **kw)
    traces, metrics = delethink.run(engine, None, tok, envs, [0, 1, 2], rng=jax.random.key(0),
                                    **kw)
    return traces, metrics, engine, envs, prompts, tok

  def test_chunk_budgets_carry_over_and_stops(self):
    # C = 8, keep_head 1, keep_tail 8/2 - 1 = 3, later chunks sample up to 4 ids, I = 4.
    # Trace 0 stops inside chunk 0, trace 1 in its third chunk, trace 2 never stops.
    traces, metrics, engine, envs, prompts, tok = self._run({0: 5, 1: 15, 2: None})
    self.assertEqual([len(t.chunks) for t in traces], [1, 3, 4])
    self.assertEqual([t.truncated for t in traces], [False, False, True])
    self.assertEqual([c[2] for c in engine.calls], [8, 8, 8, 4, 4, 4, 4, 4])
    t = traces[2]
    sampled = [list(c.tokens[c.prompt_len:]) for c in t.chunks]
    self.assertEqual([len(s) for s in sampled], [8, 4, 4, 4])
    # Carry-over: chunk 0's first id, then the last 3 ids of (previous carry + chunk).
    carry = sampled[0][:1] + sampled[0][-3:]
    for k in (1, 2, 3):
      context = list(t.chunks[k].tokens[:t.chunks[k].prompt_len])
      self.assertEqual(context, prompts[2] + carry)
      carry = delethink.carry_over(carry + sampled[k], keep_head=1, keep_tail=3)
      self.assertEqual(carry[0], sampled[0][0])           # the head is always chunk 0's
    # Bounded context: at most prompt + C ids in any chunk, however long the trace.
    for tr in traces:
      for c in tr.chunks:
        self.assertLessEqual(c.prompt_len, len(prompts[0]) + 1 + 3)
        self.assertLessEqual(len(c.tokens), len(prompts[0]) + 8)
    self.assertEqual(t.trace_len, 20)                      # more than any single context
    self.assertEqual(metrics["delethink/chunks_mean"], 8 / 3)
    self.assertEqual(metrics["rollout/truncated_frac"], 1 / 3)
    # Only the prompts were ever encoded: carry-overs are ids, never re-tokenized text.
    self.assertEqual(tok.encoded, ["question 0", "question 1", "question 2"])

  def test_reward_scores_the_last_chunk_with_its_carry_over(self):
    traces, _, _, envs, _, tok = self._run({0: 5, 1: 15, 2: None})
    for t, env in zip(traces, envs):
      last = t.chunks[-1]
      ids = [int(x) for x in last.tokens[t.prompt_len:]]
      ids = ids[:-1] if ids[-1] == EOS else ids
      self.assertEqual(env.actions, [tok.decode(ids)])
      self.assertEqual(t.reward, float(tok.decode(ids).endswith("z")))
      for k, c in enumerate(t.chunks):
        self.assertEqual((c.reward, c.turn_rewards, c.done, c.truncated),
                         (t.reward, [t.reward], t.done, t.truncated))
        np.testing.assert_array_equal(c.turn[:c.prompt_len], -1)
        np.testing.assert_array_equal(c.turn[c.prompt_len:], k)
        np.testing.assert_array_equal(c.loss_mask, np.arange(len(c.tokens)) >= c.prompt_len)

  def test_chunk_rows_owner_and_pack(self):
    traces, _, _, _, _, _ = self._run({0: 5, 1: 15, 2: None})
    rows, owner = delethink.chunk_rows(traces)
    np.testing.assert_array_equal(owner, [0, 1, 1, 1, 2, 2, 2, 2])
    batch = pack.pack(rows, max_len=64, pad_id=0)
    np.testing.assert_array_equal(np.asarray(batch.loss_mask_BT).sum(-1),
                                  [c.loss_mask.sum() for c in rows])
    np.testing.assert_array_equal(np.asarray(batch.reward_B), [traces[i].reward for i in owner])

  def test_official_defaults_and_validation(self):
    traces, _, engine, _, _, _ = self._run({0: 2, 1: 2, 2: 2}, chunk_size=8192,
                                           keep_head=100, max_chunks=5)
    self.assertEqual(engine.calls[0][2], 8192)
    self.assertTrue(all(len(t.chunks) == 1 for t in traces))
    with self.assertRaisesRegex(ValueError, "keep_head"):
      self._run({0: 2, 1: 2, 2: 2}, chunk_size=8, keep_head=4, keep_tail=4)
    with self.assertRaisesRegex(ValueError, "more than"):
      delethink.carry_over([1, 2, 3], keep_head=1, keep_tail=2)


class DelethinkEngineTest(absltest.TestCase):
  """Through the real engine and the tiny transformer: ids in, ids out, contexts bounded."""

  def test_real_engine(self):
    graphdef, params = nnx.split(
        transformer.Transformer(transformer.Config.named("tiny"), rngs=nnx.Rngs(0)))
    engine = engine_lib.Engine(graphdef, pad_id=0, slots=4, chunk=8)
    recorded = []

    class Spy:
      def run(self, *args, **kw):
        trajs, metrics = engine.run(*args, **kw)
        recorded.append([dataclasses.replace(t) for t in trajs])
        return trajs, metrics

    tok = ByteTokenizer()
    envs = [AnswerEnv() for _ in range(4)]
    traces, metrics = delethink.run(Spy(), params, tok, envs, [0, 0, 1, 1],
                                    rng=jax.random.key(1), chunk_size=12, keep_head=2,
                                    max_chunks=3, temperature=1.0)
    prompt_len = traces[0].prompt_len
    for t in traces:
      self.assertEqual(t.prompt_len, len(tok.apply_chat_template(
          [{"role": "user", "content": "question 0"}])))
      for k, c in enumerate(t.chunks):
        self.assertLessEqual(c.prompt_len, prompt_len + 6)       # prompt + carry-over m
        self.assertLessEqual(len(c.tokens), prompt_len + 12)     # prompt + C
        # The chunk's ids are the engine's sampled ids, with its log-probs.
        engine_traj = next(r for r in recorded[k]
                           if np.array_equal(r.tokens[:c.prompt_len], c.tokens[:c.prompt_len])
                           and np.array_equal(r.tokens, c.tokens))
        np.testing.assert_array_equal(c.sampler_logp, engine_traj.sampler_logp)
        self.assertTrue(np.all(c.sampler_logp[c.prompt_len:] < 0))
    self.assertGreater(metrics["delethink/chunks_mean"], 1.0)   # carry-overs were exercised
    self.assertEqual(metrics["rollout/sampled_tokens"], sum(t.trace_len for t in traces))
    self.assertEqual(metrics["env/resets"], 4)
    self.assertEqual(metrics["env/steps"], 4)


if __name__ == "__main__":
  absltest.main()
