# pylint: disable=invalid-name
r"""ICPO (Huang et al., arXiv 2510.26519): GRPO whose groups mix rows sampled with solved
demonstrations in the prompt and rows sampled without, every row trained without them.

  python -m experiments.policy.icpo                                   # default CPU run
  python -m experiments.policy.icpo --config=experiments/policy/icpo.py:smoke --workdir=/tmp/icpo
  python -m experiments.policy.icpo --config=experiments/policy/icpo.py:smollm2 \
      --workdir=runs/icpo_smollm2
  python -m experiments.policy.icpo --config=experiments/policy/icpo.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/icpo     # accelerators

Default (`cpu`): the main job's task and warm start (reversed 3-digit addition, the SFT'd tiny
transformer). Of each group's G = 8 samples, `guide.num_guided` are drawn under x̃ = [D; q]:
`guide.shots` solved training problems (the gold answers of seeds the run never trains on)
before the task q (implicit expert forcing); with `guide.gold` the task itself solved comes
last (the gold answer as privileged context). Every row is stored under the original prompt q
(agentrl/rollout/guided.py), so the score step's π_old and the update's π_θ are the
original-context policy; a guided row keeps the sampler's log-probs under x̃ as its behaviour
policy μ.

Objective (docs/algorithms.md §17): GRPO's advantage over the whole mixed group; plain rows
PPO's clipped surrogate on π_θ / π_old; guided rows −A·f(w), w = π_θ(y_t|q, y_<t) /
μ(y_t|x̃, y_<t), f(w) = w / (w + γ) (`loss.weight=shaped`, LUFFY's γ = 0.1) or PPO's clip on
w (`loss.weight=clip`). Expert-region reject sampling keeps only guided rows whose reward reaches
`loss.reject_tau` [INF]; the annealed expert bonus adds `loss.bonus`·(1 − step/bonus_steps)⁺ to
the reward of correct guided rows [INF; 0 by default]. The tiny model never saw a
demonstration during SFT, so on the cpu preset the guided rows mostly show the machinery; the
pod preset (Qwen3-8B, chat template, demonstrations separated by blank lines) is ICPO's setting.

Presets: smoke (CI, seconds), cpu (default), smollm2 (grpo.py's smollm2 run, SmolLM2-135M-
Instruct with LoRA on 1-digit products, plus 1 of G = 4 rows sampled after 3 solved products in
the user message, "question\nAnswer: product" each, blank-line separated; max_len 160 holds
the 127-token guided prompt; scripts/guided_study.py compares it with GRPO), pod (Qwen3-8B on
reasoning-gym's gsm_symbolic).
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.envs import few_shot
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import guided as guided_loss
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl.rollout import guided
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # [INF] γ is LUFFY's (the mixed-policy GRPO ICPO builds on); the gate and the bonus are the
  # abstract's mechanisms with values of ours.
  c.loss = dict(eps_low=0.2, eps_high=0.2, weight="shaped", gamma=0.1, agg="token-mean",
                norm_by_std=True, reject=True, reject_tau=1.0, bonus=0.0, bonus_steps=100)
  # num_guided of the G rows per prompt are sampled under the demonstrations (LUFFY mixes 1
  # off-policy row into 8 [INF]); answer_prefix precedes each demonstration's answer, sep
  # follows it.
  c.guide = dict(num_guided=1, shots=2, gold=False, sep="", answer_prefix="")
  # The guided prompt is longer: room for two 12-token demonstrations before the task.
  c.rollout.update(max_len=64)
  if arg.preset == "smollm2":
    # grpo.py's smollm2 run (LoRA on 1-digit products, the same budget and held-out
    # evaluation) with demonstrations a chat model reads: 3 solved products in the user
    # message, each "question\nAnswer: product" and a blank line, then the task, so the guided
    # prompt is an ordinary few-shot prompt inside the chat template.
    c.task.update(rg_dataset="products", rg_config='{"max_digits": 1}',
                  answer_mode="last_number", system_prompt="Answer with the final number.")
    c.lora.update(rank=16, alpha=32.0)
    c.optim.lr = 5e-4
    c.loss.update(agg="token-mean")
    c.guide.update(num_guided=1, shots=3, sep="\n\n", answer_prefix="\nAnswer: ")
    if not arg.smoke:
      c.total_steps = 10
      # max_len 160: the guided prompt (127 tokens) + 24 new ones. grpo.py's 64 would cut
      # the guided rows' answers at 1 token (and its plain ones at 23: a 41-token prompt).
      c.rollout.update(prompts_per_step=8, group_size=4, max_new_tokens=24, max_len=160,
                       min_len=64, slots=64)
      c.updates.minibatches = 2
      c.eval.update(num_problems=128, every=5)
      c.log.save_every = 5
  elif arg.preset == "pod":
    c.loss.update(eps_high=0.28)
    c.guide.update(num_guided=2, sep="\n\n", answer_prefix="\nAnswer: ")
    c.rollout.update(max_len=4096)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.weight": configs.Key(str, choices=guided_loss.WEIGHTS),
    "loss.gamma": configs.Key(float, min=1e-6),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.norm_by_std": configs.Key(bool),
    "loss.reject": configs.Key(bool),
    "loss.reject_tau": configs.Key(float),
    "loss.bonus": configs.Key(float, min=0.0),
    "loss.bonus_steps": configs.Key(int, min=1),
    "guide.num_guided": configs.Key(int, min=0),
    "guide.shots": configs.Key(int, min=0),
    "guide.gold": configs.Key(bool),
    "guide.sep": configs.Key(str),
    "guide.answer_prefix": configs.Key(str),
}


def check(config: mlc.ConfigDict) -> None:
  """The cross-key rules SCHEMA cannot state, each a one-line ConfigError."""
  g, G = config.guide, config.rollout.group_size
  if g.num_guided > G:
    raise configs.ConfigError(f"guide.num_guided={g.num_guided} exceeds rollout.group_size={G}; "
                              "use at most G guided rows per group.")
  if config.updates.max_staleness:
    # The stale-row correction reads sampler_logp_BT as the behaviour policy, which on a
    # guided row is the guided context's, not a stale original-context one.
    raise configs.ConfigError("updates.max_staleness must be 0 for ICPO: guided rows' sampler "
                              "log-probs are under another context; set it to 0.")
  if g.shots == 0 and not g.gold:
    raise configs.ConfigError("guide.shots=0 with guide.gold=False leaves no guidance; set "
                              "guide.shots >= 1 or guide.gold=True.")


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
    pg_BT, metrics = guided_loss.guided_pg_loss(
        logp_BT, batch.old_logp_BT, batch.sampler_logp_BT, batch.adv_BT, mask_BT,
        batch.aux["guided_B"], weight=lc.weight, eps_low=lc.eps_low, eps_high=lc.eps_high,
        gamma=lc.gamma)
    loss = aggregation.aggregate(pg_BT, mask_BT, lc.agg)
    metrics["loss"] = loss
    return loss, metrics

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, the gated loss mask and aux guided_B, metrics)."""
  lc, G = config.loss, config.rollout.group_size

  def advantage_fn(batch: types.Batch, extras):
    guided_B = extras["guided_B"]
    reward_B = batch.reward_B
    if lc.bonus > 0:
      reward_B = guided_loss.expert_bonus(reward_B, guided_B, extras["step"], bonus=lc.bonus,
                                          anneal_steps=lc.bonus_steps)
    adv_B = estimators.grpo(reward_B, group_size=G, norm_by_std=lc.norm_by_std)
    mask_BT = batch.loss_mask_BT
    metrics = {"groups_with_signal": estimators.group_has_variance(
        reward_B, group_size=G).astype(jnp.float32).mean()}
    if lc.reject:  # expert-region reject sampling: guided rows below tau train nothing
      keep_B = guided_loss.region_gate(batch.reward_B, guided_B, tau=lc.reject_tau)
      mask_BT = mask_BT * keep_B[:, None]
      metrics["guided_kept"] = (keep_B * guided_B).sum() / jnp.maximum(guided_B.sum(), 1.0)
    adv_BT = estimators.broadcast_to_tokens(adv_B, mask_BT)
    metrics["adv_abs_mean"] = estimators.adv_abs_mean(adv_BT, mask_BT)
    return batch.replace(adv_BT=adv_BT, loss_mask_BT=mask_BT, aux={"guided_B": guided_B}), metrics

  return advantage_fn


def guided_rollout_fn(config: mlc.ConfigDict, engine, tok, make_env, data, mesh):
  """rollout_fn(params, rng, step): `guided.guided_rollout` over the next P prompts; extras
  hold guided_B and the step (the bonus schedule's clock)."""
  rc, tc, g = config.rollout, config.task, config.guide
  rewrite = guided.demonstration_rewrite(make_env, shots=g.shots, seed_base=few_shot.SEED_BASE,
                                         sep=g.sep, answer_prefix=g.answer_prefix, gold=g.gold)

  def rollout_fn(params, rng, step):
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    out = guided.guided_rollout(
        engine, params, tok, make_env, seeds, rewrite=rewrite, num_guided=g.num_guided, rng=rng,
        group_size=rc.group_size, max_turns=tc.max_turns, max_new_tokens=rc.max_new_tokens,
        max_len=rc.max_len, temperature=rc.temperature, chat_template=tc.chat_template,
        min_len=min(rc.min_len, rc.max_len), per_octave=rc.buckets_per_octave,
        sharding=sharding.batch_sharding(mesh))
    out.extras["step"] = jnp.asarray(step, jnp.int32)
    return out

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """ICPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  check(config)
  start = rundir.write_config(config, workdir, experiment="icpo")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), optimizer; no reference (no KL term).
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=False))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=guided_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, None, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="ICPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
