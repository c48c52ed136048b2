# pylint: disable=invalid-name
r"""DAPO (Yu et al. 2025, arXiv 2503.14476): GRPO with the four DAPO changes.

  python -m experiments.policy.dapo
  python -m experiments.policy.dapo --config=experiments/policy/dapo.py:smoke --workdir=/tmp/dapo

docs/algorithms.md §4.5:
  * clip-higher: eps_low = 0.2, eps_high = 0.28;
  * token-level loss: token-mean over the whole minibatch;
  * dynamic sampling: groups whose G rewards are all equal carry no GRPO signal; keep sampling
    new prompts (up to rollout.max_gen_batches batches) until prompts_per_step groups with a
    reward spread are found. If the budget runs out, the batch is topped up with all-equal
    groups, whose advantage is exactly 0, so shapes (and the compiled step) never change;
  * overlong reward shaping: with L_exp = L_max - L_buf, a response of length L gets
    min(-(L - L_exp) / L_buf * penalty, 0) added to its reward (L_max = max_new_tokens);
and no KL term.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
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
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # overlong_buffer: L_buf. The reversed-addition answer is 5 tokens of at most 6, so only a
  # response that fills the whole budget is shaped.
  c.loss = dict(eps_low=0.2, eps_high=0.28, overlong_buffer=1, overlong_penalty=1.0)
  c.rollout.max_gen_batches = 3
  if c.rollout.max_new_tokens > 8:  # chat-model presets
    c.loss.overlong_buffer = c.rollout.max_new_tokens // 4
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.overlong_buffer": configs.Key(int, min=1),
    "loss.overlong_penalty": configs.Key(float, min=0.0),
    "rollout.max_gen_batches": configs.Key(int, min=1),
}


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = aggregation.aggregate(pg_BT, batch.loss_mask_BT, "token-mean")
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO advantages of the overlong-shaped reward."""
  G, lc, max_new = config.rollout.group_size, config.loss, config.rollout.max_new_tokens

  def advantage_fn(batch: types.Batch, extras):
    del extras
    length_B = batch.loss_mask_BT.sum(-1)
    shaping_B = estimators.dapo_overlong_penalty(length_B, max_len=max_new,
                                                 buffer_len=lc.overlong_buffer,
                                                 penalty_factor=lc.overlong_penalty)
    adv_B = estimators.grpo(batch.reward_B + shaping_B, group_size=G)
    adv_BT = estimators.broadcast_to_tokens(adv_B, batch.loss_mask_BT)
    metrics = {"overlong_shaping": shaping_B.mean(),
               "adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT)}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


def make_rollout_fn(config, engine, tok, make_env, data, mesh):
  """Dynamic sampling: rollout_fn(params, rng, step) with only informative groups if it can."""
  rc, G = config.rollout, config.rollout.group_size

  def rollout_fn(params, rng, step):
    del step
    kept, spare, sampled = [], [], []
    for attempt in range(rc.max_gen_batches):
      seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
      groups = agent_loop.rollout_groups(
          engine, params, tok, make_env, seeds, group_size=G, rng=jax.random.fold_in(rng, attempt),
          max_turns=config.task.max_turns, max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
          temperature=rc.temperature, chat_template=config.task.chat_template)
      sampled += groups.trajectories
      for i in range(rc.prompts_per_step):
        group = groups.trajectories[i * G:(i + 1) * G]
        rewards = {t.reward for t in group}
        (kept if len(rewards) > 1 else spare).append(group)
      if len(kept) >= rc.prompts_per_step:
        break
    chosen = (kept + spare)[:rc.prompts_per_step]
    trajs = [t for group in chosen for t in group]
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id,
                      min_len=min(rc.min_len, rc.max_len), per_octave=rc.buckets_per_octave,
                      sharding=sharding.batch_sharding(mesh))
    # reward/success describe the policy, so they average every sampled trajectory.
    host = {**collect.rollout_metrics(sampled), **collect.batch_metrics(trajs, batch),
            "dapo/gen_batches": float(attempt + 1),
            "dapo/informative_groups": float(min(len(kept), rc.prompts_per_step))}
    return loop.Rollout(batch=batch, metrics=host, lengths_B=collect.row_lengths(trajs, batch),
                        trajectories=trajs, tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """DAPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="dapo")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="DAPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
