# pylint: disable=invalid-name
r"""TTExplore (arXiv 2605.24828): a thinker that infers the hidden rule for an actor, trained
with the task's score.

  python -m experiments.agents.ttexplore --workdir=runs/ttexplore        # cpu: tiny model, minutes
  python -m experiments.agents.ttexplore --config=experiments/agents/ttexplore.py:smollm2
  python -m experiments.agents.ttexplore --config=experiments/agents/ttexplore.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/ttexplore   # accelerators

The game is hidden_rule's number guessing (7 turns of "guess X" / "higher" / "lower"). Before
game turns (`thinker.schedule`: every turn from `thinker.first` on, or one drawn turn) the
observation asks for a thought: the *thinker* reads the history and writes what it infers
(in the compact style, the range still open: "51-74"); the thought stays in the context and
the *actor* acts on (agentrl/envs/thinker.py). Training follows the paper's pipeline:

  - the thinker's reward is the episode's task-level score (the game's outcome), with no
    judging of the thought itself;
  - each trajectory keeps a single thinking node, so one reward is not spread over many
    thoughts: a group keeps the thoughts written at one model turn drawn among those where
    two or more of its rows thought, and A_i is the outcome's z-score among those rows
    (`loss.baseline="turn"`, `thinker.shared_thought_turn`; "group": each row's own drawn
    thought and GRPO over the group) [INF: the paper does not say which node is kept];
  - only that thought's tokens carry loss (PPO clipped surrogate); the actor's commands, the
    observations and the other thoughts get none [INF: the paper trains a separate thinker].

Thinker and actor are the same weights in two roles (the thought is one model turn of the
episode, decoded with the same KV cache). The paper's thinker is a separate model next to a
frozen actor; that needs a second model in the rollout, which this file does not build: here
the actor's behaviour changes only through the weights it shares with the thinker, and
`loss.actor_kl` x KL(pi || pi_ref) on the actor's own tokens holds it near its warm start
[INF] (0 removes the anchor; without it, the thinker's updates pushed the tiny actor out of the
game's command format within ten steps: invalid commands tripled).

A scratch model is warm-started by SFT on the expert's games, `thinker.sft_actor_only` of them
without thoughts (so the actor alone can be measured) and the rest with the ideal thought at
every cue. Held-out evaluation reports greedy success with the thinker (`eval/success`), the
actor alone on the same secrets (`eval/success_actor_only`) and how often the greedy thoughts
state the ideal range (`eval/thought_acc`), before RL and every `eval.every` steps.

Presets: `cpu` (default, the tiny model), `smollm2` (SmolLM2-135M-Instruct with the chat
template and the full-text game, a few CPU steps), `pod` (Qwen3-8B from --config.model.path on
a (data, fsdp, tensor) = (-1, 8, 1) mesh), `smoke` (the code path in seconds). Every run writes
config.json, metrics.jsonl, TensorBoard events, curves.png, summary.json and checkpoints.

This file is the fork unit: the config, the loss composition, the advantage step, the
thinker rollout and the loop are all here; the building blocks come from agentrl.harness.recipe,
agentrl.train.loop and agentrl.envs.thinker.
"""
import functools

from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.envs import hidden_rule
from agentrl.envs import thinker
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import sft
from agentrl.losses import aggregation
from agentrl.losses import kl
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
    raise configs.ConfigError(f"unknown ttexplore preset {arg.preset!r}; use cpu (default), "
                              "smollm2, pod or smoke")
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # max_turns: the game's turns (commands); thoughts come on top of them.
  c.task = dict(name="hidden_rule", family="guess", max_turns=7, style="compact",
                chat_template=False)
  # schedule: "every" (a thought before every game turn from `first` on: the thinker is called
  # periodically) or "once" (before one turn drawn per secret); sft_actor_only: the share of
  # SFT demonstrations without thoughts.
  c.thinker = dict(schedule="every", first=1, sft_actor_only=0.5)
  c.sft.update(target_success=0.3, demo_noise=0.0, eval_every=10, eval_problems=200)
  c.rollout.update(prompts_per_step=32, group_size=8, max_new_tokens=8, max_len=160)
  if arg.preset == "cpu" and not arg.smoke:
    # As the agent main job (temperature 0.7, warmup), at a third of its learning rate: the
    # thoughts are a few tokens per episode and their distribution moved fast at 3e-4.
    c.total_steps = 100
    c.rollout.temperature = 0.7
    c.optim.update(lr=1e-4, warmup_steps=10)
  # agg: seq-mean-token-mean weighs every kept thought equally, whatever its length.
  # actor_kl: the coefficient of KL(pi || pi_ref) (k3, token-mean) on the actor's own sampled
  # tokens, which carry no policy-gradient loss: with shared weights it holds the actor near its
  # warm start while the thinker role trains (0: no anchor) [INF].
  # baseline: "turn" (each group keeps the thoughts written at one shared model turn and
  # z-scores the outcomes of the rows that wrote one there: thinker.shared_thought_turn) or
  # "group" (each row keeps its own drawn thought; GRPO over the whole group) [INF].
  c.loss = dict(eps_low=0.2, eps_high=0.2, agg="seq-mean-token-mean", baseline="turn",
                actor_kl=0.1)
  c.eval.update(num_problems=300, every=25)
  if arg.preset == "smollm2":  # SmolLM2-135M-Instruct, a few CPU steps.
    c.task.update(max_turns=5, style="full", chat_template=True)
    c.loss.agg = "token-mean"
    c.rollout.update(prompts_per_step=2, group_size=4, max_new_tokens=32, max_len=768)
    c.eval.update(num_problems=8, every=0)
  elif arg.preset == "pod":  # Qwen3-8B on fsdp=8 (rl_config.rl_config); set model.path.
    c.task.update(style="full", chat_template=True)
    c.loss.agg = "token-mean"
    c.rollout.update(prompts_per_step=128, group_size=8, max_new_tokens=256, max_len=4096)
    c.eval.update(num_problems=256, every=20)
  if arg.smoke:  # Run by tests/experiments_smoke_test.py; exercises the code path only.
    c.task.update(max_turns=3, style="compact", chat_template=False)
    c.model.update(init="scratch", variant="tiny")
    c.sft.update(eval_problems=4)
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8, max_len=96)
    c.eval.num_problems = 2
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    "task.name": configs.Key(str, choices=("hidden_rule",)),
    "task.family": configs.Key(str, choices=hidden_rule.BELIEF_FAMILIES),
    "task.max_turns": configs.Key(int, min=2),
    "task.style": configs.Key(str, choices=hidden_rule.STYLES),
    "task.chat_template": configs.Key(bool),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "thinker.schedule": configs.Key(str, choices=("every", "once")),
    "thinker.first": configs.Key(int, min=0, why="a game turn; below task.max_turns"),
    "thinker.sft_actor_only": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=2, why="for GRPO's group baseline"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.baseline": configs.Key(str, choices=("turn", "group")),
    "loss.actor_kl": configs.Key(float, min=0.0),
}


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  return loop.gradient_step(make_loss_fn(config, graphdef), tx)


def make_loss_fn(config, graphdef):
  """loss_fn(params, batch) -> (loss, metrics): the PPO clipped surrogate on the thinker's
  kept thought + loss.actor_kl x KL(pi || pi_ref) on the actor's tokens.

  The batch's loss mask is 1 on the kept thought's tokens only (the rollout sets it), so the
  policy gradient trains the thinker role and nothing else; the actor's sampled tokens
  (`batch.aux["actor_mask_BT"]`) only anchor the shared weights to the warm start there.
  """
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    actor_mask_BT = batch.aux["actor_mask_BT"]
    actor_kl = aggregation.aggregate(kl.kl_penalty(logp_BT, batch.ref_logp_BT, "k3"),
                                     actor_mask_BT, "token-mean")
    loss = aggregation.aggregate(pg_BT, batch.loss_mask_BT, lc.agg) + lc.actor_kl * actor_kl
    return loss, metrics | {"loss": loss, "actor_kl": actor_kl}

  return loss_fn


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT and aux, metrics): the episode outcome (the
  task-level score is the thinker's reward) z-scored among the group's rows that kept a thought
  at the same turn (loss.baseline="turn": `estimators.turn_group` over extras["kept_turn_B"])
  or over the whole group ("group": GRPO), on the kept thought's tokens; the actor's token
  mask (extras) goes to the loss in batch.aux."""
  G, U = config.rollout.group_size, make_thinker_env(config)().max_turns
  grpo = estimators.grpo_step(G)

  def turn_baseline(batch: types.Batch, extras):
    mask_BU = (extras["kept_turn_B"][:, None] == jnp.arange(U)[None, :]).astype(jnp.float32)
    adv_BU = estimators.turn_group(batch.reward_B[:, None] * mask_BU, mask_BU, group_size=G)
    adv_BT = estimators.broadcast_turn_to_tokens(adv_BU, batch.turn_BT, batch.loss_mask_BT)
    # With binary outcomes a kept row's z-score is 0 exactly when the rows compared with it
    # (same group, same kept turn) all scored alike.
    live_B = (adv_BU != 0).any(-1)
    return batch.replace(adv_BT=adv_BT), {
        "adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
        "groups_with_signal": live_B.astype(jnp.float32).mean()}

  def advantage_fn(batch: types.Batch, extras):
    if config.loss.baseline == "turn":
      batch, metrics = turn_baseline(batch, extras)
    else:
      batch, metrics = grpo(batch, extras)
    return batch.replace(aux={"actor_mask_BT": extras["actor_mask_BT"]}), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# The thinker's environment, demonstrations, rollout and evaluation.
# ---------------------------------------------------------------------------------------------
def make_thinker_env(config, schedule: str | None = None):
  """make_env() for the game with thinker turns (`schedule` overrides thinker.schedule)."""
  tc, th = config.task, config.thinker
  if not th.first < tc.max_turns:
    raise configs.ConfigError(f"thinker.first={th.first} must be below task.max_turns="
                              f"{tc.max_turns} (a thought comes before a game turn)")
  return functools.partial(thinker.ThinkerEnv, tc.family, max_turns=tc.max_turns,
                           style=tc.style, schedule=schedule or th.schedule, first=th.first)


def demonstrations(config, tok, success) -> sft.Data:
  """SFT batches: each batch's first rows are the expert's games with the ideal thought at
  every cue, its last round(sft_actor_only * batch) rows the same games without thoughts."""
  sc, rc = config.sft, config.rollout
  plain = round(config.thinker.sft_actor_only * sc.batch_size)
  envs = ((make_thinker_env(config), sc.batch_size - plain),
          (make_thinker_env(config, "never"), plain))

  def batch(step):
    start, parts = sft.SFT_SEED_BASE + step * sc.batch_size, []
    for make_env, rows in envs:
      if rows:
        parts.append(sft.demonstration_batch(
            tok, make_env, range(start, start + rows), max_len=rc.max_len,
            chat_template=config.task.chat_template, noise=sc.demo_noise))
      start += rows
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  return sft.Data(batch=batch, success=success)


def thought_metrics(trajs) -> dict[str, float]:
  """The share of trajectories with a thought, and of thoughts that state the ideal belief."""
  flags = [info["thought_correct"] for t in trajs for info in t.infos if info.get("thought")]
  return {"thought_frac": float(np.mean([bool(thinker.thought_turns(t.infos)) for t in trajs])),
          "thought_acc": float(np.mean(flags)) if flags else 0.0}


def keep_thoughts(trajs, rng: np.random.Generator, *, group_size: int,
                  baseline: str) -> tuple[list[np.ndarray], np.ndarray]:
  """Sets each trajectory's loss mask to its kept thought and returns (the actor's token masks:
  the sampled tokens of every turn that is not a thought, the kept turns [B], -1 for none).

  baseline "turn": one node per group (`thinker.shared_thought_turn`), kept by the rows that
  thought there; "group": each row's own uniformly drawn thought (`thinker.keep_one_thought`).
  """
  actor_masks, kept = [], []
  for start in range(0, len(trajs), group_size):
    group = trajs[start:start + group_size]
    at = (thinker.shared_thought_turn([t.infos for t in group], rng)
          if baseline == "turn" else None)
    for t in group:
      actor_masks.append(t.loss_mask * ~np.isin(t.turn, thinker.thought_turns(t.infos)))
      t.loss_mask, turn = thinker.keep_one_thought(t.turn, t.loss_mask, t.infos, rng, at=at)
      kept.append(turn)
  return actor_masks, np.asarray(kept, np.int32)


def make_rollout_fn(config, engine, tok, make_env, data, mesh):
  """G episodes per secret with thoughts; each keeps one thought's tokens as its loss mask."""
  rc, tc = config.rollout, config.task
  model_turns = make_env().max_turns

  def rollout_fn(params, rng, step):
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    groups = agent_loop.rollout_groups(
        engine, params, tok, make_env, seeds, group_size=rc.group_size, rng=rng,
        max_turns=model_turns, max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
        temperature=rc.temperature, chat_template=tc.chat_template)
    trajs = groups.trajectories
    metrics = {**groups.metrics, **collect.rollout_metrics(trajs), **thought_metrics(trajs)}
    # The kept thoughts are drawn from the step's own stream (not the sampling's rng), so a
    # resumed run keeps the same ones.
    actor_masks, kept_B = keep_thoughts(trajs, np.random.default_rng([config.seed, step]),
                                        group_size=rc.group_size, baseline=config.loss.baseline)
    rows = sharding.batch_sharding(mesh)
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id,
                      min_len=min(rc.min_len, rc.max_len), per_octave=rc.buckets_per_octave,
                      sharding=rows)
    actor_mask_BT = np.zeros(batch.loss_mask_BT.shape, np.float32)
    for b, mask in enumerate(actor_masks):
      actor_mask_BT[b, :len(mask)] = mask[:actor_mask_BT.shape[1]]
    metrics |= collect.batch_metrics(trajs, batch)
    return loop.Rollout(batch=batch, metrics=metrics,
                        extras=jax.device_put({"actor_mask_BT": actor_mask_BT,
                                               "kept_turn_B": kept_B}, rows),
                        lengths_B=collect.row_lengths(trajs, batch), trajectories=trajs,
                        tokenizer=tok)

  return rollout_fn


def greedy_episodes(config, engine, tok, params, *, schedule: str | None = None, num: int,
                    seed_base: int = recipe.EVAL_SEED_BASE) -> list:
  """Greedy episodes on the secrets seed_base + i, i < num (default: the held-out ones)."""
  rc, make_env = config.rollout, make_thinker_env(config, schedule)
  return recipe.held_out_rollouts(
      engine, tok, make_env, params, num=num, max_turns=make_env().max_turns,
      max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
      chat_template=config.task.chat_template, seed_base=seed_base)


def success_rate(trajs) -> float:
  return float(np.mean([collect.trajectory_success(t) for t in trajs]))


def evaluator(config, engine, tok):
  """evaluate(params) -> held-out greedy success with the thinker and of the actor alone, and
  the greedy thoughts' accuracy, on the same eval.num_problems secrets."""
  num = config.eval.num_problems

  def evaluate(params):
    with_thinker = greedy_episodes(config, engine, tok, params, num=num)
    alone = greedy_episodes(config, engine, tok, params, schedule="never", num=num)
    return {"success": success_rate(with_thinker), "success_actor_only": success_rate(alone),
            "thought_acc": thought_metrics(with_thinker)["thought_acc"]}

  return evaluate


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """TTExplore end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  make_env = make_thinker_env(config)
  start = rundir.write_config(config, workdir, experiment="ttexplore")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)

  # ---- Policy, warm-started on demonstrations with and without thoughts (validation: greedy
  # success with the thinker), frozen reference (for the logged kl), optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  validation = functools.partial(greedy_episodes, config, engine, tok,
                                 num=config.sft.eval_problems, seed_base=sft.VALID_SEED_BASE)
  params, sft_info = recipe.warm_start(
      config, workdir, mesh, graphdef, params, tok, engine=engine,
      data=demonstrations(config, tok, lambda p: success_rate(validation(p))))
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout (secrets from the game's training seeds) and held-out evaluation.
  data = recipe.prompt_stream(make_env)
  evaluate = evaluator(config, engine, tok)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=evaluate, **recipe.loop_options(config))
  first, last = result.evals["0"], result.evals[str(result.step)]
  extra = {"actor_only_before": first["eval/success_actor_only"],
           "actor_only_after": last["eval/success_actor_only"],
           "thought_acc_before": first["eval/thought_acc"],
           "thought_acc_after": last["eval/thought_acc"]}
  print(f"Held-out greedy success, actor alone: {extra['actor_only_before']:.1%} -> "
        f"{extra['actor_only_after']:.1%}; with the thinker: {first['eval/success']:.1%} -> "
        f"{last['eval/success']:.1%}; ideal thoughts {extra['thought_acc_before']:.1%} -> "
        f"{extra['thought_acc_after']:.1%}.", flush=True)
  return rundir.write_summary(workdir, result, name="TTExplore", start=start,
                              sft_info=sft_info, extra=extra)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
