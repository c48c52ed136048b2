# pylint: disable=invalid-name
r"""G2RL, gradient-guided exploration (Liang et al. 2025, arXiv 2512.15687) on top of GRPO.

  python -m experiments.shaping.g2rl                                   # default CPU run
  python -m experiments.shaping.g2rl --config=experiments/shaping/g2rl.py:smoke --workdir=/tmp/g2rl
  python -m experiments.shaping.g2rl --config=experiments/shaping/g2rl.py:smollm2 \
      --workdir=runs/g2rl_smollm2
  python -m experiments.shaping.g2rl --config.loss.alpha=0.0           # alpha = 0: exactly GRPO

docs/algorithms.md §13.9 (no official code; the abstract states the mechanism, the rest is
[INF] and a config key). Each response gets a sequence feature from the final layer's
sensitivity: the gradient of its summed log-likelihood with respect to the unembedding,
phi_i = sum_t h_t (e_{y_t} - p_t)^T, sketched by a fixed Gaussian R [V, k] to
sum_t h_t (x) R^T (e_{y_t} - p_t) [INF: k = loss.sketch_dim = 64, seed loss.sketch_seed = 0] and
divided by the response's token count [INF] (`exploration.g2rl_features`). Within each group,
n_i = 1 - mean_{j != i} cos(phi_i, phi_j) (loss.reduce = "mean" [INF]; "max": 1 - max_j cos);
s_i = clip(1 + alpha (n_i - mean_G n), 1 - bound, 1 + bound) [INF: alpha 1, bound 0.5]; the
shaped reward r_i s_i goes through GRPO's group advantage, then GRPO's PPO clip, optional KL and
aggregation as experiments/policy/grpo.py.

Step order: the features need the rollout policy's final hidden states, so this advantage step
takes the params and runs inside the score step, after the log-probs (experiments/shaping/delta.py's
pattern). It costs one more forward of the trunk and a chunked [tokens, V] softmax per step;
the features are [B, D * k] (Qwen3-8B: D = 4096, so 262144 floats per row).

Presets: smoke (CI, seconds), cpu (default), smollm2, pod, as experiments/policy/grpo.py.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc

from agentrl.advantages import estimators
from agentrl.advantages import exploration
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
                norm_by_std=True, alpha=1.0, bound=0.5, reduce="mean", sketch_dim=64,
                sketch_seed=0, per_token=True, chunk_size=1024)
  if arg.preset == "smollm2":
    c.loss.update(kl_coef=0.001, agg="token-mean")
  elif arg.preset == "pod":
    c.loss.update(eps_high=0.28, kl_coef=0.001, agg="token-mean")
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=("k1", "k2", "k3", "abs", "k3+")),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.norm_by_std": configs.Key(bool),
    "loss.alpha": configs.Key(float, min=0.0),
    "loss.bound": configs.Key(float, min=0.0, max=1.0, why="for a positive reward scaler"),
    "loss.reduce": configs.Key(str, choices=exploration.REDUCTIONS),
    "loss.sketch_dim": configs.Key(int, min=1),
    "loss.sketch_seed": configs.Key(int, min=0),
    "loss.per_token": configs.Key(bool),
    "loss.chunk_size": configs.Key(int, min=1),
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
    kl_BT = kl.kl_penalty(logp_BT, batch.ref_logp_BT, lc.kl_kind)
    loss = aggregation.aggregate(pg_BT + lc.kl_coef * kl_BT, mask_BT, lc.agg)
    metrics |= {"loss": loss, "kl_loss": aggregation.aggregate(kl_BT, mask_BT, "token-mean")}
    return loss, metrics

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config, graphdef):
  """(params, scored batch) -> (batch with adv_BT, metrics): GRPO of the novelty-scaled reward.
  Pure; run it in the score step, where the rollout policy's params are."""
  G, lc, temperature = config.rollout.group_size, config.loss, config.rollout.temperature

  def advantage_fn(params, batch: types.Batch):
    model = nnx.merge(graphdef, params)
    h_BTD = model.hidden(batch.tokens_BT, batch.positions_BT, batch.input_mask_BT)
    h_BTD = jnp.pad(h_BTD[:, :-1], ((0, 0), (1, 0), (0, 0)))  # h at t - 1 predicts token t
    softcap = model.cfg.final_logit_softcap
    phi_BF = exploration.g2rl_features(
        h_BTD, model.unembed_DV(), batch.tokens_BT, batch.loss_mask_BT,
        temperature=temperature, softcap=float(softcap) if softcap else None,
        sketch_dim=lc.sketch_dim, sketch_seed=lc.sketch_seed, per_token=lc.per_token,
        chunk_size=lc.chunk_size)
    adv_B, scale_B, novelty_B = exploration.g2rl_advantage(
        batch.reward_B, phi_BF, group_size=G, alpha=lc.alpha, bound=lc.bound,
        reduce=lc.reduce, norm_by_std=lc.norm_by_std)
    adv_BT = estimators.broadcast_to_tokens(adv_B, batch.loss_mask_BT)
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
               "groups_with_signal": estimators.group_has_variance(
                   batch.reward_B, group_size=G).astype(jnp.float32).mean(),
               "g2rl/novelty_mean": novelty_B.mean(),
               "g2rl/scale_min": scale_B.min(), "g2rl/scale_max": scale_B.max()}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """G2RL end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="g2rl")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps: scoring, then G2RL's advantage step with the same params.
  policy_score = loop.make_score_step(graphdef, temperature=rc.temperature,
                                      logprob_impl=config.model.logprob_impl, with_ref=True)
  advantage_step = make_advantage_fn(config, graphdef)

  def score_step(params, ref_params, batch):
    batch, metrics = policy_score(params, ref_params, batch)
    batch, adv_metrics = advantage_step(params, batch)
    return batch, metrics | adv_metrics

  score_step = jax.jit(score_step)
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop; the loop's advantage slot has nothing left to do.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=lambda batch, extras: (batch, {}), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="G2RL", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
