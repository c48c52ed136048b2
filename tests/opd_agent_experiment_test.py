# pylint: disable=invalid-name
"""experiments/distill/opd_agent.py: multi-turn distillation's masks, teachers and curriculum.

Env (observation) tokens get zero loss weight; the score step's teacher log-probs of the
student's tokens equal a direct forward (the teacher run's, and OPSD's privileged self-teacher
on a hand-built privileged row); OPSD's teacher view aligns token for token (a golden case and
a real game transcript); its forward KL matches a NumPy reference from full logits; TCOD-f2b
stops episodes at the cap, and TCOD-b2f's episodes start with the scripted expert's turns.
"""
import importlib
import random

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl.harness import recipe
from agentrl.models import policy as policy_lib
from agentrl.models import testing
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import pack
from agentrl import sharding
from agentrl import types

opd_agent = importlib.import_module("experiments.distill.opd_agent")

CFG = transformer.Config.named("tiny", vocab=16, width=16, depth=1, heads=2, kv_heads=2,
                               head_dim=8, mlp=32)


def _config(**loss):
  config = opd_agent.get_config("smoke")
  config.rollout.group_size = 2
  config.loss.update(**loss)
  return config


def _golden_batch():
  """Two rows: prompt [1, 5], policy 6, env 7, policy 8 (row 0); prompt [1, 4, 5], policy 6."""
  tokens = np.array([[1, 5, 6, 7, 8, 0], [1, 4, 5, 6, 0, 0]], np.int32)
  input_mask = tokens > 0
  loss_mask = np.array([[0, 0, 1, 0, 1, 0], [0, 0, 0, 1, 0, 0]], np.float32)
  aux = {"context_ids_BX": np.array([[9, 10, 0], [11, 0, 0]], np.int32),
         "context_mask_BX": np.array([[1, 1, 0], [1, 0, 0]], bool),
         "response_start_B": np.array([2, 3], np.int32)}
  T = tokens.shape[1]
  return types.Batch(tokens_BT=jnp.asarray(tokens),
                     positions_BT=jnp.asarray(np.where(input_mask, np.arange(T), 0)),
                     input_mask_BT=jnp.asarray(input_mask), loss_mask_BT=jnp.asarray(loss_mask),
                     reward_B=jnp.asarray([1.0, 0.0]), aux=jax.tree.map(jnp.asarray, aux))


class TeacherViewTest(absltest.TestCase):

  def test_golden_privileged_view(self):
    view = opd_agent.teacher_view(_golden_batch())
    # Row 0: context [9, 10], then the student's tokens from column 2 on (6, 7, 8).
    np.testing.assert_array_equal(view.tokens_BT[0, :5], [9, 10, 6, 7, 8])
    np.testing.assert_array_equal(view.tokens_BT[1, :2], [11, 6])
    np.testing.assert_array_equal(view.input_mask_BT[:, :6],
                                  [[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(view.positions_BT[0, :5], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(view.aligned_BT, [[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 0, 0]])
    np.testing.assert_array_equal(view.index_BT, [[0, 0, 2, 3, 4, 0], [0, 0, 0, 1, 0, 0]])
    tokens = np.asarray(_golden_batch().tokens_BT)
    got = np.take_along_axis(np.asarray(view.tokens_BT), np.asarray(view.index_BT), 1)
    np.testing.assert_array_equal(np.where(view.aligned_BT, got, -1),
                                  np.where(view.aligned_BT, tokens, -1))

  def test_game_transcript_aligns_token_for_token(self):
    config = _config(method="opsd")
    make_env, tok = recipe.make_task(config.task), recipe.task_tokenizer(config.task)
    render = agent_loop.Renderer(tok, chat_template=False, system_prompt=None)
    env = make_env()
    trajs = [agent_loop.scripted(tok, make_env(), 3, ["guess 50", "guess 25"],
                                 chat_template=False)] * 2
    aux = opd_agent.privileged_context(trajs, [3], make_env, render, "{obs} the secret is "
                                       "{answer}", group_size=2, pad_id=tok.pad_id)
    obs = env.reset(3)
    context = render.prompt(f"{obs} the secret is {env.answer}", "", ())
    self.assertEqual(tok.decode(context[1:]), f"{obs} the secret is 31")
    start = len(render.prompt(obs, "", ()))
    np.testing.assert_array_equal(aux["response_start_B"], [start, start])
    batch = pack.pack_numpy(trajs, max_len=64, pad_id=tok.pad_id, min_len=64)
    view = opd_agent.teacher_view(batch.replace(aux=aux))
    n = len(trajs[0].tokens)
    want = context + list(trajs[0].tokens[start:])
    np.testing.assert_array_equal(view.tokens_BT[0, :len(want)], want)
    self.assertEqual(int(view.input_mask_BT[0].sum()), len(want))
    np.testing.assert_array_equal(np.asarray(view.aligned_BT[0]),
                                  (np.arange(64) >= start) & (np.arange(64) < n))
    # Every policy token is aligned: the loss sees all of the student's sampled tokens.
    self.assertTrue(np.all(np.asarray(view.aligned_BT)[batch.loss_mask_BT > 0]))


class ScoreStepTest(absltest.TestCase):

  def test_teacher_run_logprobs_equal_a_direct_forward(self):
    graphdef, params = testing.random_params(CFG, seed=0)
    t_graphdef, t_params = testing.random_params(CFG, seed=1)
    batch = _golden_batch()
    step = jax.jit(opd_agent.make_score_step(_config(), graphdef, t_graphdef))
    scored, _ = step(params, params, t_params, batch)
    direct = policy_lib.token_logprobs(nnx.merge(t_graphdef, t_params), batch.tokens_BT,
                                       batch.positions_BT, batch.input_mask_BT,
                                       temperature=_config().rollout.temperature, impl="xla")
    mask = np.asarray(batch.input_mask_BT)
    np.testing.assert_allclose(np.asarray(scored.aux["teacher_logp_BT"])[mask],
                               np.asarray(direct)[mask], rtol=1e-5, atol=1e-6)

  def test_opsd_teacher_logprobs_equal_a_forward_of_the_privileged_row(self):
    graphdef, params = testing.random_params(CFG, seed=0)
    frozen = testing.random_params(CFG, seed=2)[1]
    batch = _golden_batch()
    config = _config(method="opsd")
    temperature = config.rollout.temperature
    scored, _ = jax.jit(opd_agent.make_score_step(config, graphdef))(params, frozen, None,
                                                                     batch)
    teacher = nnx.merge(graphdef, frozen)
    for row, privileged, cols in ((0, [9, 10, 6, 7, 8], (2, 3, 4)), (1, [11, 6], (3,))):
      tokens = jnp.asarray([privileged])
      direct = policy_lib.token_logprobs(teacher, tokens, jnp.arange(len(privileged))[None],
                                         jnp.ones_like(tokens, bool), temperature=temperature,
                                         impl="xla")[0]
      got = np.asarray(scored.aux["teacher_logp_BT"][row])
      for k, col in enumerate(cols):   # student column col is teacher column len - len(cols) + k
        self.assertAlmostEqual(float(got[col]),
                               float(direct[len(privileged) - len(cols) + k]), places=5)
      unaligned = [c for c in range(6) if c not in cols]
      np.testing.assert_array_equal(got[unaligned], 0.0)

  def test_opsd_forward_kl_matches_numpy_reference(self):
    graphdef, params = testing.random_params(CFG, seed=0)
    frozen = testing.random_params(CFG, seed=3)[1]
    batch = _golden_batch()
    config = _config(method="opsd")
    temp = config.rollout.temperature
    kl_BT, aligned_BT = opd_agent.opsd_kl(config, graphdef, params, frozen, batch)

    def logp(model, tokens):
      t = jnp.asarray([tokens])
      logits = model(t, jnp.arange(len(tokens))[None], jnp.ones_like(t, bool))[0]
      return np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32) / temp, -1))

    student, teacher = nnx.merge(graphdef, params), nnx.merge(graphdef, frozen)
    s = logp(student, [1, 5, 6, 7, 8])
    t = logp(teacher, [9, 10, 6, 7, 8])
    for col in (2, 3, 4):   # predicted by student state col - 1, teacher state col - 1
      want = np.sum(np.exp(t[col - 1]) * (t[col - 1] - s[col - 1]))
      self.assertAlmostEqual(float(kl_BT[0, col]), want, places=4)
    np.testing.assert_array_equal(np.asarray(kl_BT)[~np.asarray(aligned_BT)], 0.0)


class EnvTokensTest(absltest.TestCase):

  def test_env_tokens_get_no_reward_and_no_gradient(self):
    batch = _golden_batch()
    env_BT = np.zeros((2, 6), bool)
    env_BT[0, 3] = True   # the env's reply between row 0's two turns
    nan_BT = jnp.where(env_BT, jnp.nan, 0.0)
    old = jnp.asarray(np.random.default_rng(0).normal(size=(2, 6)), jnp.float32) - 2.0
    teacher = old - 0.5
    clean = batch.replace(old_logp_BT=old, aux={**batch.aux, "teacher_logp_BT": teacher})
    dirty = batch.replace(old_logp_BT=old + nan_BT,
                          aux={**batch.aux, "teacher_logp_BT": teacher + nan_BT})
    advantage = jax.jit(opd_agent.make_advantage_fn(_config()))
    (clean, _), (dirty, _) = advantage(clean, {}), advantage(dirty, {})
    np.testing.assert_array_equal(dirty.adv_BT, clean.adv_BT)
    np.testing.assert_array_equal(np.asarray(clean.adv_BT)[env_BT], 0.0)
    np.testing.assert_allclose(np.asarray(clean.adv_BT)[batch.loss_mask_BT > 0], -0.5,
                               rtol=1e-6)
    graphdef, params = testing.random_params(CFG)
    tx = optax.sgd(1.0)
    state = types.TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params))
    for method in ("opd", "pw_opsd"):
      update = jax.jit(opd_agent.make_update_step(_config(method=method), graphdef, tx))
      a, ma = update(state, clean, params)
      b, mb = update(state, dirty.replace(adv_BT=dirty.adv_BT + nan_BT), params)
      self.assertEqual(float(mb["skipped"]), 0.0, method)
      for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_array_equal(x, y)
      self.assertEqual(float(ma["loss"]), float(mb["loss"]))

  def test_packed_game_turns_mask_env_tokens(self):
    config = _config()
    make_env, tok = recipe.make_task(config.task), recipe.task_tokenizer(config.task)
    traj = agent_loop.scripted(tok, make_env(), 3, ["guess 50", "guess 25"],
                               chat_template=False)
    batch = pack.pack_numpy([traj], max_len=64, pad_id=tok.pad_id, min_len=64)
    env_T = (np.asarray(batch.turn_BT[0]) >= 0) & (batch.loss_mask_BT[0] == 0)
    env_T &= np.asarray(batch.input_mask_BT[0])
    self.assertEqual(tok.decode(list(np.asarray(batch.tokens_BT[0])[env_T])), "lower")
    weights = opd_agent.distill.position_weights(jnp.asarray(batch.loss_mask_BT))
    np.testing.assert_array_equal(np.asarray(weights[0])[env_T], 0.0)


class CurriculumTest(absltest.TestCase):
  """Rollouts of a random tiny policy on the smoke game with 4 turns (it never solves it)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = _config()
    config.task.max_turns = 4
    config.rollout.max_len = 96
    mesh = sharding.make_mesh(config.mesh)
    cls.tok, graphdef, cls.params = recipe.build_policy(config, mesh)
    cls.engine = recipe.rollout_engine(config, graphdef, cls.tok)
    cls.make_env = recipe.make_task(config.task)
    cls.config, cls.mesh = config, mesh

  def _rollout(self, step, **loss):
    config = self.config.copy_and_resolve_references()
    config.loss.update(**loss)
    data = recipe.prompt_stream(self.make_env)
    fn = opd_agent.make_rollout_fn(config, self.engine, self.tok, self.make_env, data,
                                   self.mesh)
    with jax.set_mesh(self.mesh):
      return fn(self.params, jax.random.key(step), step)

  def test_f2b_stops_episodes_at_the_cap(self):
    for step, cap in ((1, 1), (2, 2), (3, 3)):
      out = self._rollout(step, tcod="f2b", tcod_every=1)
      self.assertEqual(out.metrics["tcod/turn_cap"], cap)
      turns = [len(t.turn_rewards) for t in out.trajectories]
      self.assertLessEqual(max(turns), cap)
      self.assertEqual(max(int(t.turn.max()) for t in out.trajectories), cap - 1)
      self.assertTrue(any(t.truncated and n == cap for t, n in zip(out.trajectories, turns)))
    free = self._rollout(1, tcod="none")
    self.assertGreater(max(len(t.turn_rewards) for t in free.trajectories), 1)

  def test_b2f_replays_the_scripted_expert_first(self):
    out = self._rollout(1, tcod="b2f", b2f_every=5)
    rows = recipe.prompt_stream(self.make_env).take(self.config.rollout.prompts_per_step)
    for i, entry in enumerate(rows):
      demo = self.make_env().demonstration(entry["seed"], random.Random(entry["seed"]))
      k = len(demo) - 1   # step 1: all but the expert's last turn
      prefix = agent_loop.scripted(self.tok, self.make_env(), entry["seed"], demo[:k],
                                   chat_template=False, observe_last=True)
      for traj in out.trajectories[2 * i:2 * i + 2]:
        n = len(prefix.tokens)
        np.testing.assert_array_equal(traj.tokens[:n], prefix.tokens)
        np.testing.assert_array_equal(traj.loss_mask[:n], 0.0)
        self.assertEqual(traj.prompt_len, n)
        self.assertGreater(traj.loss_mask[n:].sum(), 0)
        self.assertEqual(traj.turn_rewards[:k], prefix.turn_rewards)
    self.assertGreater(out.metrics["rollout/replayed_turns_mean"], 0.0)


if __name__ == "__main__":
  absltest.main()
