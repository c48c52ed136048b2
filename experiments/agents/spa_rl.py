# pylint: disable=invalid-name
r"""SPA-RL (arXiv 2505.20732): stepwise progress attribution on the multi-turn hidden-rule game.

  python -m experiments.agents.spa_rl --workdir=runs/spa_rl            # cpu: tiny model, minutes
  python -m experiments.agents.spa_rl --config.loss.grounding_weight=0  # contributions only
  python -m experiments.agents.spa_rl --config=experiments/agents/spa_rl.py:smollm2
  python -m experiments.agents.spa_rl --config=experiments/agents/spa_rl.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/spa_rl    # accelerators

The paper's pipeline is SFT -> a progress estimator trained offline so that each trajectory's
per-turn contributions sum to its outcome -> PPO on the dense reward "contribution +
grounding" (docs/algorithms.md §5.3, `agentrl.credit.spa`). Here it runs online, on the game
of experiments/agents/agent.py (same task, warm start and rollouts). Per trajectory i and turn u:

  c_u    the estimator's contribution: a linear head (`heads.ValueHead`) on the policy's
         stop-gradiented final hidden state at the turn's last policy token
         (`spa.turn_end_values`). [INF] The official head reads the LM logits; a linear map of
         the logits is a linear map of the hidden state (the logits are linear in it), so a
         head on the hidden state can express it and costs D weights instead of V.
  g_u    1 if the env executed the turn's command (its info has no "error"), else 0; the last
         turn always counts as executed (the official code, which has no next observation).
  r_u    = c_u + grounding_weight * g_u   (`spa.dense_reward`; 0.5, the official value).
  A_u    [INF] critic-free in place of the paper's PPO critic + GAE over turns: the baseline
         of turn u is the mean over the prompt's G trajectories that reached turn index u (a
         turn alone at its index gets 0), by loss.turn_norm:
           "reward" (default): A_u = sum_{k>=u} gamma^(k-u) (r_k - mean_k r); the grounding
                  value, equal for every executed turn, cancels inside each turn index, so a
                  trajectory is not paid for staying alive longer;
           "return": A_u = R_u - mean_u R, R_u = sum_{k>=u} gamma^(k-u) r_k (a Monte-Carlo
                  critic); every later executed turn adds 0.5 to R_u, so long failures can
                  outscore quick successes.
         loss.norm_by_std also divides by the index's unbiased std (off: see get_config).
  loss   PPO clipped surrogate on every policy token of turn u with advantage A_u (prompt and
         observation tokens: loss mask 0, advantage exactly 0) + the estimator's MSE
         `spa.progress_loss`, mean_i (sum_u c_u - R_i)^2, R_i the outcome.

The estimator is trained on every update's minibatch with its own Adam (loss.estimator_lr);
its input is stop-gradiented, so its loss never moves the policy. Estimator warm-up (the
paper trains the estimator on the SFT policy's trajectories before RL starts): for the first
loss.estimator_warmup_steps RL steps each update trains the estimator only, on fresh rollouts
of the frozen SFT policy; the policy's params and its optimizer state (Adam moments, count, so
its lr schedule too) are kept as they were, selected inside the one jitted update by
state.step (the applied updates so far; a skipped non-finite update does not count), so a
resumed run continues exactly. Without it the head starts at 0 and its first contributions are
noise that the policy follows (this family's README.md, Process-reward credit, has the runs).
The contributions that make the rewards are read in the score step, before the step's
updates (pre-update): they come from an estimator that has not been fit to these
trajectories' outcomes, as the paper's estimator, trained before RL, has not seen the RL
rollouts; fit first, it would partly memorise this batch's outcomes and the dense reward would
drift back toward the sparse one.

Presets: `cpu` (default): a tiny scratch model warm-started by SFT on the game's scripted
demonstrations (to `sft.target_success`), then RL on the 7-turn number-guessing family,
evaluated greedily on held-out secrets; `textworld`: the long-horizon coin collector of
experiments/agents/agent.py:textworld (registry.TEXTWORLD_STUDY, the same warm start and
rollouts; scripts/credit_study.py --task=textworld), where a turn is grounded when its command
was admissible; `smollm2`: SmolLM2-135M-Instruct with the chat template,
a few CPU steps; `pod`: Qwen3-8B on an fsdp mesh; `smoke` exercises the code path in seconds.
The params are {"policy", "progress"} (experiments.eval reads params["policy"]), both in the
checkpoint with their optimizer states, so a resumed run continues exactly.

This file is the fork unit; the building blocks come from agentrl.harness.recipe, agentrl.train.loop
and agentrl.credit.spa.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import optax

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import gigpo
from agentrl.credit import spa
from agentrl import distributed
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import relabel
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import heads
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


TASKS = ("hidden_rule", "textworld")   # the multi-turn envs this experiment offers


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  if arg.preset not in ("cpu", "smollm2", "pod", "textworld"):
    raise configs.ConfigError(f"unknown spa_rl preset {arg.preset!r}; use cpu (default), "
                              "smollm2, pod, textworld or smoke")
  c = rl_config.rl_config("cpu" if arg.preset == "textworld" else arg.preset, smoke=arg.smoke)
  # The game, warm start and rollout sizes of experiments/agents/agent.py, so the two compare;
  # the keys of both its tasks (TASKS), hidden_rule's here.
  c.task = registry.task_config("hidden_rule", names=TASKS, family="guess", max_turns=7,
                                style="compact")
  c.sft.update(target_success=0.3, demo_noise=0.0, eval_every=10, eval_problems=200)
  c.rollout.update(prompts_per_step=32, group_size=8, max_new_tokens=6, max_len=64)
  if arg.preset == "cpu" and not arg.smoke:
    c.total_steps = 200
    c.rollout.temperature = 0.7
    c.optim.update(lr=3e-4, warmup_steps=10)
  # grounding_weight, contribution_weight: r_u = w_c c_u + w_g g_u (official: 1 and 0.5);
  # last_turn_grounded: the last turn gets g = 1 whatever happened (official).
  # turn_norm, gamma, norm_by_std [INF]: how the dense rewards become turn advantages (module
  # docstring). Centring only: a z-score blows the estimator's small, noisy differences up to
  # unit scale (a first cpu run with z-scores, and lone turns paid their raw reward, fell
  # from 29% to 3% sampled success in 13 steps).
  # estimator_lr: the progress head's Adam lr. Adam moves each of its D weights by about lr
  # per update, so a contribution moves by up to ~lr * D * |h|: scale it down with the width
  # (the presets below).
  # estimator_warmup_steps: the first RL steps train only the estimator, on the frozen SFT
  # policy's rollouts (module docstring); the policy's updates start after them.
  c.loss = dict(grounding_weight=0.5, contribution_weight=1.0, last_turn_grounded=True,
                turn_norm="reward", gamma=1.0, norm_by_std=False, estimator_lr=1e-3,
                estimator_warmup_steps=20 if arg.preset == "cpu" else 10,
                eps_low=0.2, eps_high=0.2, agg="seq-mean-token-mean")
  c.eval.update(num_problems=300, every=25)
  if arg.preset == "smollm2":  # SmolLM2-135M-Instruct (width 576), a few CPU steps.
    c.task.update(max_turns=4, style="full", chat_template=True)
    c.loss.update(agg="token-mean", estimator_lr=1e-4, estimator_warmup_steps=1)
    c.rollout.update(prompts_per_step=2, group_size=4, max_new_tokens=24, max_len=512)
    c.eval.update(num_problems=8, every=0)
  elif arg.preset == "pod":  # Qwen3-8B (width 4096) on fsdp=8; set model.path.
    c.task.update(family="mixed", max_turns=8, style="full", chat_template=True)
    c.loss.update(agg="token-mean", estimator_lr=1e-5)
    c.rollout.update(prompts_per_step=128, group_size=8, max_new_tokens=256, max_len=4096)
    c.eval.update(num_problems=256, every=20)
  if arg.preset == "textworld":  # agent.py's textworld preset: the study's shared settings
    rl_config.textworld_study(c, names=TASKS, smoke=arg.smoke)
  if arg.smoke:  # Run by tests/experiments_smoke_test.py; exercises the code path only.
    c.task.update(max_turns=2, style="compact", chat_template=False)
    c.model.update(init="scratch", variant="tiny")
    c.sft.update(eval_problems=4)
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8, max_len=64)
    c.eval.num_problems = 2
    c.loss.estimator_warmup_steps = 1  # step 1 warms the estimator up, step 2 trains both
  return c


TURN_NORMS = ("reward", "return")
SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(TASKS),
    "task.max_turns": configs.Key(int, min=2),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=2, why="for the turn-group z-scores"),
    "loss.grounding_weight": configs.Key(float, min=0.0),
    "loss.contribution_weight": configs.Key(float, min=0.0),
    "loss.last_turn_grounded": configs.Key(bool),
    "loss.turn_norm": configs.Key(str, choices=TURN_NORMS),
    "loss.gamma": configs.Key(float, min=0.0, max=1.0),
    "loss.norm_by_std": configs.Key(bool),
    "loss.estimator_lr": configs.Key(float, min=0.0),
    "loss.estimator_warmup_steps": configs.Key(int, min=0),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
}


# ---------------------------------------------------------------------------------------------
# The estimator, the loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def contributions(policy, head, batch: types.Batch, *, num_turns: int):
  """(c [B, U], turn mask [B, U]): the head on the stop-gradiented hidden state at each turn's
  last policy token, the state that has read the whole turn (the official read position)."""
  h_BTD = jax.lax.stop_gradient(policy.hidden(batch.tokens_BT, batch.positions_BT,
                                              batch.input_mask_BT))
  return spa.turn_end_values(head(h_BTD), batch.turn_BT, batch.loss_mask_BT,
                             num_turns=num_turns)


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics); graphdef = (policy, progress head).

  Pure; jit it in train(). `grad_norm` is the policy's gradient norm, `spa/progress_grad_norm`
  the estimator's (each part is clipped by its own norm in `make_optimizer`). While
  state.step < loss.estimator_warmup_steps * updates.epochs * updates.minibatches the policy's
  params and optimizer state are kept (`spa/estimator_warmup` 1.0): only the estimator learns.
  tx is `make_optimizer`'s (the policy's optimizer state is its "policy" part).
  """
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature
  policy_def, head_def = graphdef
  warmup_updates = (lc.estimator_warmup_steps * config.updates.epochs
                    * config.updates.minibatches)

  def loss_fn(params, batch: types.Batch):
    policy, head = nnx.merge(policy_def, params["policy"]), nnx.merge(head_def, params["progress"])
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    c_BU, mask_BU = contributions(policy, head, batch, num_turns=config.task.max_turns)
    progress_B, progress_metrics = spa.progress_loss(c_BU, mask_BU, batch.reward_B)
    # The two terms share no parameters (the head's input is stop-gradiented), so their sum
    # trains each with its own gradient; Adam makes a weight between them moot.
    progress = progress_B.mean()
    loss = aggregation.aggregate(pg_BT, batch.loss_mask_BT, lc.agg) + progress
    return loss, metrics | {"loss": loss, "spa/progress_loss": progress} | {
        f"spa/{k}": v for k, v in progress_metrics.items()}

  def update_step(state: types.TrainState, batch: types.Batch):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    new, _ = loop.apply_gradients(state, grads, tx)  # its grad_norm mixes both parts
    warm = state.step < warmup_updates
    if warmup_updates:  # estimator warm-up: keep the policy's params and optimizer state
      keep = lambda new, old: jax.tree.map(  # (leaves passed through, LoRA's base, as they are)
          lambda n, o: o if n is o else jnp.where(warm, o, n), new, old)
      inner, old_inner = new.opt_state.inner_states, state.opt_state.inner_states
      new = new.replace(
          params={**new.params, "policy": keep(new.params["policy"], state.params["policy"])},
          opt_state=new.opt_state._replace(inner_states={
              **inner, "policy": keep(inner["policy"], old_inner["policy"])}))
    return new, metrics | {"grad_norm": optax.tree.norm(grads["policy"]),
                           "spa/progress_grad_norm": optax.tree.norm(grads["progress"]),
                           "spa/estimator_warmup": warm.astype(jnp.float32)}

  return update_step


def make_optimizer(config) -> optax.GradientTransformation:
  """Adam per parameter group: the policy at optim.lr, the estimator at loss.estimator_lr."""
  return optax.multi_transform(
      {"policy": recipe.make_optimizer(config.optim),
       "progress": recipe.make_optimizer(config.optim, lr=config.loss.estimator_lr)},
      {"policy": "policy", "progress": "progress"})  # a prefix of the params


def turn_advantages(reward_BU, mask_BU, *, group_size: int, gamma: float, turn_norm: str,
                    norm_by_std: bool):
  """Dense turn rewards [B, U] -> turn advantages [B, U] (loss.turn_norm, module docstring).

  The baseline of turn u is the mean over the prompt's trajectories that reached turn index u;
  a turn alone at its index gets 0 (`gigpo.step_advantage` over (prompt, turn index) ids).
  """
  B, U = mask_BU.shape
  ids_BU = (jnp.arange(B)[:, None] // group_size) * U + jnp.arange(U)[None, :]
  ids_BU = jnp.where(mask_BU > 0, ids_BU, -1)
  centre = lambda x_BU: gigpo.step_advantage(x_BU, ids_BU, norm_by_std=norm_by_std)
  if turn_norm == "reward":
    return estimators.discounted_turn_returns(centre(reward_BU), mask_BU, gamma=gamma)
  return centre(estimators.discounted_turn_returns(reward_BU, mask_BU, gamma=gamma))


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): the dense SPA reward of each turn (the
  score step's contributions in batch.aux, the grounding in extras) -> turn advantages ->
  that turn's policy tokens."""
  lc, G = config.loss, config.rollout.group_size

  def advantage_fn(batch: types.Batch, extras):
    c_BU, mask_BU = batch.aux["contribution_BU"], batch.aux["turn_mask_BU"]
    reward_BU = spa.dense_reward(c_BU, extras["grounded_BU"], mask_BU,
                                 grounding_weight=lc.grounding_weight,
                                 contribution_weight=lc.contribution_weight,
                                 last_turn_grounded=lc.last_turn_grounded)
    adv_BU = turn_advantages(reward_BU, mask_BU, group_size=G, gamma=lc.gamma,
                             turn_norm=lc.turn_norm, norm_by_std=lc.norm_by_std)
    adv_BT = estimators.broadcast_turn_to_tokens(adv_BU, batch.turn_BT, batch.loss_mask_BT)
    return batch.replace(adv_BT=adv_BT), {
        "adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
        "spa/contribution_mean": aggregation.masked_mean(c_BU, mask_BU),
        "spa/turn_reward_mean": aggregation.masked_mean(reward_BU, mask_BU),
        "spa/grounded_frac": aggregation.masked_mean(extras["grounded_BU"], mask_BU)}

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# The rollout's host side: each turn's grounding (relabel.group_rollout_fn packs the groups).
# ---------------------------------------------------------------------------------------------
def grounding(trajs, *, max_turns: int) -> np.ndarray:
  """g [B, U]: 1 where the env executed the turn's command (no "error" in its info), else 0
  (also on turns that did not happen; the turn mask comes from the packed tokens)."""
  grounded = np.zeros((len(trajs), max_turns), np.float32)
  for i, traj in enumerate(trajs):
    for u, info in enumerate(traj.infos[:max_turns]):
      grounded[i, u] = 0.0 if info.get("error") else 1.0
  return grounded


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """SPA-RL end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="spa_rl")
  rc, rules, mesh = config.rollout, config.sharding_rules, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (a scratch model is warm-started by SFT on demonstrations), frozen reference
  # (for the logged kl), the progress head (zero init: every contribution starts at 0), and
  # one optimizer per part.
  tok, policy_def, policy_params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, policy_def, tok)
  policy_params, sft_info = recipe.warm_start(config, workdir, mesh, policy_def, policy_params,
                                              tok, engine=engine)
  ref_params = recipe.reference_params(policy_params)  # None: LoRA's base
  width = nnx.merge(policy_def, policy_params).cfg.width
  head_def, head_params = sharding.create_sharded(lambda: heads.ValueHead(width), mesh, rules)
  tx = make_optimizer(config)
  state, state_shardings = sharding.create_train_state(
      {"policy": policy_params, "progress": head_params}, tx, mesh, rules)

  # ---- Jitted steps: scoring adds the pre-update contributions (module docstring).
  policy_score = loop.make_score_step(policy_def, temperature=rc.temperature,
                                      logprob_impl=config.model.logprob_impl, with_ref=True)

  def score_step(params, ref_params, batch):
    batch, metrics = policy_score(params["policy"], ref_params, batch)
    policy, head = nnx.merge(policy_def, params["policy"]), nnx.merge(head_def, params["progress"])
    c_BU, mask_BU = contributions(policy, head, batch, num_turns=config.task.max_turns)
    return batch.replace(aux={"contribution_BU": c_BU, "turn_mask_BU": mask_BU}), metrics

  score_step = jax.jit(score_step)
  update_step = jax.jit(
      loop.skip_nonfinite(make_update_step(config, (policy_def, head_def), tx)),
      donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Data, rollout and held-out evaluation (they read the policy half of the params).
  data = recipe.prompt_stream(make_env)
  rollout = relabel.group_rollout_fn(config, engine, tok, make_env, data, mesh, lambda trajs: (
      relabel.Labels(extras={"grounded_BU": grounding(trajs, max_turns=config.task.max_turns)})))
  evaluate = recipe.evaluator(config, engine, tok, make_env)
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=lambda params, rng, step: rollout(params["policy"], rng, step),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=lambda params: evaluate(params["policy"]), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="SPA-RL", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
