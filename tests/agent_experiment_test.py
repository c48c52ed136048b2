# pylint: disable=invalid-name
"""experiments/agents/agent.py's credit choices on hand-built multi-turn batches.

Two prompts x G = 2 trajectories of two model turns each (token layout below). For every
credit: prompt and observation tokens get exactly 0, and a group whose trajectories are
identical (same rewards, same probes, same states) gets exactly 0 (MAPO, whose batch-level
normalisation compares across groups: equal advantages). GiGPO's step groups come from the
transcripts the turns start from; IGPO's, SIOP's, InfoPO's and MAPO's advantages are their
`agentrl.credit` modules'; MAPO's turn rewards and progress, SIOP's answers, references and
probes and InfoPO's counterfactual transcripts are built from the trajectories.
"""
import importlib
import types as pytypes

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import igpo
from agentrl.credit import infopo
from agentrl.credit import mapo
from agentrl.credit import probes
from agentrl.credit import siop
from agentrl.envs import hidden_rule
from agentrl.models import policy as policy_lib
from agentrl.models import testing
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import pack
from agentrl import types

agent = importlib.import_module("experiments.agents.agent")

# prompt prompt | turn 0 (2 tokens) | obs | turn 1 (2 tokens) | pad
TURN = np.array([-1, -1, 0, 0, 0, 1, 1, -1], np.int32)
MASK = np.array([0, 0, 1, 1, 0, 1, 1, 0], np.float32)
U = 2


def _config(credit):
  config = agent.get_config("smoke")
  config.rollout.group_size = 2
  config.task.max_turns = U
  config.loss.credit = credit
  return config


def _batch(reward_B):
  B = len(reward_B)
  return types.Batch(
      tokens_BT=jnp.ones((B, 8), jnp.int32), positions_BT=jnp.tile(jnp.arange(8), (B, 1)),
      input_mask_BT=jnp.ones((B, 8), bool), loss_mask_BT=jnp.tile(jnp.asarray(MASK), (B, 1)),
      turn_BT=jnp.tile(jnp.asarray(TURN), (B, 1)),
      reward_B=jnp.asarray(reward_B, jnp.float32))


def _traj(tokens, turn_rewards, infos=()):
  T = len(tokens)
  return agent_loop.Trajectory(
      tokens=np.asarray(tokens, np.int32), loss_mask=MASK[:T].copy(), turn=TURN[:T].copy(),
      sampler_logp=np.zeros(T, np.float32), turn_rewards=list(turn_rewards),
      reward=float(sum(turn_rewards)), done=True, truncated=False, prompt_len=2,
      infos=list(infos))


# Group 0: two trajectories that differ in turn 1 only (one solves); group 1: identical.
TRAJS = [_traj([5, 6, 7, 8, 9, 10, 11], [0.0, 1.0]), _traj([5, 6, 7, 8, 9, 12, 13], [0.0, 0.0]),
         _traj([5, 6, 3, 4, 9, 10, 11], [0.0, 0.0]), _traj([5, 6, 3, 4, 9, 10, 11], [0.0, 0.0])]
REWARD = [1.0, 0.0, 0.0, 0.0]
# The final commands: group 0 splits into two modes (q = 1/2 each), group 1 is one (q = 1).
ANSWERS = ["guess 10", "guess 12", "guess 10", "guess 10"]
# A fake tokenizer for the TRAJS ids: turn 0 is "guess 5" (3 4) or "guess 1" (7 8), turn 1
# "guess 10" (10 11) or "GUESS 12" (12 13); 9 is the observation.
WORDS = {3: "guess", 4: "5", 7: "guess", 8: "1", 9: "lower", 10: "guess", 11: "10",
         12: "GUESS", 13: "12", 14: "?"}
TOK = pytypes.SimpleNamespace(decode=lambda ids: " ".join(WORDS[i] for i in ids),
                              end_of_turn_ids=(), eos_id=15)


def _siop_extras():
  _, weight_BR, target_B = probes.siop_references(ANSWERS, group_size=2)
  # Mean log-probs of reference 0 (the only one: each mode has one distinct answer) after the
  # prompt, turn 0 and turn 1. Group 0: the solving row's reference gains at turn 1. Group 1:
  # r_0 = log 1 - (-0.5) = 0.5 = 0 + (1 - lambda), so its pooled turn rewards are equal.
  # (SIOP pools a group's turns: identical rows get 0 only when their turns' rewards agree.)
  prompt = np.array([-3.0, -3.0, -0.5, -0.5], np.float32)
  turns = np.array([[-2.0, -0.5], [-2.0, -2.5], [0.0, 0.0], [0.0, 0.0]], np.float32)
  ref_logp = np.full((4, U, agent.SIOP_REFS), -1.0, np.float32)
  ref_logp[:, :, 0] = turns
  prompt_logp = np.full((4, agent.SIOP_REFS), -1.0, np.float32)
  prompt_logp[:, 0] = prompt
  return {"prompt_logp_BR": jnp.asarray(prompt_logp), "ref_logp_BUR": jnp.asarray(ref_logp),
          "ref_weight_BR": jnp.asarray(weight_BR), "target_B": jnp.asarray(target_B),
          "turn_mask_BU": jnp.ones((4, U))}


def _infopo_extras():
  # Turn 1's log-probs with observation 0 replaced: the real ones are -1 everywhere; the
  # identical rows of group 1 lose the same, so their per-token information is uniform.
  logp = np.where(MASK > 0, -1.0, 0.0).astype(np.float32)
  cf = np.tile(logp, (4, 1))
  cf[:, TURN == 1] = np.array([[-3.0], [-1.5], [-2.0], [-2.0]], np.float32)
  return {"logp_BT": jnp.tile(jnp.asarray(logp), (4, 1)),
          "counterfactual_logp_BT": jnp.asarray(cf), "feedback_BU": jnp.asarray([[1.0, 0.0]] * 4)}


def _extras(credit):
  if credit == "gigpo":
    return {k: jnp.asarray(v) for k, v in
            probes.step_groups(TRAJS, group_size=2, max_turns=U).items()}
  if credit == "mapo":
    return {k: jnp.asarray(v) for k, v in probes.turn_signals(TRAJS, max_turns=U).items()}
  if credit == "siop":
    return _siop_extras()
  if credit == "infopo":
    return _infopo_extras()
  answer_logp = np.array([[-4.0, -1.0], [-4.0, -3.0], [-2.0, -2.5], [-2.0, -2.5]], np.float32)
  return {"answer_logp_BU": jnp.asarray(answer_logp), "answer_len_B": jnp.full((4,), 2.0),
          "turn_mask_BU": jnp.ones((4, U))}


class CreditTest(parameterized.TestCase):

  @parameterized.parameters(*agent.CREDITS)
  def test_masked_tokens_and_identical_groups_get_zero(self, credit):
    fn = agent.make_advantage_fn(_config(credit))
    out, _ = fn(_batch(REWARD), _extras(credit))
    adv_BT = np.asarray(out.adv_BT)
    np.testing.assert_array_equal(adv_BT[:, MASK == 0], 0.0)
    if credit == "mapo":   # the batch-level z-score ranks the group below the solving row
      np.testing.assert_array_equal(adv_BT[2], adv_BT[3])
      self.assertLess(adv_BT[2, 2], 0.0)
    else:
      np.testing.assert_array_equal(adv_BT[2:], 0.0)      # the identical group
    self.assertGreater(np.abs(adv_BT[:2]).max(), 0.1)      # the other one has signal
    self.assertGreater(adv_BT[0, 5], adv_BT[1, 5])         # the solving turn is preferred

  def test_certainty_mix_mixes_z_score_and_percent_deviation(self):
    # One group of 4 with 3 successes: p = 3/4, lambda = 1 - 4 p (1 - p) = 1/4; z-scores
    # (unbiased std 1/2) [1/2 x3, -3/2], percent deviations (R - 3/4) / (3/4) [1/3 x3, -1].
    config = _config("certainty_mix")
    config.rollout.group_size = 4
    out, _ = agent.make_advantage_fn(config)(_batch([1.0, 1.0, 1.0, 0.0]), None)
    want_B = 0.75 * np.array([0.5, 0.5, 0.5, -1.5]) + 0.25 * np.array([1 / 3, 1 / 3, 1 / 3, -1])
    np.testing.assert_allclose(np.asarray(out.adv_BT)[:, MASK > 0],
                               np.repeat(want_B[:, None], int(MASK.sum()), axis=1), rtol=1e-5)

  def test_mapo_is_the_credit_library(self):
    # Progress 1 on row 1's first turn: its return there is 0.5 x 1 = 0.5, row 0's is 1.
    trajs = [TRAJS[0], _traj(TRAJS[1].tokens, [0.0, 0.0], [{"progress": 1.0}, {}]), *TRAJS[2:]]
    e = {k: jnp.asarray(v) for k, v in probes.turn_signals(trajs, max_turns=U).items()}
    config = _config("mapo")
    config.loss.update(progress_coef=0.5, turn_weight=0.3)
    out, metrics = agent.make_advantage_fn(config)(_batch(REWARD), e)
    batch = _batch(REWARD)
    adv_BU = mapo.mapo(e["env_reward_BU"], e["progress_BU"], e["turn_mask_BU"], group_size=2,
                       progress_coef=0.5, turn_weight=0.3)
    np.testing.assert_array_equal(
        out.adv_BT, estimators.broadcast_turn_to_tokens(adv_BU, batch.turn_BT,
                                                        batch.loss_mask_BT))
    # Turn 0 of group 0: returns 1 and 0.5 -> turn-level +-1/sqrt(2).
    self.assertGreater(float(adv_BU[0, 0]), float(adv_BU[1, 0]))
    np.testing.assert_allclose(metrics["progress_mean"], 1 / 8)

  def test_igpo_is_the_credit_library(self):
    out, _ = agent.make_advantage_fn(_config("igpo"))(_batch(REWARD), _extras("igpo"))
    extras = _extras("igpo")
    r_BU = igpo.turn_rewards(extras["answer_logp_BU"] / 2.0, extras["turn_mask_BU"],
                             jnp.asarray(REWARD))
    want_BT = igpo.token_advantages(r_BU, extras["turn_mask_BU"], _batch(REWARD).turn_BT,
                                    _batch(REWARD).loss_mask_BT, group_size=2, gamma=1.0)
    np.testing.assert_array_equal(out.adv_BT, want_BT)

  def test_siop_is_the_credit_library(self):
    out, metrics = agent.make_advantage_fn(_config("siop"))(_batch(REWARD), _extras("siop"))
    e, batch = _extras("siop"), _batch(REWARD)
    r_BU = siop.turn_rewards(e["prompt_logp_BR"], e["ref_logp_BUR"], e["ref_weight_BR"],
                             e["target_B"], e["turn_mask_BU"], lam=0.5)
    adv_BU = siop.turn_advantages(r_BU, e["turn_mask_BU"], group_size=2, gamma=1.0)
    want_BT = estimators.broadcast_turn_to_tokens(adv_BU, batch.turn_BT, batch.loss_mask_BT)
    np.testing.assert_array_equal(out.adv_BT, want_BT)
    self.assertIn("siop_reward_mean", metrics)

  def test_infopo_is_the_credit_library(self):
    out, metrics = agent.make_advantage_fn(_config("infopo"))(_batch(REWARD), _extras("infopo"))
    e, batch = _extras("infopo"), _batch(REWARD)
    info_BU = infopo.turn_information(e["logp_BT"], e["counterfactual_logp_BT"], batch.turn_BT,
                                      batch.loss_mask_BT, e["feedback_BU"])
    np.testing.assert_allclose(info_BU, [[2.0, 0.0], [0.5, 0.0], [1.0, 0.0], [1.0, 0.0]])
    want_BT, _ = infopo.token_advantages(batch.reward_B, info_BU, batch.turn_BT,
                                         batch.loss_mask_BT, group_size=2)
    np.testing.assert_array_equal(out.adv_BT, want_BT)
    self.assertIn("infopo_gate_mean", metrics)


class HostExtrasTest(absltest.TestCase):

  def test_final_answers_are_the_last_commands(self):
    empty = _traj([5, 6], [])
    odd = _traj([5, 6, 3, 4, 9, 14, 15], [0.0, 0.0])     # "?" then the stop id
    self.assertEqual(probes.final_answers(TRAJS + [empty, odd], TOK, hidden_rule.parse_command),
                     ["guess 10", "guess 12", "guess 10", "guess 10", None, None])

  def test_siop_references_per_group(self):
    refs, weight_BR, target_B = probes.siop_references(ANSWERS + ["guess 3", None],
                                                      group_size=2)
    self.assertEqual(refs, [["guess 10"], ["guess 12"], ["guess 10"], ["guess 10"],
                            ["guess 3"], []])
    np.testing.assert_array_equal(weight_BR[:, 0], [1, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(weight_BR[:, 1:], 0.0)
    np.testing.assert_array_equal(target_B, [0.5, 0.5, 1.0, 1.0, 1.0, 0.0])

  def test_siop_probes_follow_the_turn_ends(self):
    self.assertEqual(probes.turn_ends(TRAJS[0]), [4, 7])
    refs = [[np.array([20, 21])], [np.array([22])], [], [np.array([20, 21])]]
    tokens, positions, input_mask, mask, turn_mask = probes.siop_probes(
        TRAJS, refs, max_turns=3, num_refs=2, length=10, pad_id=0)
    self.assertEqual(tokens.shape, (4 * 4 * 2, 10))
    row = lambda i, k, r: (i * 4 + k + 1) * 2 + r
    np.testing.assert_array_equal(tokens[row(0, -1, 0)], [5, 6, 20, 21, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(tokens[row(0, 0, 0)], [5, 6, 7, 8, 20, 21, 0, 0, 0, 0])
    np.testing.assert_array_equal(tokens[row(1, 1, 0)], [5, 6, 7, 8, 9, 12, 13, 22, 0, 0])
    np.testing.assert_array_equal(mask[row(0, 1, 0)], [0] * 7 + [1, 1, 0])
    np.testing.assert_array_equal(mask[row(1, 1, 0)], [0] * 7 + [1, 0, 0])
    for empty in (row(0, 2, 0), row(0, 0, 1), row(2, 0, 0)):   # no turn 2, ref 1, refs at all
      np.testing.assert_array_equal(mask[empty], 0.0)
    np.testing.assert_array_equal(turn_mask, [[1, 1, 0]] * 4)
    np.testing.assert_array_equal(positions[0], np.arange(10))
    np.testing.assert_array_equal(input_mask, tokens != 0)

  def test_counterfactual_transcripts_replace_one_observation(self):
    cf, feedback = probes.counterfactual_trajs(TRAJS, [14, 15], max_turns=3)
    self.assertLen(cf, 4 * 2)
    np.testing.assert_array_equal(cf[0].tokens, [5, 6, 7, 8, 14, 10, 11])  # observation 0
    np.testing.assert_array_equal(cf[1].tokens, TRAJS[0].tokens)         # turn 1 has none
    np.testing.assert_array_equal(cf[0].loss_mask, TRAJS[0].loss_mask)
    np.testing.assert_array_equal(feedback, [[1, 0, 0]] * 4)

  def test_counterfactual_step_scores_turn_t_plus_1_in_row_t(self):
    cfg = transformer.Config.named("tiny", vocab=16, width=16, depth=1, heads=2, kv_heads=2,
                                   head_dim=8, mlp=32)
    graphdef, params = testing.random_params(cfg)
    step = jax.jit(probes.make_counterfactual_step(graphdef, temperature=1.0,
                                                   logprob_impl="xla"))
    batch = pack.pack(TRAJS, max_len=8, pad_id=0, min_len=8)
    cf_trajs, _ = probes.counterfactual_trajs(TRAJS, [14, 15], max_turns=U)
    cf_batch = pack.pack(cf_trajs, max_len=8, pad_id=0, min_len=8)
    logp_BT, cf_logp_BT = step(params, batch, cf_batch)
    want_BT = policy_lib.token_logprobs(nnx.merge(graphdef, params), cf_batch.tokens_BT,
                                        cf_batch.positions_BT, cf_batch.input_mask_BT,
                                        impl="xla")
    np.testing.assert_allclose(cf_logp_BT[:, TURN == 1], want_BT[:, TURN == 1], atol=1e-6)
    np.testing.assert_array_equal(cf_logp_BT[:, TURN < 1], logp_BT[:, TURN < 1])
    self.assertGreater(np.abs(np.asarray(cf_logp_BT - logp_BT)).max(), 1e-4)

  def test_turn_signals_read_rewards_progress_and_turns(self):
    trajs = [_traj(TRAJS[0].tokens, [0.0, 1.0], [{"progress": 1.0}, {"progress": 0.25}]),
             _traj(TRAJS[1].tokens, [0.5], [{"progress": None}]),
             _traj([5, 6], [], []),
             _traj(TRAJS[2].tokens, [0.0, 0.0, 2.0], [{}, {"progress": 1.0}, {}])]
    out = probes.turn_signals(trajs, max_turns=2)
    np.testing.assert_array_equal(out["env_reward_BU"], [[0, 1], [0.5, 0], [0, 0], [0, 0]])
    np.testing.assert_array_equal(out["progress_BU"], [[1, 0.25], [0, 0], [0, 0], [0, 1]])
    np.testing.assert_array_equal(out["turn_mask_BU"], [[1, 1], [1, 0], [0, 0], [1, 1]])

  def test_step_groups_follow_the_transcripts(self):
    groups = probes.step_groups(TRAJS, group_size=2, max_turns=3)
    anchor = groups["anchor_id_BU"]
    # Turn 0 starts from the prompt in both rows of a group; turn 1 from the same history in
    # group 0 (turn 0 was identical); there is no turn 2.
    self.assertEqual(anchor[0, 0], anchor[1, 0])
    self.assertEqual(anchor[0, 1], anchor[1, 1])
    self.assertNotEqual(anchor[0, 0], anchor[0, 1])
    self.assertNotEqual(anchor[0, 0], anchor[2, 0])        # groups never share step groups
    np.testing.assert_array_equal(anchor[:, 2], -1)
    np.testing.assert_array_equal(groups["step_reward_BU"][0], [0.0, 1.0, 0.0])


if __name__ == "__main__":
  absltest.main()
