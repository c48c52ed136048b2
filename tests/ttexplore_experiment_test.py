# pylint: disable=invalid-name
"""experiments/agents/ttexplore.py: only the kept thought carries advantage and loss.

Episodes are the thinker env's expert demonstrations (the SFT data's token layout), rendered
with the experiment's own tokenizer; one thought per trajectory is kept as in the rollout.
"""
import importlib
import random

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.envs import thinker
from agentrl.harness import recipe
from agentrl.models import policy as policy_lib
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import pack
from agentrl import types

ttexplore = importlib.import_module("experiments.agents.ttexplore")


def _config():
  config = ttexplore.get_config("smoke")
  config.task.max_turns = 7
  config.rollout.update(group_size=2, max_len=160)
  return config


def _episodes(config, tok, seeds, wrong_first_command=()):
  """Demonstrations of `seeds` with one kept thought each (`keep_thoughts`, as the rollout
  does): (trajectories, kept turn per row, the actor masks [B, T]); a seed in
  wrong_first_command replays its expert with a first guess of 1 (another valid game)."""
  make_env, trajs = ttexplore.make_thinker_env(config), []
  for i, seed in enumerate(seeds):
    env = make_env()
    actions = env.demonstration(seed, random.Random(seed))
    if i in wrong_first_command:
      actions = ["guess 1"] + actions[1:]
    trajs.append(agent_loop.scripted(tok, env, seed, actions, chat_template=False))
  sampled = [t.loss_mask.copy() for t in trajs]
  actor, kept = ttexplore.keep_thoughts(trajs, np.random.default_rng(0),
                                        group_size=config.rollout.group_size,
                                        baseline=config.loss.baseline)
  for t, mask, actor_mask, turn in zip(trajs, sampled, actor, kept):
    turns = sorted(set(t.turn[t.loss_mask > 0]))
    assert turns == [turn] and turn in thinker.thought_turns(t.infos), (turns, turn)
    np.testing.assert_array_equal(actor_mask + t.loss_mask <= mask, True)
  T = config.rollout.max_len
  actor_BT = np.zeros((len(trajs), T), np.float32)
  for b, mask in enumerate(actor):
    actor_BT[b, :len(mask)] = mask
  return trajs, list(kept), {"actor_mask_BT": jnp.asarray(actor_BT),
                             "kept_turn_B": jnp.asarray(kept)}


def _batch(trajs, tok, T):
  b = pack.pack_numpy(trajs, max_len=T, pad_id=tok.pad_id, min_len=T)
  return types.Batch(**{k: jnp.asarray(getattr(b, k)) for k in (
      "tokens_BT", "positions_BT", "input_mask_BT", "loss_mask_BT", "turn_BT")},
                     reward_B=jnp.asarray(b.reward_B))


def _model(config, tok):
  cfg = recipe.model_config(config.model, tok.vocab_size)
  return nnx.split(transformer.Transformer(cfg, rngs=nnx.Rngs(0)))


class TTExploreTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.config = _config()
    cls.tok = recipe.task_tokenizer(cls.config.task)

  @parameterized.parameters("turn", "group")
  def test_advantage_only_on_the_kept_thought(self, baseline):
    # Group 0: the expert solves, the second row's first guess is wasted and it still solves
    # or not; rewards are made to differ. Group 1: the same episode twice (identical).
    config = _config()
    config.loss.baseline = baseline
    trajs, kept, extras = _episodes(config, self.tok, [3, 3, 5, 5], wrong_first_command=(1,))
    if baseline == "turn":   # a group's rows are compared at one shared thought
      self.assertEqual((kept[0], kept[2]), (kept[1], kept[3]))
    trajs[1].reward = 0.0   # the outcome the group compares (the thought is what differs)
    batch = _batch(trajs, self.tok, config.rollout.max_len)
    out, metrics = ttexplore.make_advantage_fn(config)(batch, extras)
    self.assertIs(out.aux["actor_mask_BT"], extras["actor_mask_BT"])
    adv_BT, turn_BT = np.asarray(out.adv_BT), np.asarray(batch.turn_BT)
    sampled_BT = np.asarray(batch.loss_mask_BT) > 0
    for b, turn in enumerate(kept):
      np.testing.assert_array_equal(sampled_BT[b], (turn_BT[b] == turn) & sampled_BT[b])
      self.assertTrue(sampled_BT[b].any())
    np.testing.assert_array_equal(adv_BT[~sampled_BT], 0.0)   # actor, prompt, observations
    np.testing.assert_array_equal(adv_BT[2:], 0.0)            # the identical group
    self.assertGreater(adv_BT[0][sampled_BT[0]].min(), 0.5)   # the winner's thought is pushed up
    self.assertLess(adv_BT[1][sampled_BT[1]].max(), -0.5)
    self.assertEqual(float(metrics["groups_with_signal"]), 0.5)

  def test_tokens_after_the_kept_thought_do_not_change_the_thinker_loss(self):
    config = _config()
    config.loss.actor_kl = 0.0   # the policy-gradient part alone
    trajs, kept, extras = _episodes(config, self.tok, [3, 7])
    actor_BT = extras["actor_mask_BT"]
    batch = _batch(trajs, self.tok, config.rollout.max_len)
    batch = batch.replace(old_logp_BT=jnp.full(batch.tokens_BT.shape, -2.0),
                          ref_logp_BT=jnp.full(batch.tokens_BT.shape, -2.0),
                          adv_BT=jnp.where(batch.loss_mask_BT > 0, 1.0, 0.0),
                          aux={"actor_mask_BT": actor_BT})
    after_BT = np.asarray(batch.turn_BT) > np.asarray(kept)[:, None]
    self.assertTrue(after_BT.any())
    changed = batch.replace(tokens_BT=jnp.where(after_BT, 3, batch.tokens_BT))
    graphdef, params = _model(config, self.tok)
    grad_fn = jax.value_and_grad(ttexplore.make_loss_fn(config, graphdef), has_aux=True)
    (l0, _), g0 = grad_fn(params, batch)
    (l1, _), g1 = grad_fn(params, changed)
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g0, g1)

  def test_actor_anchor_is_zero_at_the_reference_and_k3_on_actor_tokens(self):
    config = self.config
    trajs, _, extras = _episodes(config, self.tok, [3, 7])
    actor_BT = extras["actor_mask_BT"]
    batch = _batch(trajs, self.tok, config.rollout.max_len)
    graphdef, params = _model(config, self.tok)
    logp_BT = policy_lib.token_logprobs(nnx.merge(graphdef, params), batch.tokens_BT,
                                        batch.positions_BT, batch.input_mask_BT)
    batch = batch.replace(old_logp_BT=logp_BT, adv_BT=jnp.where(batch.loss_mask_BT > 0, 1.0, 0.0),
                          aux={"actor_mask_BT": actor_BT})
    loss_fn = ttexplore.make_loss_fn(config, graphdef)
    # The reference is the policy: the anchor and its gradient vanish.
    (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, batch.replace(ref_logp_BT=logp_BT))
    plain = _config()
    plain.loss.actor_kl = 0.0
    (loss0, _), grads0 = jax.value_and_grad(ttexplore.make_loss_fn(plain, graphdef),
                                            has_aux=True)(params, batch.replace(ref_logp_BT=logp_BT))
    self.assertAlmostEqual(float(m["actor_kl"]), 0.0, places=6)
    np.testing.assert_allclose(loss, loss0, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads, grads0)
    # A reference 0.5 nats below on every token: k3 = exp(-d) - 1 + d, d = log pi - log pi_ref.
    _, m = loss_fn(params, batch.replace(ref_logp_BT=logp_BT - 0.5))
    self.assertAlmostEqual(float(m["actor_kl"]), np.exp(-0.5) - 1 + 0.5, places=5)
    self.assertGreater(float(actor_BT.sum()), 0)


if __name__ == "__main__":
  absltest.main()
