# pylint: disable=invalid-name
r"""Delethink: GRPO over Markovian chunked reasoning (Aghajohari et al. 2025, arXiv 2510.06557).

  python -m experiments.efficiency.delethink                              # verbose arithmetic, CPU
  python -m experiments.efficiency.delethink --config=experiments/efficiency/delethink.py:smoke \
      --workdir=/tmp/dt
  python -m experiments.efficiency.delethink --config=experiments/efficiency/delethink.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/delethink

docs/algorithms.md §12.7; code McGill-NLP/the-markovian-thinker. Each rollout is a Delethink
trace (`agentrl.rollout.delethink.run`): chunk 0 samples up to C tokens; a chunk that does not
stop is followed by one whose context is the prompt plus a carry-over (the first keep_head
tokens of chunk 0 and the last keep_tail tokens so far) and which samples up to C/2 tokens, at
most `max_chunks` chunks, so no context exceeds prompt + C. The task env scores the last chunk
with its carry-over. GRPO's advantage is computed per trace (groups of G traces) and every
chunk of a trace is a training row with the trace's advantage (`delethink.chunk_rows`). The
loss is the clipped surrogate (eps_high = 0.26, the official config) aggregated as the
official `seq-mean-token-norm-trace-length` with its flat-batch correction: each chunk row's
token sum is divided by its trace's length, and the rows' sum by the number of traces, so
the loss is the mean over traces of a token mean over the whole trace however it was
chunked. The official truncated importance weight (cap 2) corrects a vLLM/learner mismatch
that this float32 engine does not have (`logp_mismatch` ~ 0), so it is left out.

The number of chunk rows varies from step to step; the batch is padded to the fixed
P x G x max_chunks rows (padding rows are fully masked) so every step has one compiled shape.
Held-out evaluation runs greedy Delethink traces (`eval/response_tokens`: the traces' sampled
tokens).

Presets: cpu (default: the verbose-answer arithmetic task, envs/verbose_arithmetic.py, with
C = 12 and 2 chunks, so responses longer than 12 tokens cross a context reset [INF: the 8192
of the paper scaled to this task]), smoke, smollm2 (C = 24, 3 chunks), pod (C = 2048,
keep_head 100, 5 chunks: the official shape at a quarter of its chunk size).

This file is the fork unit: the config, the loss composition, the advantage step and the
loop are all here; the building blocks come from agentrl.harness.recipe and agentrl.train.loop.
"""
import dataclasses

from absl import app
import flax
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import delethink
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

# chunk_size C, keep_head, keep_tail (C/2 - keep_head), later chunks' budget (C/2), max_chunks.
CHUNKS = {"cpu": (12, 2, 4, 6, 2), "smoke": (8, 1, 3, 4, 2), "smollm2": (24, 4, 8, 12, 3),
          "pod": (2048, 100, 924, 1024, 5)}


@flax.struct.dataclass
class Batch(types.Batch):
  trace_len_B: jax.Array | None = None   # float32: sampled tokens of the row's whole trace


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  if arg.preset == "cpu":
    recipe.use_verbose_task(c)
  c.loss = dict(eps_low=0.2, eps_high=0.26)
  chunk, head, tail, later, most = CHUNKS["smoke" if arg.smoke else arg.preset]
  c.delethink = dict(chunk_size=chunk, keep_head=head, keep_tail=tail,
                     intermediate_max_new_tokens=later, max_chunks=most)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "delethink.chunk_size": configs.Key(int, min=2),
    "delethink.keep_head": configs.Key(int, min=0),
    "delethink.keep_tail": configs.Key(int, min=1),
    "delethink.intermediate_max_new_tokens": configs.Key(int, min=1),
    "delethink.max_chunks": configs.Key(int, min=1),
}


def validate(config: mlc.ConfigDict) -> None:
  """rl_config.validate plus Delethink's: a chunk fits the packed length, the carry-over fits."""
  rl_config.validate(config, SCHEMA)
  dc = config.delethink
  configs.require(dc.chunk_size < config.rollout.max_len,
                  f"config.delethink.chunk_size ({dc.chunk_size}) must be < "
                  f"config.rollout.max_len ({config.rollout.max_len}), which also holds the "
                  "prompt")
  configs.require(dc.keep_head + dc.keep_tail < dc.chunk_size
                  and dc.intermediate_max_new_tokens <= dc.chunk_size,
                  f"config.delethink needs keep_head + keep_tail < chunk_size and "
                  f"intermediate_max_new_tokens <= chunk_size; got {dc.to_dict()}")


def _chunk_kwargs(config) -> dict:
  return config.delethink.to_dict() | {"chat_template": config.task.chat_template}


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def trace_mean(loss_BT: jax.Array, mask_BT: jax.Array, trace_len_B: jax.Array,
               num_traces: float) -> jax.Array:
  """`seq-mean-token-norm-trace-length` with the flat-batch correction: sum over chunk rows of
  (the row's masked loss sum / its trace's length), divided by the number of traces.

  A trace's chunks together contribute the token mean of the loss over the whole trace; with
  minibatches, `num_traces` is the batch's traces over the number of minibatches (a shuffled
  minibatch holds that share of the rows in expectation).
  """
  row_sum_B = jnp.sum(jnp.where(mask_BT > 0, loss_BT, 0.0), axis=1)
  return jnp.sum(row_sum_B / trace_len_B) / num_traces


def make_update_step(config, graphdef, tx):
  """update_step(state, batch): the clipped surrogate, normalised by trace lengths."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature
  rc = config.rollout
  traces_per_minibatch = rc.prompts_per_step * rc.group_size / config.updates.minibatches

  def loss_fn(params, batch: Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = trace_mean(pg_BT, mask_BT, batch.trace_len_B, traces_per_minibatch)
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch of chunk rows, extras) -> batch with adv_BT: GRPO over traces, then per chunk."""
  G = config.rollout.group_size

  def advantage_fn(batch: Batch, extras):
    trace_reward_B = extras["trace_reward_B"]
    adv_B = estimators.grpo(trace_reward_B, group_size=G)
    adv_BT = estimators.broadcast_to_tokens(adv_B[extras["owner_C"]], batch.loss_mask_BT)
    live_B = estimators.group_has_variance(trace_reward_B, group_size=G)
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
               "groups_with_signal": live_B.astype(jnp.float32).mean()}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


def _empty_row(pad_id: int) -> agent_loop.Trajectory:
  """A fully masked padding row."""
  return agent_loop.Trajectory(
      tokens=np.asarray([pad_id], np.int32), loss_mask=np.zeros(1, np.float32),
      turn=np.full(1, -1, np.int32), sampler_logp=np.zeros(1, np.float32), turn_rewards=[],
      reward=0.0, done=False, truncated=False, prompt_len=1)


def trace_metrics(traces) -> dict[str, float]:
  """Success over traces, and the chunks as model turns: each chunk that did not end its
  trace, and a truncated trace's last one, hit its token budget."""
  chunks = sum(len(t.chunks) for t in traces)
  cut = sum(len(t.chunks) - 1 + t.truncated for t in traces if t.chunks)
  return {"success": float(np.mean([any(i.get("success") for i in t.infos) for t in traces])),
          "reward": float(np.mean([t.reward for t in traces])),
          "rollout/turns_mean": chunks / max(len(traces), 1),
          "rollout/turn_cut_frac": cut / max(chunks, 1)}


def delethink_rollout_fn(config, engine, tok, make_env, data, mesh):
  """rollout_fn(params, rng, step): G Delethink traces per prompt as padded chunk rows.

  Extras: trace_reward_B (one per trace, [P G]) and owner_C (each row's trace index).
  """
  rc = config.rollout
  P, G, rows = rc.prompts_per_step, rc.group_size, sharding.batch_sharding(mesh)
  num_rows = P * G * config.delethink.max_chunks

  def rollout_fn(params, rng, step):
    del step
    row_seeds = [entry["seed"] for entry in data.take(P) for _ in range(G)]
    traces, metrics = delethink.run(engine, params, tok, [make_env() for _ in row_seeds],
                                    row_seeds, rng=rng, temperature=rc.temperature,
                                    **_chunk_kwargs(config))
    chunk_rows, owner_C = delethink.chunk_rows(traces)
    padding = num_rows - len(chunk_rows)
    all_rows = chunk_rows + [_empty_row(tok.pad_id)] * padding
    owner_C = np.concatenate([owner_C, np.zeros(padding, np.int32)])
    trace_len_C = np.asarray([traces[i].trace_len for i in owner_C], np.float32)
    trace_len_C[len(chunk_rows):] = 1.0                    # padding rows sum to 0 anyway
    batch = pack.pack(all_rows, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(types.Batch)}
    batch = Batch(**fields, trace_len_B=jax.device_put(trace_len_C, rows))
    host = {**metrics, **trace_metrics(traces), **collect.batch_metrics(chunk_rows, batch)}
    extras = {"trace_reward_B": jax.device_put(np.asarray([t.reward for t in traces],
                                                          np.float32), rows),
              "owner_C": jax.device_put(owner_C, rows)}
    return loop.Rollout(batch=batch, metrics=host, extras=extras, trajectories=chunk_rows,
                        tokenizer=tok)

  return rollout_fn


def delethink_evaluator(config, engine, tok, make_env):
  """evaluate(params) -> {"success", "response_tokens"} of greedy held-out traces."""

  def evaluate(params):
    seeds = [recipe.EVAL_SEED_BASE + i for i in range(config.eval.num_problems)]
    traces, _ = delethink.run(engine, params, tok, [make_env() for _ in seeds], seeds,
                              rng=jax.random.key(0), greedy=True, **_chunk_kwargs(config))
    return {"success": trace_metrics(traces)["success"],
            "response_tokens": float(np.mean([t.trace_len for t in traces]))}

  return evaluate


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Delethink GRPO end to end; returns the summary written to <workdir>/summary.json."""
  validate(config)
  start = rundir.write_config(config, workdir, experiment="delethink")
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

  # ---- Chunked rollout, data and held-out evaluation (greedy traces).
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=delethink_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=delethink_evaluator(config, engine, tok, make_env),
        **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="Delethink (GRPO, chunked thinking)",
                              start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
