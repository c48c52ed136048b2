# pylint: disable=invalid-name
r"""MatchTIR (arXiv 2601.10712): turn-level credit for tool use from matched tool calls.

  python -m experiments.agents.matchtir --workdir=runs/matchtir         # cpu: tiny model, minutes
  python -m experiments.agents.matchtir --config.loss.credit=grpo        # outcome-only baseline
  python -m experiments.agents.matchtir --config.loss.matching=ot        # optimal-transport rewards
  python -m experiments.agents.matchtir --config=experiments/agents/matchtir.py:smollm2
  python -m experiments.agents.matchtir --config=experiments/agents/matchtir.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/matchtir  # accelerators

The task is multi-turn tool use (agentrl/envs/tool_use.py): a fictional world whose facts are
known only through `lookup`, and questions that need 1 to 3 calls in sequence, later calls
using earlier results, then `<answer>`. Every task has a gold call trace. Per trajectory i and
model turn k (`agentrl.credit.matchtir`, after the authors' `compute_process_KM`):

  r_k    the similarity of turn k's call to the gold call it is matched with, all of the
         trajectory's calls matched jointly against the gold trace (loss.matching:
         "kuhn_munkres" the optimal one-to-one matching, "greedy" the released code's matcher,
         "ot" Sinkhorn transport); similarity = (1 + argument-key overlap + matching values) /
         (2 + #gold arguments) for the right tool name, else 0; a turn without a parseable call,
         or an unmatched one, gets 0. The answer turn's r is the outcome instead (1 right, 0
         wrong: the env's exact match; the authors score a token-set F1 of the answer, which is
         the same on these one-token answers).
  A_k    (A_traj + A_turn) / 2, A_traj the GRPO z-score of sum_k r_k within the prompt's group
         and A_turn the z-score of the discounted return sum_{j>=k} gamma^(j-k) r_j within each
         (prompt, turn index) group (gamma 0.9, the authors' value).

Every policy token of turn k gets A_k; tool responses get none (loss mask 0). loss.credit=grpo
gives every turn the outcome's group z-score instead, with everything else equal. The loss is
the PPO clipped surrogate.

Presets: `cpu` (default): a tiny scratch model warm-started by SFT on the env's demonstrations
(the gold calls, then the answer) to `sft.target_success`, then RL on all five task kinds,
evaluated greedily on held-out worlds; `smollm2`: SmolLM2-135M-Instruct with the chat template
and the env's tool list as system prompt, a few CPU steps; `pod`: Qwen3-8B on an fsdp mesh;
`smoke` exercises the code path in seconds. Every run writes config.json, metrics.jsonl,
TensorBoard events, curves.png, summary.json and checkpoints to --workdir.

This file is the fork unit; the building blocks come from agentrl.harness.recipe, agentrl.train.loop
and agentrl.credit.matchtir.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import matchtir
from agentrl import distributed
from agentrl.envs import tool_use
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
  if arg.preset not in ("cpu", "smollm2", "pod"):
    raise configs.ConfigError(f"unknown matchtir preset {arg.preset!r}; use cpu (default), "
                              "smollm2, pod or smoke")
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # family: "mixed" (a task kind drawn per seed) or one of tool_use.TASKS.
  c.task = dict(name="tool_use", family="mixed", max_turns=5, chat_template=False)
  c.sft.update(target_success=0.2, demo_noise=0.0, eval_every=25, eval_problems=100)
  c.rollout.update(prompts_per_step=16, group_size=8, max_new_tokens=40, max_len=256)
  if arg.preset == "cpu" and not arg.smoke:
    c.total_steps = 100
    c.rollout.temperature = 0.7
    c.optim.update(lr=3e-4, warmup_steps=10)
  # credit: "matchtir" (the module docstring) or "grpo" (the outcome on every turn).
  # matching: matchtir.METHODS; unmatched_penalty: the reward of a call no gold call is left
  # for (0 in the authors' training path). gamma discounts later turns' rewards in A_turn.
  c.loss = dict(credit="matchtir", matching="kuhn_munkres", unmatched_penalty=0.0, gamma=0.9,
                eps_low=0.2, eps_high=0.2, agg="token-mean")
  c.eval.update(num_problems=200, every=25)
  if arg.preset == "smollm2":  # SmolLM2-135M-Instruct, a few CPU steps.
    c.task.chat_template = True
    c.rollout.update(prompts_per_step=2, group_size=4, max_new_tokens=64, max_len=768)
    c.eval.update(num_problems=8, every=0)
  elif arg.preset == "pod":  # Qwen3-8B on fsdp=8 (rl_config.rl_config); set model.path.
    c.task.chat_template = True
    c.rollout.update(prompts_per_step=128, group_size=8, max_new_tokens=256, max_len=4096)
    c.eval.update(num_problems=256, every=20)
  if arg.smoke:  # Run by tests/experiments_smoke_test.py; exercises the code path only.
    c.task.update(max_turns=2, chat_template=False)
    c.model.update(init="scratch", variant="tiny")
    c.sft.update(eval_problems=4)
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8, max_len=64)
    c.eval.num_problems = 2
  return c


CREDITS = ("matchtir", "grpo")
SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    "task.name": configs.Key(str, choices=("tool_use",)),
    "task.family": configs.Key(str, choices=("mixed",) + tool_use.TASKS),
    "task.max_turns": configs.Key(int, min=2),
    "task.chat_template": configs.Key(bool),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=2, why="for the group z-scores"),
    "loss.credit": configs.Key(str, choices=CREDITS),
    "loss.matching": configs.Key(str, choices=matchtir.METHODS),
    "loss.unmatched_penalty": configs.Key(float, max=0.0),
    "loss.gamma": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
}


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
  """(batch, extras) -> (batch with adv_BT, metrics): MatchTIR's dual-level advantage of the
  matched turn rewards in extras, or outcome GRPO (loss.credit)."""
  G = config.rollout.group_size
  if config.loss.credit == "grpo":
    return estimators.grpo_step(G)

  def advantage_fn(batch: types.Batch, extras):
    reward_BU, mask_BU = extras["turn_reward_BU"], extras["turn_mask_BU"]
    adv_BU = matchtir.dual_advantage(reward_BU, mask_BU, group_size=G, gamma=config.loss.gamma)
    adv_BT = estimators.broadcast_turn_to_tokens(adv_BU, batch.turn_BT, batch.loss_mask_BT)
    return batch.replace(adv_BT=adv_BT), {
        "adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
        "turn_reward_mean": aggregation.masked_mean(reward_BU, mask_BU)}

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# The rollout: groups, packed, and the matched turn rewards.
# ---------------------------------------------------------------------------------------------
def turn_rewards(trajs, gold_calls, *, max_turns: int, matching: str,
                 unmatched_penalty: float) -> tuple[np.ndarray, np.ndarray]:
  """MatchTIR's per-turn rewards [B, U] and the turn mask [B, U] of the trajectories.

  Turn k's calls are every call the env parsed from it, in order (info["calls"], also those the
  env then rejected); a turn the env ended with an answer is the answer turn and carries the
  env's reward for it (the outcome).
  """
  reward = np.zeros((len(trajs), max_turns), np.float32)
  mask = np.zeros((len(trajs), max_turns), np.float32)
  for i, (traj, golds) in enumerate(zip(trajs, gold_calls)):
    infos = traj.infos[:max_turns]
    if not infos:
      continue
    calls = [list(info.get("calls", ())) for info in infos]
    answered = "answer" in infos[-1]
    r = matchtir.turn_rewards(calls, golds, method=matching, unmatched_penalty=unmatched_penalty,
                              answer_score=traj.turn_rewards[len(infos) - 1] if answered else None)
    reward[i, :len(r)], mask[i, :len(r)] = r, 1.0
  return reward, mask


def make_rollout_fn(config, engine, tok, make_env, data, mesh):
  """Groups of multi-turn tool-use rollouts, packed, with the matched turn rewards."""
  rc, tc, lc = config.rollout, config.task, config.loss

  def gold_calls(seeds):
    out = []
    for seed in seeds:
      env = make_env()
      env.reset(seed)
      out += [env.gold_calls] * rc.group_size
    return out

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    groups = agent_loop.rollout_groups(
        engine, params, tok, make_env, seeds, group_size=rc.group_size, rng=rng,
        max_turns=tc.max_turns, max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
        temperature=rc.temperature, chat_template=tc.chat_template)
    trajs, rows = groups.trajectories, sharding.batch_sharding(mesh)
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    reward_BU, mask_BU = turn_rewards(trajs, gold_calls(seeds), max_turns=tc.max_turns,
                                      matching=lc.matching,
                                      unmatched_penalty=lc.unmatched_penalty)
    calls = sum(len(info.get("calls", ())) for t in trajs for info in t.infos)
    host = {**groups.metrics, **collect.rollout_metrics(trajs),
            **collect.batch_metrics(trajs, batch),
            "rollout/calls_per_episode": calls / len(trajs)}
    extras = jax.device_put({"turn_reward_BU": reward_BU, "turn_mask_BU": mask_BU}, rows)
    return loop.Rollout(batch=batch, metrics=host, extras=extras, trajectories=trajs,
                        tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """MatchTIR end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="matchtir")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (a scratch model is warm-started by SFT on the env's demonstrations), frozen
  # reference (for the logged kl), optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Data, rollout, held-out evaluation and the RL loop.
  data = recipe.prompt_stream(make_env)
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  name = "MatchTIR" if config.loss.credit == "matchtir" else "GRPO (tool use)"
  return rundir.write_summary(workdir, result, name=name, start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
