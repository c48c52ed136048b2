# pylint: disable=invalid-name
r"""SPO-chain (Guo et al. 2025, arXiv 2505.23564): segment advantages from Monte-Carlo values.

  python -m experiments.agents.spo_chain                                  # default CPU run
  python -m experiments.agents.spo_chain --config=experiments/agents/spo_chain.py:smoke \
      --workdir=/tmp/spo
  python -m experiments.agents.spo_chain --config=experiments/agents/spo_chain.py:smollm2 \
      --workdir=runs/spo
  python -m experiments.agents.spo_chain --config=experiments/agents/spo_chain.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/spo_chain     # accelerators

The paper's setting is single-turn reasoning, so this runs on the main GRPO job's task and
warm start (`cpu`: reversed 3-digit addition, a tiny model SFT'd to ~20%). Each step:

  1. G responses per prompt from the rollout engine, scored by the task (R_i).
  2. pi_old recomputed by the trainer's score step (`old_logp_BT`); the cuts are the positions
     before the response tokens with p < spo.prob_threshold (0.9), every spo.interval-th
     (5) kept (`spo.cutpoints`). A cut at column c stands for the state s = tokens[:c + 1].
  3. V(s_k) = mean score of spo.mc_samples fresh continuations of each cut's prefix from the
     current policy, under the response's own remaining token budget: all cuts of the batch x M
     in one call of the jitted KV-cache engine (`spo.mc_requests`, `continuations.
     sample_continuations`; the engine pads its rows to a power of two <= rollout.slots and
     prefill widths to multiples of 16, and prefills each distinct prefix once).
  4. A_t = V(s_k) - V(s_{k-1}) on the tokens of the segment that ends at cut k (the last
     segment ends at R_i; tokens before the first cut get 0), kept only on the tokens with
     p < 0.9 (the probability mask), whitened over them (`spo.chain_advantages`).
  5. PPO clip on the probability-masked tokens, token-mean (the official trainer multiplies
     the action mask by the probability mask), no KL term by default.

Because the cuts need pi_old before the MC rollouts, the score pass runs inside the rollout
and the loop's score phase passes the batch through: time/rollout holds the sampling, the
score pass and the MC rollouts (spo/mc_seconds of it), logged with spo/mc_rollouts and
spo/cuts_per_response.

Settings and deviations (docs/algorithms.md §5.5):
  - M = spo.mc_samples: 9 in the paper and in `pod`; 4 in `cpu` and 2 in `smollm2`/`smoke`,
    for speed on a CPU (the values are noisier).
  - spo.max_cuts: 0 is the paper's "no cap"; the value arrays then hold
    ceil(max_new_tokens / interval) cuts per row, the most a response can have, so their
    shape never changes. `smollm2` (2) and `pod` (8) cap the cuts per response to bound the MC
    cost [INF: a budget, not the paper's]; a capped row keeps its first cuts, and its last
    segment runs from the last kept cut to the response's end.
  - A continuation whose budget is shorter than the call's is sampled further and cut to its
    budget on the host: the first n tokens of a longer sample are an n-token sample.
  - The prompts per step, G, learning rate and clip range are the GRPO job's [INF]; pod
    samples 32 prompts x 8 (the MC rollouts multiply the sampling cost by up to 8 x 9).

Presets: cpu (default), smoke (CI, seconds), smollm2 (SmolLM2-135M-Instruct with LoRA on
reasoning-gym's 1-digit products, as experiments/policy/grpo.py), pod (Qwen3-8B).
"""
import math
import time

from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import spo
from agentrl import distributed
from agentrl.envs import safe
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import continuations
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, kl_kind="k3", agg="token-mean")
  # max_cuts 0: no cap (the paper). mc_samples: 9 in the paper; fewer on a CPU for speed.
  c.spo = dict(prob_threshold=0.9, interval=5, max_cuts=0, mc_samples=2 if arg.smoke else 4,
               whiten=True)
  if arg.preset == "smollm2":
    # As experiments/policy/grpo.py:smollm2; 2 MC samples at <= 2 cuts keep a step within minutes.
    c.task.update(rg_dataset="products", rg_config='{"max_digits": 1}',
                  answer_mode="last_number", system_prompt="Answer with the final number.")
    c.lora.update(rank=16, alpha=32.0)
    c.optim.lr = 5e-4
    c.spo.update(mc_samples=2, max_cuts=2)
    if not arg.smoke:
      c.total_steps = 10
      c.rollout.update(prompts_per_step=8, group_size=4, max_new_tokens=24, max_len=64,
                       min_len=64, slots=64)
      c.updates.minibatches = 2
      c.eval.update(num_problems=128, every=5)
      c.log.save_every = 5
  elif arg.preset == "pod":
    c.spo.update(mc_samples=9, max_cuts=8)
    if not arg.smoke:
      c.rollout.update(prompts_per_step=32, group_size=8)
      c.updates.minibatches = 2
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=("k1", "k2", "k3", "abs", "k3+")),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "spo.prob_threshold": configs.Key(float, min=0.0, max=1.0),
    "spo.interval": configs.Key(int, min=1),
    "spo.max_cuts": configs.Key(int, min=0, why="0 means no cap"),
    "spo.mc_samples": configs.Key(int, min=1),
    "spo.whiten": configs.Key(bool),
}


def num_cuts(config) -> int:
  """K, the fixed width of the cut arrays: spo.max_cuts, or without a cap the most cuts a
  response of max_new_tokens tokens can have (one per `interval` low-probability tokens)."""
  rc, sc = config.rollout, config.spo
  return sc.max_cuts or math.ceil(min(rc.max_new_tokens, rc.max_len - 1) / sc.interval)


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train().

  batch.loss_mask_BT is already the probability mask (the advantage step sets it).
  """
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    if lc.kl_coef > 0:
      kl_BT = kl.kl_penalty(logp_BT, batch.ref_logp_BT, lc.kl_kind)
      pg_BT = pg_BT + lc.kl_coef * kl_BT
      metrics["kl_loss"] = aggregation.aggregate(kl_BT, mask_BT, "token-mean")
    loss = aggregation.aggregate(pg_BT, mask_BT, lc.agg)
    metrics["loss"] = loss
    return loss, metrics

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras with value_BK, cut_BK, cut_valid_BK) -> (batch with adv_BT and the
  probability mask as its loss mask, metrics)."""
  sc = config.spo

  def advantage_fn(batch: types.Batch, extras):
    adv_BT = spo.chain_advantages(extras["value_BK"], extras["cut_BK"], extras["cut_valid_BK"],
                                  batch.reward_B, batch.old_logp_BT, batch.loss_mask_BT,
                                  prob_threshold=sc.prob_threshold, whiten=sc.whiten)
    keep_BT = spo.probability_mask(batch.old_logp_BT, batch.loss_mask_BT,
                                   prob_threshold=sc.prob_threshold).astype(jnp.float32)
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, keep_BT),
               "spo/lowprob_frac": aggregation.masked_mean(keep_BT, batch.loss_mask_BT)}
    return batch.replace(adv_BT=adv_BT, loss_mask_BT=keep_BT), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# The rollout: responses, the score pass, the cuts and their Monte-Carlo values.
# ---------------------------------------------------------------------------------------------
def mc_scores(conts, requests: spo.MCRequests, trajs, seeds_B, make_env, tok) -> np.ndarray:
  """float32 [N]: the task's reward of each MC response, response prefix + continuation cut to
  its budget, decoded as the engine decodes an action (a final stop id dropped)."""
  stops = {int(t) for t in tok.end_of_turn_ids} | {int(tok.eos_id)}
  memo, out = {}, np.zeros(len(conts), np.float32)  # MC responses repeat: score each once
  for n, (cont, b, budget) in enumerate(zip(conts, requests.row_N, requests.budget_N)):
    sampled = [int(t) for t in cont.tokens[cont.prompt_len:][:budget]]
    ids = [int(t) for t in trajs[b].tokens[trajs[b].prompt_len:cont.prompt_len]] + (
        sampled[:-1] if sampled and sampled[-1] in stops else sampled)
    key = (seeds_B[b], tuple(ids))
    if key not in memo:
      env = safe.SafeEnv(make_env())
      env.reset(seeds_B[b])
      memo[key] = float(env.step(tok.decode(ids))[1])
    out[n] = memo[key]
  return out


def make_rollout_fn(config, engine, tok, make_env, data, mesh, score_fn):
  """rollout_fn(params, rng, step): the scored batch, with the cuts and V(s_k) as extras."""
  rc, sc, G, K = config.rollout, config.spo, config.rollout.group_size, num_cuts(config)
  rows = sharding.batch_sharding(mesh)

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    sample_rng, mc_rng = jax.random.split(rng)
    groups = agent_loop.rollout_groups(
        engine, params, tok, make_env, seeds, group_size=G, rng=sample_rng, max_turns=1,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
        chat_template=config.task.chat_template)
    trajs = groups.trajectories
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id,
                      min_len=min(rc.min_len, rc.max_len), per_octave=rc.buckets_per_octave,
                      sharding=rows)
    batch, score_metrics = score_fn(params, batch)
    logp_BT, mask_BT = jax.device_get((batch.old_logp_BT, batch.loss_mask_BT))
    cut_BK, valid_BK = spo.cutpoints(logp_BT, mask_BT, prob_threshold=sc.prob_threshold,
                                     interval=sc.interval, max_cuts=K)
    start = time.perf_counter()
    requests = spo.mc_requests(
        [t.tokens for t in trajs], cut_BK, valid_BK, num_samples=sc.mc_samples,
        end_B=[min(t.prompt_len + rc.max_new_tokens, rc.max_len) for t in trajs])
    conts, mc_metrics = continuations.sample_continuations(
        engine, params, tok, requests.contexts, rng=mc_rng,
        max_new_tokens=int(requests.budget_N.max(initial=1)), temperature=rc.temperature)
    row_seeds = [s for s in seeds for _ in range(G)]
    scores_N = mc_scores(conts, requests, trajs, row_seeds, make_env, tok)
    value_BK = spo.mc_values(scores_N, requests, cut_BK.shape)
    host = {**groups.metrics, **collect.rollout_metrics(trajs),
            **collect.batch_metrics(trajs, batch),
            **{k: float(v) for k, v in jax.device_get(score_metrics).items()},
            "spo/mc_rollouts": float(len(conts)),
            "spo/cuts_per_response": float(valid_BK.sum() / len(trajs)),
            "spo/mc_seconds": time.perf_counter() - start}
    for key in ("rollout/sampled_tokens", "rollout/prefill_tokens"):  # the MC rollouts' too
      host[key] += mc_metrics.get(key, 0.0)
    extras = jax.device_put(
        {"value_BK": value_BK, "cut_BK": cut_BK, "cut_valid_BK": valid_BK}, rows)
    return loop.Rollout(batch=batch, metrics=host, extras=extras,
                        lengths_B=collect.row_lengths(trajs, batch), trajectories=trajs,
                        tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """SPO-chain end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.task.max_turns == 1,
                  f"config.task.max_turns ({config.task.max_turns}) must be 1: SPO-chain's "
                  "MC rollouts finish single-turn responses")
  start = rundir.write_config(config, workdir, experiment="spo_chain")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  with_ref = config.loss.kl_coef > 0
  ref_params = recipe.reference_params(params) if with_ref else None
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=with_ref))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout (with the score pass and the MC values), data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)
  rollout_fn = make_rollout_fn(config, engine, tok, make_env, data, mesh,
                               lambda params, batch: score_step(params, ref_params, batch))

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=rollout_fn, score_fn=lambda params, batch: (batch, {}),  # scored already
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="SPO-chain", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
