# pylint: disable=invalid-name
r"""RL from a learned reward: Bradley-Terry reward model, then GRPO scored by it.

  python -m experiments.reward_model
  python -m experiments.reward_model --config=experiments/reward_model.py:smoke --workdir=/tmp/rm

Phase 1 (Ouyang et al. 2022, sec. 3.5; `losses.preference.bradley_terry`): a reward model (a
tiny transformer with a scalar head read at the last real token, `models.heads.RewardModel`)
is trained on preference pairs for reversed-digit addition: for each prompt the chosen
completion is the correct answer and the rejected one the same answer with one digit changed
(the labeler is the exact-match verifier). Loss: -log sigmoid(r_chosen - r_rejected).

Phase 2: experiments/grpo.py, except that the reward of every rollout is the reward model's
score of (prompt, completion), not the verifier's. `success` (the env's exact match) is still
logged, so the table shows whether optimizing the learned reward improves the real task or
exploits the reward model.
"""
import functools
import os
import random

from absl import app
from absl import flags
from flax import nnx
import jax
import ml_collections as mlc
from ml_collections import config_flags
import numpy as np
import optax

from agentrl import checkpoint
from agentrl import configs
from agentrl import sharding
from agentrl import types
from agentrl.losses import preference
from agentrl.models import heads
from experiments import grpo
from experiments import sft

RM_SEED_BASE = 3 * 2**30  # preference-pair prompts: disjoint from RL, SFT and held-out seeds


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  c = grpo.get_config(arg)
  c.rm = dict(steps=300, batch_size=64, lr=1e-3, eval_pairs=256)
  if configs.parse_arg(arg, preset="cpu", smoke=False).smoke:
    c.rm.update(steps=2, batch_size=4, eval_pairs=4)
  return c


RM_SCHEMA = {
    **grpo.LOSS_SCHEMA,
    "rm.steps": configs.Key(int, min=1),
    "rm.batch_size": configs.Key(int, min=1),
    "rm.lr": configs.Key(float, min=0.0),
    "rm.eval_pairs": configs.Key(int, min=1),
}


def corrupt(answer: str, rng: random.Random) -> str:
  """The answer with one digit replaced by a different digit (a near miss)."""
  i = rng.randrange(len(answer))
  digit = rng.choice([d for d in "0123456789" if d != answer[i]])
  return answer[:i] + digit + answer[i + 1:]


def preference_pairs(tok, seed_base: int, n: int, digits: int, length: int):
  """(chosen, rejected) encoded batches for n prompts: correct vs one-digit-off answers."""
  problems = sft.problems(seed_base, n, digits)
  rng = random.Random(seed_base)
  rejected = [dict(p, answer=corrupt(p["answer"], rng)) for p in problems]
  return sft.encode_gold(tok, problems, length), sft.encode_gold(tok, rejected, length)


def rm_scorer(graphdef):
  """score(params, batch) -> reward_B of the reward model, at each row's last real token."""

  def score(params, batch):
    return nnx.merge(graphdef, params)(batch["tokens_BT"], batch["positions_BT"],
                                       batch["input_mask_BT"])

  return score


def make_update_step(config, graphdef, tx):
  """The reward model's Bradley-Terry update: update_step(state, (chosen, rejected))."""
  del config
  score = rm_scorer(graphdef)

  def loss_fn(params, pair):
    loss_B, metrics = preference.bradley_terry(score(params, pair[0]), score(params, pair[1]))
    loss = loss_B.mean()
    return loss, metrics | {"loss": loss}

  def update_step(state: types.TrainState, pair):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, pair)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return update_step


def train_reward_model(config, workdir, mesh, tok):
  """Phase 1, cached in <workdir>/reward_model: returns (graphdef, params, info)."""
  rc, digits = config.rm, config.task.digits
  length = sft.sequence_length(tok, digits)
  cfg = sft.model_config(config.model, tok.vocab_size)
  graphdef, params = sharding.create_sharded(
      lambda: heads.RewardModel(cfg, rngs=nnx.Rngs(config.seed + 1)), mesh,
      config.sharding_rules)
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "reward_model"), save_every=1, keep=1,
                                 async_save=False)
  if ckpt.latest_step() is not None:
    tree, info = ckpt.restore({"params": params})
    ckpt.close()
    return graphdef, tree["params"], info
  tx = optax.adam(rc.lr)
  state, shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)
  update_step = jax.jit(make_update_step(config, graphdef, tx), donate_argnames="state",
                        out_shardings=(shardings, None))
  rows = sharding.batch_sharding(mesh)
  for step in range(rc.steps):
    pair = preference_pairs(tok, RM_SEED_BASE + step * rc.batch_size, rc.batch_size, digits,
                            length)
    state, metrics = update_step(state, jax.device_put(pair, rows))
  chosen, rejected = jax.device_put(
      preference_pairs(tok, sft.EVAL_SEED_BASE, rc.eval_pairs, digits, length), rows)
  score = jax.jit(rm_scorer(graphdef))
  accuracy = jax.device_get((score(state.params, chosen) > score(state.params, rejected)).mean())
  info = {"steps": rc.steps, "train_loss": float(jax.device_get(metrics["loss"])),
          "held_out_pair_accuracy": float(accuracy)}
  print(f"reward model: {info}")
  ckpt.save(rc.steps, {"params": state.params}, info, force=True)
  ckpt.close()
  return graphdef, state.params, info


def make_rollout_fn(config, sampler, tok, make_env, data, mesh, *, rm_graphdef, rm_params):
  """grpo's rollout, with reward_B replaced by the reward model's score."""
  rollout = grpo.default_rollout_fn(config, sampler, tok, make_env, data, mesh)

  score = jax.jit(rm_scorer(rm_graphdef))

  def rollout_fn(params, rng, step):
    out = rollout(params, rng, step)
    reward_B = score(rm_params, {"tokens_BT": out.batch.tokens_BT,
                                 "positions_BT": out.batch.positions_BT,
                                 "input_mask_BT": out.batch.input_mask_BT})
    out.metrics["verifier_reward"] = out.metrics["reward"]
    out.metrics["reward"] = float(np.asarray(jax.device_get(reward_B)).mean())
    out.batch = out.batch.replace(reward_B=reward_B)
    return out

  return rollout_fn


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Phase 1 (reward model), then GRPO on its scores; returns the GRPO summary."""
  grpo.validate(config, RM_SCHEMA)
  configs.require(config.task.name == "reversed_addition",
                  "config.task.name must be 'reversed_addition': the preference pairs are "
                  "built from its problems")
  mesh = sharding.make_mesh(config.mesh)
  tok = sft.build_tokenizer(config.task.digits)
  rm_graphdef, rm_params, _ = train_reward_model(config, workdir, mesh, tok)
  method = grpo.Method("GRPO on a learned reward", RM_SCHEMA, grpo.make_update_step,
                       grpo.make_advantage_fn,
                       make_rollout_fn=functools.partial(make_rollout_fn, rm_graphdef=rm_graphdef,
                                                         rm_params=rm_params))
  return grpo.run(config, workdir, method)


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/reward_model", "Output directory.")
  app.run(main)
