# pylint: disable=invalid-name
"""Building blocks the efficiency and length experiments share (docs/algorithms.md §12).

experiments/hapo_length.py, brpo.py, hbpo.py, decs.py, eapo.py, tppo.py and delethink.py
train on the verbose-answer arithmetic task by default (`use_verbose_task`), log the held-out
greedy response length next to the success (`length_evaluator`), and read per-row rewards
through the helpers below.
"""
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl import configs
from agentrl import recipe
from agentrl.envs import verbose_arithmetic
from agentrl.rollout import collect

# Prompt (BOS + "123+456=") + a budget prompt "[12]" + the longest response, rounded up.
VERBOSE_MAX_LEN = 32


def use_verbose_task(c: mlc.ConfigDict) -> None:
  """Points an `recipe.rl_config` (cpu or smoke) at the verbose task, in place.

  The response budget is the longest demonstrated response plus one token, so the warm-started
  policy is never cut; max_len also holds a budget prompt (HBPO). Adam's lr is 3e-4: at the
  compact task's 1e-3, GRPO with one update per step lost held-out greedy success on this task
  (22.6% -> 7.2% in 40 steps of 32 prompts x 8), at 3e-4 it gained (22.6% -> 26.0% in 30).
  """
  c.task.name = "verbose_addition"
  longest = verbose_arithmetic.response_tokens(c.task.digits)
  c.rollout.update(max_new_tokens=longest + 1, max_len=VERBOSE_MAX_LEN)
  c.optim.lr = 3e-4


def reject_preset(name: str, preset: str, presets: Sequence[str], why: str) -> None:
  """ConfigError for a preset the experiment does not support (one line, names the reason)."""
  if preset not in presets:
    raise configs.ConfigError(f"unknown {name} preset {preset!r}; use one of {tuple(presets)} "
                              f"(and smoke): {why}")


def parse_ints(key: str, text: str) -> list[int]:
  """The comma-separated positive increasing ints of config key `key` ("6,8,10,12")."""
  try:
    values = [int(v) for v in text.split(",")]
  except ValueError:
    values = []
  if not values or min(values) < 1 or sorted(set(values)) != values:
    raise configs.ConfigError(f"config.{key}={text!r} must be comma-separated increasing "
                              "positive integers, e.g. '6,8,10,12'")
  return values


def is_correct(reward_B: jax.Array) -> jax.Array:
  """Bool [B]: the outcome reward is a full success (binary verifiers give 1.0)."""
  return reward_B >= 1.0


def response_length(loss_mask_BT: jax.Array) -> jax.Array:
  """Float [B]: sampled tokens of each row (the stop token included)."""
  return (loss_mask_BT > 0).sum(axis=1).astype(jnp.float32)


def length_evaluator(config: mlc.ConfigDict, engine, tok, make_env) -> Callable:
  """evaluate(params) -> {"success", "response_tokens"} on the held-out seeds, greedy.

  `response_tokens` is the greedy responses' mean sampled tokens, what a length-aware method
  is meant to shorten without costing success.
  """
  rc, tc = config.rollout, config.task

  def evaluate(params):
    trajs = recipe.held_out_rollouts(
        engine, tok, make_env, params, num=config.eval.num_problems, max_turns=tc.max_turns,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, chat_template=tc.chat_template)
    return {"success": float(np.mean([collect.trajectory_success(t) for t in trajs])),
            "response_tokens": float(np.mean([t.loss_mask.sum() for t in trajs]))}

  return evaluate
