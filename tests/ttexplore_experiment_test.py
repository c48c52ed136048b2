# pylint: disable=invalid-name
"""experiments/ttexplore.py: only the kept thought carries advantage and loss.

Episodes are the thinker env's expert demonstrations (the SFT data's token layout), rendered
with the experiment's own tokenizer; one thought per trajectory is kept as in the rollout.
"""
import importlib
import random

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl import recipe
from agentrl import types
from agentrl.envs import thinker
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import pack

ttexplore = importlib.import_module("experiments.ttexplore")


def _config():
  config = ttexplore.get_config("smoke")
  config.task.max_turns = 7
  config.rollout.update(group_size=2, max_len=96)
  return config


def _episodes(config, tok, seeds, wrong_first_command=()):
  """Demonstrations of `seeds` with one kept thought each; a seed in wrong_first_command
  replays its expert with a first guess of 1 (a different, still valid game)."""
  make_env, trajs, kept = ttexplore.make_thinker_env(config), [], []
  rng = np.random.default_rng(0)
  for i, seed in enumerate(seeds):
    env = make_env()
    actions = env.demonstration(seed, random.Random(seed))
    if i in wrong_first_command:
      actions = ["guess 1"] + actions[1:]
    traj = agent_loop.scripted(tok, env, seed, actions, chat_template=False)
    traj.loss_mask, turn = thinker.keep_one_thought(traj.turn, traj.loss_mask, traj.infos, rng)
    trajs.append(traj)
    kept.append(turn)
  return trajs, kept


def _batch(trajs, tok, T):
  b = pack.pack_numpy(trajs, max_len=T, pad_id=tok.pad_id, min_len=T)
  return types.Batch(**{k: jnp.asarray(getattr(b, k)) for k in (
      "tokens_BT", "positions_BT", "input_mask_BT", "loss_mask_BT", "turn_BT")},
                     reward_B=jnp.asarray(b.reward_B))


class TTExploreTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.config = _config()
    cls.tok = recipe.task_tokenizer(cls.config.task)

  def test_advantage_only_on_the_kept_thought(self):
    # Group 0: the expert solves, the second row's first guess is wasted and it still solves
    # or not; rewards are made to differ. Group 1: the same episode twice (identical).
    trajs, kept = _episodes(self.config, self.tok, [3, 3, 5, 5], wrong_first_command=(1,))
    trajs[1].reward = 0.0   # the outcome the group compares (the thought is what differs)
    batch = _batch(trajs, self.tok, self.config.rollout.max_len)
    out, metrics = ttexplore.make_advantage_fn(self.config)(batch, {})
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

  def test_tokens_after_the_kept_thought_do_not_change_loss_or_gradient(self):
    config = self.config
    trajs, kept = _episodes(config, self.tok, [3, 7])
    batch = _batch(trajs, self.tok, config.rollout.max_len)
    batch = batch.replace(old_logp_BT=jnp.full(batch.tokens_BT.shape, -2.0),
                          adv_BT=jnp.where(batch.loss_mask_BT > 0, 1.0, 0.0))
    after_BT = np.asarray(batch.turn_BT) > np.asarray(kept)[:, None]
    self.assertTrue(after_BT.any())
    changed = batch.replace(tokens_BT=jnp.where(after_BT, 3, batch.tokens_BT))
    cfg = recipe.model_config(config.model, self.tok.vocab_size)
    graphdef, params = nnx.split(transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
    loss_fn = ttexplore.make_loss_fn(config, graphdef)
    (l0, _), g0 = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    (l1, _), g1 = jax.value_and_grad(loss_fn, has_aux=True)(params, changed)
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g0, g1)



if __name__ == "__main__":
  absltest.main()
