# pylint: disable=invalid-name
"""Supervised warm start of a from-scratch policy on the compact arithmetic task.

RL needs a policy that already solves a few percent of its task, otherwise every group has
reward 0 and a group-baseline method has nothing to learn from (at ~1% greedy accuracy GRPO
made no progress on reversed addition; at 13-50% it gained 30+ points). `warm_start` trains on
gold answers and stops as soon as greedy exact-match on a validation set reaches
`target_success`, so the warm start lands in that window whatever the machine's speed.

Greedy exact-match is measured by teacher forcing: the greedy decode of a prompt equals the
answer (+ EOS) iff the argmax at every answer position is the answer token, so one forward
pass over the gold sequence gives the same number as decoding.

Loss: mean negative log-likelihood of the answer tokens and EOS (the prompt is context).
"""
from collections.abc import Callable
import time

from flax import nnx
import jax
import jax.numpy as jnp
import optax

from agentrl import loop
from agentrl import sharding
from agentrl.envs import arithmetic
from agentrl.models import policy as policy_lib


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


def warm_start(graphdef, params, tok, *, mesh, rules, digits: int, logprob_impl: str,
               steps_max: int, target_success: float, batch_size: int, lr: float, b2: float,
               clip_norm: float, eval_every: int, eval_problems: int,
               log=print) -> tuple[nnx.State, dict]:
  """Runs SFT from `params` until `target_success` or `steps_max`; returns (params, info).

  info: steps, success (validation greedy exact-match), seconds, history (one record per
  validation), stopped ("target" or "steps_max": why SFT ended).
  """
  length = arithmetic.gold_length(tok, digits)
  tx = optax.chain(optax.clip_by_global_norm(clip_norm), optax.adam(lr, b2=b2))
  state, state_shardings = sharding.create_train_state(params, tx, mesh, rules)
  # Pinned output shardings keep every call on the first call's compiled program.
  update_step = jax.jit(loop.gradient_step(answer_nll(graphdef, logprob_impl=logprob_impl), tx),
                        donate_argnames="state", out_shardings=(state_shardings, None))
  eval_step = jax.jit(greedy_match(graphdef))
  rows = sharding.batch_sharding(mesh)
  valid = jax.device_put(arithmetic.encode_gold(
      tok, arithmetic.problems(arithmetic.VALID_SEED_BASE, eval_problems, digits), length), rows)
  evaluate = lambda p: float(jax.device_get(eval_step(p, valid)).mean())
  history, success, step, start = [], evaluate(state.params), 0, time.perf_counter()
  while success < target_success and step < steps_max:
    batch = jax.device_put(arithmetic.encode_gold(tok, arithmetic.problems(
        arithmetic.SFT_SEED_BASE + step * batch_size, batch_size, digits), length), rows)
    state, m = update_step(state, batch)
    step += 1
    if step % eval_every == 0 or step == steps_max:
      success = evaluate(state.params)
      loss = float(jax.device_get(m["loss"]))
      history.append({"step": step, "loss": loss, "success": success})
      log(f"sft step {step}/{steps_max} | loss {loss:.3f} | validation greedy success "
          f"{success:.1%}")
  stopped = "target" if success >= target_success else "steps_max"
  info = {"steps": step, "success": success, "seconds": time.perf_counter() - start,
          "history": history, "stopped": stopped}
  return state.params, info
