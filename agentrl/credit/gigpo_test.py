# pylint: disable=invalid-name
"""Tests for agentrl.credit.gigpo: verl-agent's loops as a float64 reference, hand-computed
numbers and the RL invariants (reduction to GRPO, equal groups, masking, permutations)."""
import collections
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import gigpo

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_gigpo(episode_reward, step_reward, states, group_size, *, gamma, omega, mode, eps=1e-6,
             weight_by_steps=True):
  """verl-agent's `core_gigpo.py` on flat step rows (one row per turn), float64.

  Transliterates `compute_step_discounted_returns`, `episode_norm_reward` (seen_pairs only
  filled when compute_mean_std_cross_steps is False), `build_step_group` (exact states) and
  `step_norm_reward`, then Eq. 8; the result is scattered back to [B, U].
  """
  remove_std = mode == "mean_norm"
  rows = [(b // group_size, b, u, s) for b, traj in enumerate(states)
          for u, s in enumerate(traj) if s is not None]
  ret = {}
  for b, traj in enumerate(states):
    running = 0.0
    for u in reversed([u for u, s in enumerate(traj) if s is not None]):
      running = step_reward[b][u] + gamma * running
      ret[b, u] = running

  def normalise(keys, values, lone_mean_zero):
    by_key = collections.defaultdict(list)
    for k, v in zip(keys, values):
      by_key[k].append(v)
    stats = {}
    for k, vals in by_key.items():
      if len(vals) == 1:
        stats[k] = (0.0 if lone_mean_zero else vals[0], 1.0)
      else:
        stats[k] = (np.mean(vals), np.std(vals, ddof=1))
    return [(v - stats[k][0]) if remove_std else (v - stats[k][0]) / (stats[k][1] + eps)
            for k, v in zip(keys, values)]

  seen, ep_keys, ep_vals = set(), [], []
  for p, b, _, _ in rows:
    if (p, b) in seen:
      continue
    ep_keys.append(p)
    ep_vals.append(episode_reward[b])
    if not weight_by_steps:
      seen.add((p, b))
  ep_stats_rows = normalise(ep_keys, ep_vals, lone_mean_zero=True)
  # Each step row's episode advantage uses its group's statistics: recover them by key.
  ep_adv = {}
  for (k, v), a in zip(zip(ep_keys, ep_vals), ep_stats_rows):
    ep_adv[k, v] = a
  step_adv = normalise([(p, s) for p, _, _, s in rows], [ret[b, u] for _, b, u, _ in rows],
                       lone_mean_zero=False)
  U = max(len(t) for t in states)
  out = np.zeros((len(states), U))
  for (p, b, u, _), a in zip(rows, step_adv):
    out[b, u] = ep_adv[p, episode_reward[b]] + omega * a
  return out


def _random_case(rng, P, G, U, n_states=3):
  states, step_reward = [], np.zeros((P * G, U), np.float32)
  for _ in range(P * G):
    n = int(rng.integers(1, U + 1))
    states.append([f"s{rng.integers(n_states)}" for _ in range(n)] + [None] * (U - n))
  step_reward[:] = rng.integers(0, 3, size=step_reward.shape) * 0.5
  episode_reward = rng.integers(0, 2, size=P * G).astype(np.float32)
  episode_reward[:G] = 1.0  # one all-solved group
  return episode_reward, step_reward, states


class AnchorGroupsTest(absltest.TestCase):

  def test_identical_states_share_an_id_within_a_prompt_only(self):
    ids = gigpo.anchor_groups([["a", "b"], ["a", "c", "b"], ["a"], ["z", None]], group_size=2)
    np.testing.assert_array_equal(ids, [[0, 1, -1], [0, 2, 1], [3, -1, -1], [4, -1, -1]])

  def test_unhashable_states_are_converted(self):
    obs = np.arange(4).reshape(2, 2)
    ids = gigpo.anchor_groups([[obs, {"x": [1, 2]}], [obs.copy(), {"x": [1, 2]}]],
                              group_size=2, num_turns=3)
    np.testing.assert_array_equal(ids, [[0, 1, -1], [0, 1, -1]])
    with self.assertRaisesRegex(TypeError, "not hashable"):
      gigpo.anchor_groups([[object()]], group_size=1)

  def test_similarity_grouping(self):
    keys = [["the red door is open", "x"], ["the red door is opel", "the blue box"]]
    exact = gigpo.anchor_groups(keys, group_size=2)
    self.assertNotEqual(exact[0, 0], exact[1, 0])
    near = gigpo.anchor_groups(keys, group_size=2, similarity_thresh=0.9)
    self.assertEqual(near[0, 0], near[1, 0])
    self.assertLen(set(near.reshape(-1)), 3)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "group_size=2"):
      gigpo.anchor_groups([["a"]], group_size=2)
    with self.assertRaisesRegex(ValueError, "num_turns=1"):
      gigpo.anchor_groups([["a", "b"]], group_size=1, num_turns=1)
    with self.assertRaisesRegex(ValueError, "similarity_thresh"):
      gigpo.anchor_groups([["a"]], group_size=1, similarity_thresh=1.0)


class GigpoTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # Prompt 0: trajectory 0 (R=1) visits a, b, c; trajectory 1 (R=0) visits a, x. Prompt 1:
    # trajectory 2 (R=1) visits a, b; trajectory 3 (R=0) visits q.
    ids = gigpo.anchor_groups([["a", "b", "c"], ["a", "x"], ["a", "b"], ["q"]], group_size=2)
    step_reward = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0, 0, 0]])
    fn = self.variant(functools.partial(gigpo.gigpo, group_size=2))
    adv = fn(jnp.array([1.0, 0.0, 1.0, 0.0]), step_reward, jnp.asarray(ids))
    # Episode stats over step rows: prompt 0 mean (3*1 + 2*0)/5 = 0.6, prompt 1 mean 2/3.
    # Step group "a" of prompt 0: returns 0.95^2 = 0.9025 and 0, mean 0.45125.
    expected = [[0.4 + 0.45125, 0.4, 0.4], [-0.6 - 0.45125, -0.6, 0.0],
                [1 / 3, 1 / 3, 0.0], [-2 / 3, 0.0, 0.0]]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)

  def test_mean_std_norm_hand_computed(self):
    # One prompt, two single-turn trajectories from the same state: rewards 1 and 0.
    # Episode: (1 - 0.5) / (std([1, 0]) + eps) with std = sqrt(0.5); the step level is equal.
    ids = jnp.array([[0], [0]])
    adv = gigpo.gigpo(jnp.array([1.0, 0.0]), jnp.array([[1.0], [0.0]]), ids, group_size=2,
                      mode="mean_std_norm", omega=0.5)
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(adv, [[1.5 * a], [-1.5 * a]], rtol=1e-6)

  def test_against_verl_agent_loops(self):
    rng = np.random.default_rng(0)
    for mode in gigpo.MODES:
      for weight_by_steps in (True, False):
        ep, step, states = _random_case(rng, P=3, G=4, U=5)
        ids = gigpo.anchor_groups(states, group_size=4)
        got = gigpo.gigpo(jnp.asarray(ep), jnp.asarray(step), jnp.asarray(ids), group_size=4,
                          gamma=0.95, omega=0.7, mode=mode, weight_by_steps=weight_by_steps)
        want = np_gigpo(ep, step, states, 4, gamma=0.95, omega=0.7, mode=mode,
                        weight_by_steps=weight_by_steps)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{mode}, weight_by_steps={weight_by_steps}")

  def test_omega_zero_is_episode_grpo(self):
    rng = np.random.default_rng(1)
    ep, step, states = _random_case(rng, P=3, G=4, U=4)
    ids = jnp.asarray(gigpo.anchor_groups(states, group_size=4))
    for mode, norm in (("mean_norm", False), ("mean_std_norm", True)):
      adv = gigpo.gigpo(jnp.asarray(ep), jnp.asarray(step), ids, group_size=4, omega=0.0,
                        mode=mode, weight_by_steps=False)
      grpo_B = estimators.grpo(jnp.asarray(ep), group_size=4, norm_by_std=norm)
      np.testing.assert_allclose(adv, jnp.where(ids >= 0, grpo_B[:, None], 0.0), rtol=1e-6,
                                 atol=1e-7)

  def test_identical_trajectories_give_exactly_zero(self):
    states = [["s0", "s1", "s2"]] * 4
    ids = jnp.asarray(gigpo.anchor_groups(states, group_size=4))
    step = jnp.tile(jnp.array([[0.1, 0.0, 1.3]]), (4, 1))
    for mode in gigpo.MODES:
      adv = gigpo.gigpo(jnp.full((4,), 0.7), step, ids, group_size=4, mode=mode)
      np.testing.assert_array_equal(adv, 0.0)

  def test_lone_step_groups_and_absent_turns(self):
    ids = jnp.array([[0, 1, -1], [2, -1, -1]])
    adv = gigpo.gigpo(jnp.array([1.0, 0.0]), jnp.ones((2, 3)), ids, group_size=2)
    # Every step group has one turn: only the episode part is left (step rows: 2 of R=1,
    # 1 of R=0, mean 2/3); absent turns are exactly 0.
    np.testing.assert_allclose(adv, [[1 / 3, 1 / 3, 0.0], [-2 / 3, 0.0, 0.0]], rtol=1e-6)
    self.assertEqual(float(adv[0, 2]), 0.0)

  def test_permuting_a_group_permutes_advantages(self):
    rng = np.random.default_rng(2)
    ep, step, states = _random_case(rng, P=2, G=4, U=4)
    perm = np.concatenate([rng.permutation(4), 4 + rng.permutation(4)])
    ids = gigpo.anchor_groups(states, group_size=4)
    ids_perm = gigpo.anchor_groups([states[i] for i in perm], group_size=4)
    adv = gigpo.gigpo(jnp.asarray(ep), jnp.asarray(step), jnp.asarray(ids), group_size=4)
    adv_perm = gigpo.gigpo(jnp.asarray(ep[perm]), jnp.asarray(step[perm]),
                           jnp.asarray(ids_perm), group_size=4)
    np.testing.assert_allclose(adv_perm, np.asarray(adv)[perm], rtol=1e-6, atol=1e-7)

  def test_bad_arguments(self):
    ids = jnp.zeros((2, 3), jnp.int32)
    with self.assertRaisesRegex(ValueError, "mode="):
      gigpo.gigpo(jnp.zeros(2), jnp.zeros((2, 3)), ids, group_size=2, mode="leave_one_out")
    with self.assertRaisesRegex(ValueError, "step_reward_BU"):
      gigpo.gigpo(jnp.zeros(2), jnp.zeros((2, 4)), ids, group_size=2)
    with self.assertRaisesRegex(ValueError, "group_size=3"):
      gigpo.gigpo(jnp.zeros(2), jnp.zeros((2, 3)), ids, group_size=3)
    with self.assertRaisesRegex(ValueError, "single="):
      gigpo.group_normalize(jnp.zeros(2), jnp.zeros(2, jnp.int32), jnp.ones(2), num_segments=1,
                            norm_by_std=True, single="one")


if __name__ == "__main__":
  absltest.main()
