# pylint: disable=invalid-name
r"""RL with a process reward model: PRM-dense turn rewards or VPPO's first-error credit.

  python -m experiments.preference.prm --workdir=runs/prm            # first: train the PRM
  python -m experiments.agents.prm_rl --config.reward.prm=runs/prm --workdir=runs/prm_rl
  python -m experiments.agents.prm_rl --config.reward.prm=runs/prm --config.reward.form=vppo
  python -m experiments.agents.prm_rl --config.reward.form=vppo --config.reward.verifier=env
  python -m experiments.agents.prm_rl --config=experiments/agents/prm_rl.py:smoke \
      --config.reward.prm=DIR --workdir=/tmp/prm_rl

reward.prm (with reward.verifier=prm) is the workdir of an experiments.preference.prm run on
the same task and model (its PRM is that run's policy backbone plus a step head, read from
<run>/prm by `agentrl.harness.saved_prm`). Each step:

  1. G episodes per prompt from the rollout engine (the hidden-rule game by default, agent.py's
     cpu task and warm start), packed.
  2. reward.verifier: prm (default) — the frozen PRM scores each model turn at its last sampled
     token, s_k = sigmoid(z_k); env — no PRM (reward.prm is not read): s_k is the env's own
     check of the turn, info["step_ok"] in {0, 1} (`base.STEP_OK`; the hidden-rule `guess`
     family: an invalid turn or a guess outside the range the feedback leaves open is a
     mistake), 1 on a turn without it (nothing checked, no error found); only with
     reward.form=vppo, whose first error is then a verified one (a verifiable prefix).
  3. Per-turn rewards (docs/algorithms.md §15.3-§15.4, `credit.prm`), reward.form:
       sum   r_k = c_p s_k, + c_o o on the last turn (Math-Shepherd's step PPO, PRIME's sum);
       min   returns R_k = c_p min_{j >= k} s_j + c_o o (PURE's min-form credit);
       vppo  a failed episode's returns are prefix_reward before its first step with
             s_k <= 0.5 and fail_reward from there; a success's are success_reward (VPPO).
     o is the env's reward (the outcome, closeness included), c_p = reward.process_coef,
     c_o = reward.outcome_coef ("the outcome reward mixed as the papers do").
  4. Returns R_k = sum_{j >= k} r_j, z-scored within each (prompt, turn index) group
     (`mapo.turn_level`), on every policy token of turn k.
  5. PPO clip, no KL term (as agent.py).

Presets: cpu (default: agent.py's hidden-rule game, `rl_config.hidden_rule_study`), textworld,
pod (the game at agent.py's pod scale), smoke (seconds; tests give it a smoke PRM run).
This file is the fork unit; the building blocks come from agentrl.harness.recipe, loop and credit.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import mapo
from agentrl.credit import prm as prm_credit
from agentrl.credit import probes
from agentrl import distributed
from agentrl.envs import base
from agentrl.envs import hidden_rule
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import saved_prm
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl.rewards import process
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

FORMS = prm_credit.FORMS + ("vppo",)
VERIFIERS = ("prm", "env")


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.agent_study(arg, experiment="prm_rl", names=registry.NAMES)
  c.loss = dict(eps_low=0.2, eps_high=0.2, agg="seq-mean-token-mean")
  # prm: the experiments.preference.prm run dir (required with verifier=prm); form and
  # verifier: the module docstring's; process_coef / outcome_coef: c_p, c_o of sum and min;
  # the *_reward: VPPO's returns.
  c.reward = dict(prm="", form="min", verifier="prm", process_coef=1.0, outcome_coef=1.0,
                  success_reward=1.0, prefix_reward=0.5, fail_reward=0.0)
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=2, why="for turn-group normalization"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "reward.prm": configs.Key(str),
    "reward.form": configs.Key(str, choices=FORMS),
    "reward.verifier": configs.Key(str, choices=VERIFIERS),
    "reward.process_coef": configs.Key(float, min=0.0),
    "reward.outcome_coef": configs.Key(float, min=0.0),
    "reward.success_reward": configs.Key(float),
    "reward.prefix_reward": configs.Key(float),
    "reward.fail_reward": configs.Key(float),
}


# ---------------------------------------------------------------------------------------------
# The PRM.
# ---------------------------------------------------------------------------------------------
def check_verifier(config) -> None:
  """ConfigError unless reward.verifier fits: env needs reward.form=vppo and an env that
  checks its steps; prm needs a PRM run on this run's task and model (`saved_prm.check`)."""
  rc, tc = config.reward, config.task
  if rc.verifier == "prm":
    saved_prm.check(rc.prm, config, flag="config.reward.prm")
    return
  configs.require(rc.form == "vppo", f"config.reward.verifier=env judges steps right or wrong, "
                  f"which only VPPO's first error uses; reward.form={rc.form!r} needs a PRM's "
                  "scores (reward.verifier=prm)")
  configs.require(tc.name == "hidden_rule" and tc.family in hidden_rule.CHECKED_FAMILIES,
                  f"config.reward.verifier=env needs an env that checks its steps "
                  f"(info['step_ok']): task.name='hidden_rule' with task.family in "
                  f"{hidden_rule.CHECKED_FAMILIES}, got {tc.name!r} / {tc.get('family')!r}")


def env_scores(trajs, *, max_steps: int) -> np.ndarray:
  """Float32 [B, U]: each turn's info["step_ok"] (1 correct, 0 a mistake), 1 where absent
  (an unchecked turn is not a found error); turns that did not happen are masked later."""
  labels_BU, checked_BU = process.progress_labels([t.infos for t in trajs],
                                                  max_steps=max_steps, key=base.STEP_OK)
  return np.where(checked_BU > 0, labels_BU, 1.0).astype(np.float32)


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


def turn_rewards(rc, score_BU, outcome_B, success_B, turn_mask_BU):
  """Per-turn rewards [B, U] of reward.form (`rc` = config.reward) from the PRM's scores."""
  if rc.form == "vppo":
    return prm_credit.vppo_turn_rewards(score_BU > 0.5, success_B, turn_mask_BU,
                                        success_reward=rc.success_reward,
                                        prefix_reward=rc.prefix_reward,
                                        fail_reward=rc.fail_reward)
  return prm_credit.dense_turn_rewards(score_BU, outcome_B, turn_mask_BU, form=rc.form,
                                       process_coef=rc.process_coef,
                                       outcome_coef=rc.outcome_coef)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): the PRM turn rewards' returns, z-scored
  per (prompt, turn index), on each turn's tokens."""
  rc, G = config.reward, config.rollout.group_size

  def advantage_fn(batch: types.Batch, extras):
    mask_BU = extras["turn_mask_BU"]
    r_BU = turn_rewards(rc, extras["score_BU"], batch.reward_B, extras["success_B"], mask_BU)
    return_BU = estimators.discounted_turn_returns(r_BU, mask_BU)
    adv_BT = estimators.broadcast_turn_to_tokens(
        mapo.turn_level(return_BU, mask_BU, group_size=G), batch.turn_BT, batch.loss_mask_BT)
    first_error_B = prm_credit.first_error(extras["score_BU"] > 0.5, mask_BU)
    return batch.replace(adv_BT=adv_BT), {
        "adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
        "prm/score_mean": aggregation.masked_mean(extras["score_BU"], mask_BU),
        "prm/first_error": first_error_B.astype(np.float32).mean()}

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# The rollout: groups, packed, with the PRM's turn scores.
# ---------------------------------------------------------------------------------------------
def make_rollout_fn(config, engine, tok, make_env, data, mesh, prm_score, prm_params):
  """rollout_fn(params, rng, step): G episodes per prompt, packed, with extras score_BU (the
  frozen PRM's per-turn probabilities, or with prm_score None the env's checks, `env_scores`),
  turn_mask_BU and success_B."""
  rc, tc = config.rollout, config.task
  U, rows = make_env().max_turns, sharding.batch_sharding(mesh)

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    groups = agent_loop.rollout_groups(
        engine, params, tok, make_env, seeds, group_size=rc.group_size, rng=rng, max_turns=U,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
        chat_template=tc.chat_template)
    trajs = groups.trajectories
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    steps = probes.prm_steps(trajs, max_steps=U, max_len=batch.tokens_BT.shape[1])
    end_BU, mask_BU = jax.device_put((steps["step_end"], steps["step_mask"]), rows)
    if prm_score is None:
      score_BU = jax.device_put(env_scores(trajs, max_steps=U), rows)
    else:
      score_BU = jax.nn.sigmoid(prm_score(prm_params, batch.tokens_BT, batch.positions_BT,
                                          batch.input_mask_BT, end_BU, mask_BU))
    success_B = np.asarray([collect.trajectory_success(t) for t in trajs])
    extras = {"score_BU": score_BU, "turn_mask_BU": mask_BU,
              "success_B": jax.device_put(success_B, rows)}
    host = {**groups.metrics, **collect.rollout_metrics(trajs),
            **collect.batch_metrics(trajs, batch)}
    return loop.Rollout(batch=batch, metrics=host, extras=extras, trajectories=trajs,
                        tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """PRM-credited RL end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  check_verifier(config)
  start = rundir.write_config(config, workdir, experiment="prm_rl")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), optimizer, the frozen PRM. No reference model: KL 0.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)
  prm_logits, prm_params = None, None
  if config.reward.verifier == "prm":
    prm_logits, prm_params = saved_prm.load(config.reward.prm, graphdef, params,
                                            seed=config.seed, flag="config.reward.prm")
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- The RL loop.
  data = recipe.prompt_stream(make_env)
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh,
                                   prm_logits if prm_logits is None else jax.jit(prm_logits),
                                   prm_params),
        score_fn=lambda params, batch: score_step(params, None, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  name = f"PRM RL ({config.reward.form}, verifier {config.reward.verifier})"
  return rundir.write_summary(workdir, result, name=name,
                              start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
