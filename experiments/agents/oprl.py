# pylint: disable=invalid-name
r"""OPRL (arXiv 2509.19199): online implicit process rewards for a multi-turn agent.

  python -m experiments.agents.oprl --workdir=runs/oprl                  # cpu: tiny model, minutes
  python -m experiments.agents.oprl --config.loss.alpha=0.0              # outcome GRPO, PRM trained
  python -m experiments.agents.oprl --config=experiments/agents/oprl.py:smollm2
  python -m experiments.agents.oprl --config=experiments/agents/oprl.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/oprl      # accelerators

The task is the hidden-rule game of experiments/agents/agent.py (agentrl/envs/hidden_rule.py): the
rule is inferred by querying over several turns, and only the outcome is rewarded. OPRL keeps
a second copy of the policy, the implicit process reward model pi_phi (initialised from the
warm-started policy, trained with its own Adam), and each RL step alternates
(`agentrl.credit.oprl`, docs/algorithms.md §5.6):

  1. pi_phi takes one DPO step on this step's trajectory pairs (tau+, tau-), every (i, j) of
     a group with R_i > R_j [INF], with the rollout policy pi_old as the reference:
       L = -log sigmoid(beta [(log pi_phi - log pi_old)(tau+) - (log pi_phi - log pi_old)(tau-)]),
     trajectory log-probs summed over the policy's tokens (observations are the env's);
  2. the updated pi_phi scores every turn u: r_u = beta sum_{t in u} (log pi_phi - log pi_old)_t;
  3. A_u = GRPO z-score of the outcome R + alpha * (r_u z-scored over the prompt's group at
     turn index u; loss.step_norm="group" pools all the group's turns) [INF: alpha 1, the
     step groups], on each policy token of turn u; prompt and observation tokens get exactly
     0, and so does every token of a group of identical trajectories;
  4. the policy takes updates.epochs x updates.minibatches PPO clipped-surrogate steps.

Order: step 1 comes before step 2, as the paper alternates (rollout, then PRM optimisation,
then the policy update with step rewards from "the currently updated PRM"), so a batch's own
pairs already shape its step rewards. The loop's score and advantage phases come before any
update, so steps 1-4 all run inside this file's update step, on the whole batch (the pairs
need whole groups); the PPO minibatches are cut there, in an order drawn from the update
count, so a killed run resumes exactly. beta has no published default: 0.05 [INF], the
implicit-PRM value of PRIME (arXiv 2502.01456); with pi_phi == pi_old every r_u is 0 and the
advantage is outcome GRPO's.

Presets, as experiments/agents/agent.py: `cpu` (default) warm-starts a tiny scratch model by SFT on
the game's scripted demonstrations, then trains on number guessing (7 turns), evaluated
greedily on held-out secrets; `smollm2` runs SmolLM2-135M-Instruct with the chat template for
a few CPU steps; `pod` is Qwen3-8B on an fsdp mesh with every rule family (pi_phi doubles
the trained parameters and optimizer state); `smoke` exercises the code path in seconds.
Every run writes config.json, metrics.jsonl, TensorBoard events, curves.png, summary.json and
checkpoints (params {"policy", "prm"}; experiments.eval reads the policy) to --workdir.

This file is the fork unit; the building blocks come from agentrl.harness.recipe, agentrl.train.loop
and agentrl.credit.oprl.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import oprl
from agentrl import distributed
from agentrl.envs import hidden_rule
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  if arg.preset not in ("cpu", "smollm2", "pod"):
    raise configs.ConfigError(f"unknown oprl preset {arg.preset!r}; use cpu (default), "
                              "smollm2, pod or smoke")
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # The game and its SFT warm start as experiments/agents/agent.py (see its comments).
  c.task = dict(name="hidden_rule", family="guess", max_turns=7, style="compact",
                chat_template=False)
  c.sft.update(target_success=0.3, demo_noise=0.0, eval_every=10, eval_problems=200)
  c.rollout.update(prompts_per_step=32, group_size=8, max_new_tokens=6, max_len=64)
  if arg.preset == "cpu" and not arg.smoke:
    # agent.py's CPU recipe: temperature 0.7 keeps samples near the warm start's search tree,
    # the warmup keeps Adam's first sign-sized steps from breaking the tiny policy's protocol.
    c.total_steps = 200
    c.rollout.temperature = 0.7
    c.optim.update(lr=3e-4, warmup_steps=10)
  # beta: the DPO temperature and the step reward's scale [INF] (module docstring); alpha: the
  # step advantage's weight [INF]; step_norm: the step groups of its z-score, "turn" (prompt,
  # turn index) or "group" (all the prompt's turns) [INF]; prm_lr: pi_phi's Adam lr, the
  # policy's by default [INF] (its warmup and clipping are optim's). agg as agent.py:
  # seq-mean-token-mean weighs every episode equally on the scratch model, token-mean (verl's)
  # on the chat models.
  c.loss = dict(beta=0.05, alpha=1.0, step_norm="turn", prm_lr=c.optim.lr, eps_low=0.2,
                eps_high=0.2, agg="seq-mean-token-mean")
  c.eval.update(num_problems=300, every=25)
  if arg.preset == "smollm2":  # SmolLM2-135M-Instruct, a few CPU steps.
    c.task.update(max_turns=4, style="full", chat_template=True)
    c.loss.agg = "token-mean"
    c.rollout.update(prompts_per_step=2, group_size=4, max_new_tokens=24, max_len=512)
    c.eval.update(num_problems=8, every=0)
  elif arg.preset == "pod":  # Qwen3-8B on fsdp=8 (rl_config.rl_config); set model.path.
    c.task.update(family="mixed", max_turns=8, style="full", chat_template=True)
    c.loss.agg = "token-mean"
    c.rollout.update(prompts_per_step=128, group_size=8, max_new_tokens=256, max_len=4096)
    c.eval.update(num_problems=256, every=20)
  if arg.smoke:  # Run by tests/experiments_smoke_test.py; exercises the code path only.
    c.task.update(max_turns=2, style="compact", chat_template=False)
    c.model.update(init="scratch", variant="tiny")
    c.sft.update(eval_problems=4)
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8, max_len=64)
    c.eval.num_problems = 2
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    "task.name": configs.Key(str, choices=("hidden_rule",)),
    "task.family": configs.Key(str, choices=("mixed",) + hidden_rule.FAMILIES),
    "task.max_turns": configs.Key(int, min=1),
    "task.style": configs.Key(str, choices=hidden_rule.STYLES),
    "task.chat_template": configs.Key(bool),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=2, why="for the preference pairs"),
    "loss.beta": configs.Key(float, min=1e-6),
    "loss.alpha": configs.Key(float, min=0.0),
    "loss.step_norm": configs.Key(str, choices=("turn", "group")),
    "loss.prm_lr": configs.Key(float, min=0.0),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
}


# ---------------------------------------------------------------------------------------------
# The advantage, the loss composition and the alternation: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_advantage_step(config):
  """advantage_step(batch, prm_logp_BT) -> (batch with adv_BT, metrics); pure.

  `batch` is scored by pi_old (old_logp_BT) and carries the outcome (reward_B) and each
  token's turn (turn_BT); prm_logp_BT is pi_phi's log-probs of the same tokens.
  """
  G, U, lc = config.rollout.group_size, config.task.max_turns, config.loss

  def advantage_step(batch: types.Batch, prm_logp_BT):
    r_BU, turn_mask_BU = oprl.implicit_step_reward(prm_logp_BT, batch.old_logp_BT, batch.turn_BT,
                                                   batch.loss_mask_BT, num_turns=U, beta=lc.beta)
    adv_BU = oprl.oprl_advantage(batch.reward_B, r_BU, turn_mask_BU, group_size=G,
                                 alpha=lc.alpha, step_norm=lc.step_norm)
    adv_BT = estimators.broadcast_turn_to_tokens(adv_BU, batch.turn_BT, batch.loss_mask_BT)
    return batch.replace(adv_BT=adv_BT), {
        "adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
        "step_reward_mean": aggregation.masked_mean(r_BU, turn_mask_BU)}

  return advantage_step


def make_update_step(config, graphdef, txs):
  """update_step(state, batch) -> (state, metrics), one OPRL step; pure, jit it in train().

  state.params and state.opt_state are {"policy", "prm"} (one Adam each, txs likewise);
  state.step counts the policy's updates. `prm_grad_norm` is pi_phi's gradient norm,
  `grad_norm` the policy's (mean over its minibatches, as the loop's other metrics).
  """
  lc, rc, uc = config.loss, config.rollout, config.updates
  G, E, M = rc.group_size, uc.epochs, uc.minibatches
  advantage_step = make_advantage_step(config)

  def logprobs(params, batch):
    return policy_lib.token_logprobs(nnx.merge(graphdef, params), batch.tokens_BT,
                                     batch.positions_BT, batch.input_mask_BT,
                                     temperature=rc.temperature,
                                     impl=config.model.logprob_impl)

  def prm_loss_fn(prm_params, batch: types.Batch):
    loss_N, metrics = oprl.prm_loss(logprobs(prm_params, batch), batch.old_logp_BT,
                                    batch.loss_mask_BT, batch.reward_B, group_size=G,
                                    beta=lc.beta)
    _, _, pair_N = oprl.preference_pairs(batch.reward_B, group_size=G)
    loss = aggregation.masked_mean(loss_N, pair_N)  # the mean over the batch's pairs
    return loss, metrics | {"prm_loss": loss}

  def policy_loss_fn(params, batch: types.Batch):  # experiments/agents/agent.py's PPO surrogate
    logp_BT = logprobs(params, batch)
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = aggregation.aggregate(pg_BT, batch.loss_mask_BT, lc.agg)
    return loss, metrics | {"loss": loss}

  prm_step = loop.gradient_step(prm_loss_fn, txs["prm"])
  policy_step = loop.gradient_step(policy_loss_fn, txs["policy"])

  def update_step(state: types.TrainState, batch: types.Batch):
    part = lambda k: types.TrainState(step=state.step, params=state.params[k],
                                      opt_state=state.opt_state[k])
    # 1. pi_phi's DPO step. A batch without a pair keeps pi_phi and its Adam moments as they
    # are: a zero gradient would still move it by Adam's momentum.
    prm, prm_metrics = prm_step(part("prm"), batch)
    prm = jax.tree.map(lambda new, old: jnp.where(prm_metrics["prm_pairs"] > 0, new, old),
                       prm, part("prm"))
    # 2-3. Step rewards from the updated pi_phi (data, not differentiated), then advantages.
    batch, adv_metrics = advantage_step(batch, jax.lax.stop_gradient(logprobs(prm.params,
                                                                               batch)))
    # 4. The policy's epochs x minibatches, each epoch a fresh order of the rows drawn from
    # the update count (the loop's shuffling lives outside the step, and resumes exactly too).
    B = batch.tokens_BT.shape[0]
    key = jax.random.fold_in(jax.random.key(config.seed), state.step)
    order = jnp.stack([jnp.arange(B) if M == 1 else
                       jax.random.permutation(jax.random.fold_in(key, e), B)
                       for e in range(E)]).reshape(E * M, B // M)
    policy, metrics = jax.lax.scan(
        lambda s, rows: policy_step(s, jax.tree.map(lambda x: x[rows], batch)), part("policy"),
        order)
    state = types.TrainState(step=policy.step,
                             params={"policy": policy.params, "prm": prm.params},
                             opt_state={"policy": policy.opt_state, "prm": prm.opt_state})
    prm_metrics["prm_grad_norm"] = prm_metrics.pop("grad_norm")
    return state, jax.tree.map(jnp.mean, metrics) | prm_metrics | adv_metrics

  return update_step


def make_optimizers(config) -> dict:
  """{"policy", "prm"}: `recipe.make_optimizer` each, pi_phi at loss.prm_lr.

  Two optimizer states, not one `optax.multi_transform`: the two parts step at different
  moments of the update, and a masked-out part would still take Adam momentum steps.
  """
  return {"policy": recipe.make_optimizer(config.optim),
          "prm": recipe.make_optimizer(config.optim, lr=config.loss.prm_lr)}


def init_state(params, txs, mesh, rules) -> tuple[types.TrainState, types.TrainState]:
  """(TrainState, its shardings) with params {"policy", "prm"}, pi_phi a copy of the policy."""
  parts = {"policy": params, "prm": jax.tree.map(jnp.copy, params)}  # the step donates both
  made = {k: sharding.create_train_state(p, txs[k], mesh, rules) for k, p in parts.items()}
  join = lambda i: types.TrainState(step=made["policy"][i].step,
                                    params={k: m[i].params for k, m in made.items()},
                                    opt_state={k: m[i].opt_state for k, m in made.items()})
  return join(0), join(1)


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """OPRL end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  uc = config.updates
  configs.require(not uc.sort_by_length and not uc.max_staleness,
                  "config.updates.sort_by_length and updates.max_staleness must be off for "
                  "OPRL: its update step cuts the policy's minibatches itself, after pi_phi's "
                  "update on the whole fresh batch")
  start = rundir.write_config(config, workdir, experiment="oprl")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy, warm-started (SFT on demonstrations for a scratch model); frozen reference
  # (for the logged kl); pi_phi, a copy of the warm-started policy; one optimizer each.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  txs = make_optimizers(config)
  state, state_shardings = init_state(params, txs, mesh, config.sharding_rules)

  # ---- Jitted steps: pi_old's scoring; the whole alternation in one update step.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, txs)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Data, rollout (one packed shape: one compilation of the update step) and evaluation;
  # they read the policy half of the params.
  data = recipe.prompt_stream(make_env)
  rollout = recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh,
                                    min_len=rc.max_len)
  evaluate = recipe.evaluator(config, engine, tok, make_env)
  # The loop hands the update step the whole batch once per step (pi_phi's pairs need whole
  # groups, its update comes before the advantages); epochs and minibatches run inside it
  # (so update/tokens_per_s counts one pass over the batch).
  options = recipe.loop_options(config) | {"epochs": 1, "num_minibatches": 1}

  # ---- The RL loop; the advantage phase is the update step's (after pi_phi's update).
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=lambda params, rng, step: rollout(params["policy"], rng, step),
        score_fn=lambda params, batch: score_step(params["policy"], ref_params, batch),
        advantage_fn=lambda batch, extras: (batch, {}), update_fn=update_step, data=data,
        evaluate=lambda params: evaluate(params["policy"]), **options)
  return rundir.write_summary(workdir, result, name="OPRL", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
