# pylint: disable=invalid-name
r"""SPEAR (Qin et al. 2025, arXiv 2509.22601): GRPO on a multi-turn agent task plus
self-imitation of replayed good trajectories (docs/algorithms.md §16.3).

  python -m experiments.agents.spear --workdir=runs/spear                  # hidden-rule game
  python -m experiments.agents.spear --config.spear.warmup_steps=200       # the authors' ramp
  python -m experiments.agents.spear --config=experiments/agents/spear.py:smoke --workdir=/tmp/sp

Each step:
  1. G samples per prompt, packed on the host; GRPO advantages over each group;
  2. the buffer drops rows sampled spear.max_age or more versions ago
     (`replay_buffer.evict_stale`: SPEAR's `trajectory_tolerate_steps` 10) and draws up to
     spear.rows stored rows uniformly (`replay_buffer.sample`);
  3. the step's rows whose GRPO advantage exceeds spear.threshold (1) are stored, with the
     sampler's log-probs as their pi_old, and every row's reward enters the reward history;
  4. the drawn rows are appended to the batch (`replay_buffer.append_batch`; padded to
     spear.rows with rows that train nothing), with the recalibrated advantage
     (R - b)+, b the median of the last spear.history rewards (`self_imitation.spear_advantage`,
     `replay_buffer.baseline`); the score step keeps their stored pi_old
     (`replay_buffer.keep_stored_logp`);
  5. loss = PPO clip over the sampled rows (token-mean) + spear_coef(update) x SPEAR's
     self-imitation loss over the replayed rows: Clip-Cov PPO with ratio pi_theta /
     pi_old(stored), clip (0.2, 0.28), clip_cov_ratio 0.02, bounds (1, 40), token-mean
     (`self_imitation.spear_sil`); the coefficient rises from 0 to spear.coef over
     spear.warmup_steps updates on a half cosine (`self_imitation.spear_coef`).

Defaults [code]: threshold 1, 10 versions, 10240 rewards in the baseline, coefficient 1 over
200 steps; the `cpu` preset ramps over 50 updates instead, so a run of a few tens of steps sees
the term [INF], and draws 32 replayed rows a step (an eighth of the 256 sampled) [INF: the
authors' replay batch is not read here]. Not built: SPEAR's tool-call intrinsic reward and its
GiGPO variant. The buffer is a `loop.run(host_state=...)`, saved with every checkpoint, so a
resumed run replays exactly (updates.max_staleness = 0).

Presets: cpu (default: the hidden-rule game, agentrl.harness.rl_config.hidden_rule_study),
textworld (rl_config.textworld_study), pod (the game at agent.py's pod scale with the
authors' buffer of 2048 rows and 200-step ramp), smoke (CI, seconds).
This file is the fork unit; the building blocks come from agentrl.harness.recipe, loop,
agentrl.train.replay_buffer and agentrl.losses.self_imitation.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.losses import self_imitation
from agentrl.models import policy as policy_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl.train import replay_buffer as rb
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.agent_study(arg, experiment="spear", names=registry.NAMES)
  c.loss = dict(eps_low=0.2, eps_high=0.2, agg="token-mean")
  # rows: replayed rows per step; capacity, threshold, max_age, history, percentile: the
  # buffer (module docstring); coef, warmup_steps: the self-imitation coefficient's ramp;
  # sil_eps_*, clip_cov_*: the self-imitation loss's clip and Clip-Cov.
  c.spear = dict(rows=32, capacity=512, threshold=1.0, max_age=10, history=10240,
                 percentile=50.0, coef=1.0, warmup_steps=50, sil_eps_low=0.2,
                 sil_eps_high=0.28, clip_cov_ratio=0.02, clip_cov_lb=1.0, clip_cov_ub=40.0)
  if arg.preset == "pod":
    c.spear.update(rows=128, capacity=2048, warmup_steps=200)
  if arg.smoke:
    c.spear.update(rows=2, capacity=8, warmup_steps=1, threshold=-1.0)  # store every row
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=2, why="for GRPO's group advantage"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "spear.rows": configs.Key(int, min=1),
    "spear.capacity": configs.Key(int, min=1),
    "spear.threshold": configs.Key(float),
    "spear.max_age": configs.Key(int, min=1),
    "spear.history": configs.Key(int, min=1),
    "spear.percentile": configs.Key(float, min=0.0, max=100.0),
    "spear.coef": configs.Key(float, min=0.0),
    "spear.warmup_steps": configs.Key(int, min=1),
    "spear.sil_eps_low": configs.Key(float, min=0.0, max=1.0),
    "spear.sil_eps_high": configs.Key(float, min=0.0),
    "spear.clip_cov_ratio": configs.Key(float, min=1e-6),
    "spear.clip_cov_lb": configs.Key(float),
    "spear.clip_cov_ub": configs.Key(float),
}


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train().

  The sampled rows train GRPO's PPO clip; the replayed rows (`aux["replay_B"]`) SPEAR's
  self-imitation loss, scaled by the coefficient at the update count."""
  lc, sc = config.loss, config.spear
  impl, temperature = config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch, step):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    replay_B1 = batch.aux["replay_B"][:, None]
    on_BT, sil_mask_BT = batch.loss_mask_BT * (1.0 - replay_B1), batch.loss_mask_BT * replay_B1
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, on_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    pg_loss = aggregation.aggregate(pg_BT, on_BT, lc.agg)
    sil_BT, sil_metrics = self_imitation.spear_sil(
        logp_BT, batch.old_logp_BT, batch.aux["sil_adv_B"], sil_mask_BT,
        rng=jax.random.fold_in(jax.random.key(config.seed), step), eps_low=sc.sil_eps_low,
        eps_high=sc.sil_eps_high, clip_cov_ratio=sc.clip_cov_ratio,
        clip_cov_lb=sc.clip_cov_lb, clip_cov_ub=sc.clip_cov_ub)
    sil_loss = aggregation.aggregate(sil_BT, sil_mask_BT, "token-mean")
    coef = self_imitation.spear_coef(step, coef=sc.coef, warmup_steps=sc.warmup_steps)
    loss = pg_loss + coef * sil_loss
    return loss, metrics | {"loss": loss, "sil_loss": sil_loss, "sil_coef": coef,
                            "sil_cov_clipfrac": sil_metrics["cov_clipfrac"]}

  return loop.gradient_step(loss_fn, tx, with_step=True)


def make_advantage_fn(config):
  """GRPO over the sampled rows' groups; the appended replay rows get 0 (their advantage is
  `aux["sil_adv_B"]`, read by the self-imitation loss)."""
  G, R = config.rollout.group_size, config.spear.rows

  def advantage_fn(batch: types.Batch, extras):
    del extras
    n = batch.reward_B.shape[0] - R
    sampled_B = batch.reward_B[:n]
    adv_B = jnp.concatenate([estimators.grpo(sampled_B, group_size=G), jnp.zeros((R,))])
    adv_BT = estimators.broadcast_to_tokens(adv_B, batch.loss_mask_BT)
    live_B = estimators.group_has_variance(sampled_B, group_size=G)
    return batch.replace(adv_BT=adv_BT), {
        "adv_abs_mean": estimators.adv_abs_mean(adv_BT[:n], batch.loss_mask_BT[:n]),
        "groups_with_signal": live_B.astype(jnp.float32).mean()}

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# The rollout: groups, the buffer updated, replayed rows appended.
# ---------------------------------------------------------------------------------------------
def replay_step(buf: rb.Buffer, host: types.Batch, prompt_B: np.ndarray, sc, *, G: int,
                version: int, seed: int) -> tuple[types.Batch, rb.Buffer, dict[str, float]]:
  """One step of SPEAR's buffer on a packed host batch: (batch with the replayed rows
  appended, the new buffer, metrics). Stale rows go, up to sc.rows stored rows are drawn,
  the step's rows with GRPO advantage > sc.threshold are stored, and the drawn rows'
  advantage is (R − b)+ against the history's sc.percentile after this step's rewards."""
  buf = rb.evict_stale(buf, version=version, max_age=sc.max_age)
  slots_S = rb.sample(buf, sc.rows, seed=seed)
  adv_B = np.asarray(estimators.grpo(host.reward_B, group_size=G))
  new = rb.add(buf, prompt_B=prompt_B, tokens_BT=host.tokens_BT,
               input_mask_BT=host.input_mask_BT, loss_mask_BT=host.loss_mask_BT,
               old_logp_BT=host.sampler_logp_BT, reward_B=host.reward_B, version=version,
               keep_B=adv_B > sc.threshold, per_prompt_cap=G, evict="oldest")
  base = rb.baseline(new, percentile=sc.percentile)
  sil_adv_S = np.asarray(self_imitation.spear_advantage(buf.reward_C[slots_S], baseline=base))
  sil_adv_R = np.zeros((sc.rows,), np.float32)
  sil_adv_R[:len(slots_S)] = sil_adv_S
  batch = rb.append_batch(host, buf, slots_S, sc.rows, sil_adv_B=sil_adv_R)
  return batch, new, {
      "replay/size": float(rb.size(new)), "replay/replayed_rows": float(len(slots_S)),
      "replay/sil_active_frac": float((sil_adv_S > 0).mean()) if len(slots_S) else 0.0,
      "replay/baseline": base}


def make_rollout_fn(config, engine, tok, make_env, data, mesh, holder: rb.Holder):
  """rollout_fn(params, rng, step): G samples per prompt plus spear.rows replayed rows."""
  rc, tc = config.rollout, config.task
  G, U, rows = rc.group_size, make_env().max_turns, sharding.batch_sharding(mesh)

  def rollout_fn(params, rng, step):
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    groups = agent_loop.rollout_groups(
        engine, params, tok, make_env, seeds, group_size=G, rng=rng, max_turns=U,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
        chat_template=tc.chat_template)
    trajs = groups.trajectories
    host = pack.pack_numpy(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len)
    host = host.replace(version_B=np.full((len(trajs),), step - 1, np.int32))
    batch, holder.buffer, replay_metrics = replay_step(
        holder.buffer, host, np.repeat(seeds, G), config.spear, G=G, version=step - 1,
        seed=config.seed * 1_000_003 + step)
    host_metrics = {**groups.metrics, **collect.rollout_metrics(trajs),
                    **collect.batch_metrics(trajs, host), **replay_metrics}
    return loop.Rollout(batch=jax.device_put(batch, rows), metrics=host_metrics,
                        trajectories=trajs, tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """SPEAR end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.updates.max_staleness == 0,
                  "config.updates.max_staleness must be 0 for spear: its replay buffer is "
                  "checkpointed with the step that filled it")
  rows = config.rollout.prompts_per_step * config.rollout.group_size + config.spear.rows
  configs.require(rows % config.updates.minibatches == 0,
                  f"config.updates.minibatches ({config.updates.minibatches}) must divide the "
                  f"batch's {rows} rows (prompts_per_step x group_size + spear.rows)")
  start = rundir.write_config(config, workdir, experiment="spear")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), optimizer. No reference model: KL 0.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = loop.make_score_step(graphdef, temperature=rc.temperature,
                                    logprob_impl=config.model.logprob_impl)
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- The replay buffer (checkpointed with the run) and the RL loop.
  holder = rb.Holder(rb.empty(config.spear.capacity, rc.max_len, history=config.spear.history))
  data = recipe.prompt_stream(make_env)
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh, holder),
        score_fn=jax.jit(rb.stored_logp_score(score_step)),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), host_state=holder,
        **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="SPEAR", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
