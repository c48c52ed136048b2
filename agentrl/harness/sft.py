# pylint: disable=invalid-name
"""Supervised warm start of a from-scratch policy: gold answers, or an env's demonstrations.

RL needs a policy that already solves a few percent of its task, otherwise every group has
reward 0 and a group-baseline method has nothing to learn from (at ~1% greedy accuracy GRPO
made no progress on reversed addition; at 13-50% it gained 30+ points). `warm_start` trains
until greedy success on a validation set reaches `target_success`, so the warm start lands in
that window whatever the machine's speed. What it trains on and how it measures success is a
`Data`:

  arithmetic_data     the compact arithmetic task: BOS + prompt + gold answer + EOS. Greedy
                      exact-match is measured by teacher forcing: the greedy decode of a prompt
                      equals the answer (+ EOS) iff the argmax at every answer position is the
                      answer token, so one forward pass over the gold sequence gives the same
                      number as decoding.
  demonstration_data  a multi-turn env's scripted expert (`env.demonstration(seed, rng,
                      noise=...)`), each episode rendered by `agent_loop.scripted` into the
                      token layout of a rollout that sampled those actions. A multi-turn
                      policy's greedy success depends on the env's replies to its own
                      actions, so the caller measures it with greedy rollouts.

Loss: mean negative log-likelihood of the policy's tokens (the answer and EOS; every action
and its stop id), with the prompt and observations as context.
"""
from collections.abc import Callable
import dataclasses
import random
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl.envs import arithmetic
from agentrl.models import policy as policy_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import pack
from agentrl import sharding
from agentrl.train import loop

# Seeds of the SFT data: disjoint from the RL, held-out and validation seeds.
SFT_SEED_BASE = arithmetic.SFT_SEED_BASE
VALID_SEED_BASE = arithmetic.VALID_SEED_BASE
_FIELDS = ("tokens_BT", "positions_BT", "input_mask_BT", "loss_mask_BT")


@dataclasses.dataclass(frozen=True)
class Data:
  """What `warm_start` trains on, and its stopping rule's measure."""
  batch: Callable[[int], dict[str, np.ndarray]]   # SFT step -> host arrays of _FIELDS
  success: Callable[[nnx.State], float]           # params -> validation greedy success


def answer_nll(graphdef, *, logprob_impl: str) -> Callable:
  """loss_fn(params, batch) -> (mean answer-token NLL, metrics), for `loop.gradient_step`."""

  def loss_fn(params, batch):
    model = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(model, batch["tokens_BT"], batch["positions_BT"],
                                        batch["input_mask_BT"], impl=logprob_impl)
    mask_BT = batch["loss_mask_BT"]
    loss = -(logp_BT * mask_BT).sum() / jnp.maximum(mask_BT.sum(), 1.0)
    return loss, {"loss": loss}

  return loss_fn


def greedy_match(graphdef) -> Callable:
  """eval_step(params, batch) -> success_B: greedy decoding would reproduce the gold answer."""

  def eval_step(params, batch):
    model = nnx.merge(graphdef, params)
    logits_BTV = model(batch["tokens_BT"], batch["positions_BT"], batch["input_mask_BT"])
    # Logits at t predict token t + 1.
    hit_BT = jnp.argmax(logits_BTV[:, :-1], axis=-1) == batch["tokens_BT"][:, 1:]
    need_BT = batch["loss_mask_BT"][:, 1:] > 0
    return jnp.all(hit_BT | ~need_BT, axis=-1)

  return eval_step


def arithmetic_data(graphdef, tok, *, digits: int, batch_size: int, eval_problems: int,
                    mesh) -> Data:
  """Gold reversed-addition sequences; success is teacher-forced greedy exact-match."""
  length = arithmetic.gold_length(tok, digits)
  eval_step = jax.jit(greedy_match(graphdef))
  valid = jax.device_put(arithmetic.encode_gold(
      tok, arithmetic.problems(VALID_SEED_BASE, eval_problems, digits), length),
                         sharding.batch_sharding(mesh))

  def batch(step):
    return arithmetic.encode_gold(
        tok, arithmetic.problems(SFT_SEED_BASE + step * batch_size, batch_size, digits), length)

  return Data(batch=batch,
              success=lambda params: float(jax.device_get(eval_step(params, valid)).mean()))


def demonstration_batch(tok, make_env, seeds, *, max_len: int, chat_template: bool,
                        noise: float) -> dict[str, np.ndarray]:
  """[len(seeds), max_len] arrays of the env's demonstrations (`random.Random(seed)` draws
  the noise, so a seed always gives the same episode); loss_mask 1 on the policy's tokens."""
  trajs = []
  for seed in seeds:
    env = make_env()
    actions = env.demonstration(seed, random.Random(seed), noise=noise)
    trajs.append(agent_loop.scripted(tok, env, seed, actions, chat_template=chat_template))
  batch = pack.pack_numpy(trajs, max_len=max_len, pad_id=tok.pad_id, min_len=max_len)
  return {name: getattr(batch, name) for name in _FIELDS}


def demonstration_data(tok, make_env, *, batch_size: int, max_len: int, chat_template: bool,
                       noise: float, success: Callable[[nnx.State], float]) -> Data:
  """Batches of `demonstration_batch` over the SFT seeds; `success` is the caller's
  (greedy rollouts on validation seeds, e.g. `recipe.held_out_success`)."""

  def batch(step):
    start = SFT_SEED_BASE + step * batch_size
    return demonstration_batch(tok, make_env, range(start, start + batch_size),
                               max_len=max_len, chat_template=chat_template, noise=noise)

  return Data(batch=batch, success=success)


def warm_start(graphdef, params, tok, *, mesh, rules, logprob_impl: str, steps_max: int,
               target_success: float, batch_size: int, lr: float, b2: float, clip_norm: float,
               eval_every: int, eval_problems: int, digits: int | None = None,
               data: Data | None = None, log=print) -> tuple[nnx.State, dict]:
  """Runs SFT from `params` until `target_success` or `steps_max`; returns (params, info).

  `data` (default: `arithmetic_data` for `digits`-digit operands, `batch_size` rows and
  `eval_problems` validation problems) gives the batches and the success measure.
  info: steps, success (validation greedy success), seconds, history (one record per
  validation), stopped ("target" or "steps_max": why SFT ended).
  """
  if data is None:
    if digits is None:
      raise ValueError("warm_start needs `digits` (the arithmetic task) or `data`.")
    data = arithmetic_data(graphdef, tok, digits=digits, batch_size=batch_size,
                           eval_problems=eval_problems, mesh=mesh)
  tx = optax.chain(optax.clip_by_global_norm(clip_norm), optax.adam(lr, b2=b2))
  state, state_shardings = sharding.create_train_state(params, tx, mesh, rules)
  # Pinned output shardings keep every call on the first call's compiled program.
  update_step = jax.jit(loop.gradient_step(answer_nll(graphdef, logprob_impl=logprob_impl), tx),
                        donate_argnames="state", out_shardings=(state_shardings, None))
  rows = sharding.batch_sharding(mesh)
  history, success, step, start = [], data.success(state.params), 0, time.perf_counter()
  while success < target_success and step < steps_max:
    state, m = update_step(state, jax.device_put(data.batch(step), rows))
    step += 1
    if step % eval_every == 0 or step == steps_max:
      success = data.success(state.params)
      loss = float(jax.device_get(m["loss"]))
      history.append({"step": step, "loss": loss, "success": success})
      log(f"sft step {step}/{steps_max} | loss {loss:.3f} | validation greedy success "
          f"{success:.1%}")
  stopped = "target" if success >= target_success else "steps_max"
  info = {"steps": step, "success": success, "seconds": time.perf_counter() - start,
          "history": history, "stopped": stopped}
  return state.params, info
