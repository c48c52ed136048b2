"""Forks in the rollout engine are exact: a tiny model on the hidden-rule game.

A greedy branch replays its parent token for token (the copied cache rows, the turn state and
the forked env all equal the source's); sampled branches keep the parent's prefix, draw their
own continuations, sample the trainer's log-probs, and are the same when every prefix is
prefilled again instead of copied, on fewer slots.
A fork inside a single turn prefills nothing.
"""
from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.models import policy
from agentrl.models import transformer
from agentrl.rollout import branching
from agentrl.rollout import engine as engine_lib

TOK = recipe.task_tokenizer(mlc.ConfigDict(dict(name="hidden_rule", family="mixed",
                                                max_turns=3)))
CFG = transformer.Config(vocab=TOK.vocab_size, width=32, depth=2, heads=4, kv_heads=2,
                         head_dim=8, mlp=64, dtype=jnp.float32)
GRAPHDEF, PARAMS = nnx.split(transformer.Transformer(CFG, rngs=nnx.Rngs(0)))
MAKE, CHAT = lambda: registry.make("hidden_rule", family="mixed", max_turns=3), True
KW = dict(max_turns=3, max_new_tokens=8, max_len=420)
SEEDS = [0, 1, 2]


def every_kind(point: branching.ForkPoint) -> list[branching.Fork]:
  """Roots fork twice mid-way through turn 0, once after the env's reply to turn 1, and once
  from the middle of the finished episode (its env replayed)."""
  t = point.trajectory
  if point.depth:
    return []
  if point.kind == "sampled" and point.turn == 0:
    return [branching.Fork(at=point.turn_start + 2, n=2)]
  if point.kind == "stepped" and point.turn == 2:
    return [branching.Fork(at=len(t.tokens))]
  if point.kind == "finished":
    sampled = np.flatnonzero(t.loss_mask)
    return [branching.Fork(at=int(sampled[len(sampled) // 2]))]
  return []


def _run(slots, brancher=every_kind, copy_prefixes=True, **kwargs):
  engine = engine_lib.Engine(GRAPHDEF, pad_id=TOK.pad_id, slots=slots, chunk=3,
                             copy_prefixes=copy_prefixes)
  kw = dict(KW, **kwargs)
  return engine.run(PARAMS, TOK, [MAKE() for _ in SEEDS], SEEDS, chat_template=CHAT,
                    brancher=brancher, **kw)


def _trainer_logps(trajs) -> list[np.ndarray]:
  """The trainer's log-probs of every trajectory, in one forward (right-padded rows)."""
  T = max(len(t.tokens) for t in trajs)
  tokens = np.zeros((len(trajs), T), np.int32)
  mask = np.zeros((len(trajs), T), bool)
  for i, t in enumerate(trajs):
    tokens[i, :len(t.tokens)], mask[i, :len(t.tokens)] = t.tokens, True
  logp = np.asarray(policy.token_logprobs(
      nnx.merge(GRAPHDEF, PARAMS), jnp.asarray(tokens),
      jnp.broadcast_to(jnp.arange(T), (len(trajs), T)), jnp.asarray(mask), temperature=1.0))
  return [logp[i, :len(t.tokens)] for i, t in enumerate(trajs)]


class BranchingEngineTest(absltest.TestCase):

  def test_a_greedy_branch_replays_its_parent(self):
    trajs, metrics = _run(8, rng=jax.random.key(0), greedy=True)
    self.assertLen(trajs, 3 + 3 * 4)
    self.assertEqual(metrics["rollout/branches"], 12.0)
    self.assertEqual([t.parent for t in trajs[:3]], [-1, -1, -1])
    for t in trajs[3:]:
      parent = trajs[t.parent]
      self.assertIn(t.parent, range(3))
      np.testing.assert_array_equal(t.tokens, parent.tokens)
      np.testing.assert_array_equal(t.turn, parent.turn)
      np.testing.assert_allclose(t.sampler_logp, parent.sampler_logp, atol=1e-5)
      self.assertEqual((t.turn_rewards, t.done), (parent.turn_rewards, parent.done))

  def test_sampled_branches_are_exact_copied_or_prefilled(self):
    trajs, copied = _run(8, rng=jax.random.key(1), temperature=1.0)
    # Every branch prefills its prefix again, on fewer slots.
    other, prefilled = _run(2, copy_prefixes=False, rng=jax.random.key(1), temperature=1.0)
    self.assertGreater(copied["rollout/fork_kv_tokens"], 1000)
    self.assertEqual(prefilled["rollout/fork_kv_tokens"], 0)
    # Prefilled again, less what branches of one prefix that start together share.
    self.assertGreater(prefilled["rollout/prefill_tokens"],
                       copied["rollout/prefill_tokens"] + 1000)
    differs = 0
    for t, u, logp in zip(trajs, other, _trainer_logps(trajs)):
      np.testing.assert_array_equal(t.tokens, u.tokens)
      self.assertEqual((t.parent, t.fork_at), (u.parent, u.fork_at))
      sampled = t.loss_mask > 0
      np.testing.assert_allclose(t.sampler_logp[sampled], logp[sampled], atol=1e-5)
      if t.parent >= 0:
        parent = trajs[t.parent]
        np.testing.assert_array_equal(t.tokens[:t.fork_at], parent.tokens[:t.fork_at])
        n = min(len(t.tokens), len(parent.tokens))
        differs += not np.array_equal(t.tokens[t.fork_at:n], parent.tokens[t.fork_at:n])
    self.assertGreater(differs, 6)   # each branch draws with its own key

  def test_a_fork_inside_a_turn_prefills_nothing(self):
    one_turn = dict(max_turns=1, rng=jax.random.key(2))
    fork = lambda p: [branching.Fork(at=p.turn_start, n=3)] if p.kind == "sampled" and \
        not p.depth else []
    plain, _ = _run(16, brancher=None, **one_turn)
    trajs, metrics = _run(16, brancher=fork, **one_turn)
    self.assertLen(trajs, 3 * 4)
    prompts = sum(t.prompt_len - 1 for t in plain)
    self.assertEqual(metrics["rollout/prefill_tokens"], prompts)
    self.assertEqual(metrics["rollout/fork_kv_tokens"], sum(t.fork_at - 1 for t in trajs[3:]))

  def test_a_forced_alternative_and_the_recorded_alternatives(self):
    # LATR's use: fork where the second most likely token was likely, forcing it.
    def second_choice(point):
      t = point.trajectory
      if point.kind != "sampled" or point.depth or point.turn:
        return []
      return [branching.Fork(at=point.turn_start, token=int(t.alternatives[point.turn_start, 1]))]

    trajs, _ = _run(8, brancher=second_choice, max_turns=1, rng=jax.random.key(5),
                    alternatives=2)
    self.assertLen(trajs, 6)
    for t, logp in zip(trajs, _trainer_logps(trajs)):
      sampled = t.loss_mask > 0
      self.assertEqual(t.alternatives.shape, (len(t.tokens), 2))
      np.testing.assert_allclose(t.sampler_logp[sampled], logp[sampled], atol=1e-5)
      # The recorded alternatives are the most likely tokens, log-probs in decreasing order.
      self.assertTrue((t.alternative_logp[sampled, 0] >= t.alternative_logp[sampled, 1]).all())
      self.assertTrue((t.alternative_logp[sampled, 0] >= t.sampler_logp[sampled] - 1e-6).all())
      self.assertTrue((t.alternatives[~sampled] == 0).all())
    for t in trajs[3:]:
      parent = trajs[t.parent]
      self.assertEqual(t.tokens[t.fork_at], parent.alternatives[t.fork_at, 1])
      np.testing.assert_allclose(t.sampler_logp[t.fork_at],
                                 parent.alternative_logp[t.fork_at, 1], atol=1e-5)

  def test_a_bad_fork_is_refused(self):
    endless = lambda p: [branching.Fork(at=p.turn_start)] if p.kind == "sampled" else []
    for bad, message in ((lambda p: [branching.Fork(at=0)], "must index a sampled token"),
                         (lambda p: [(1, 2)], "return branching.Fork"),
                         (lambda p: [branching.Fork(at=p.turn_start, token=10**6)],
                          "not a token id of this model"),
                         (endless, "more than max_branches=192")):
      with self.assertRaisesRegex(ValueError, message):
        _run(4, brancher=bad, max_turns=1, rng=jax.random.key(3))

  def test_an_env_that_cannot_fork_is_refused(self):

    class Plain:   # no clone(), no fresh()
      system_prompt, max_turns = "", 3

      def __init__(self):
        self.game = MAKE()

      def reset(self, seed):
        return self.game.reset(seed)

      def step(self, action):
        return self.game.step(action)

    engine = engine_lib.Engine(GRAPHDEF, pad_id=TOK.pad_id, slots=4, chunk=3)
    with self.assertRaisesRegex(ValueError, r"SafeEnv\(Plain\) cannot be forked for branching"):
      engine.run(PARAMS, TOK, [Plain()], [0], chat_template=CHAT, brancher=every_kind,
                 rng=jax.random.key(4), **KW)


if __name__ == "__main__":
  absltest.main()
