# pylint: disable=invalid-name
"""Schedules for loss hyperparameters that change during training.

`holder_p` is HölderPO's exponent schedule (arXiv 2605.12058, §3 "dynamic p-scheduling";
official code `resolve_holder_p` / `_get_current_holder_p`, docs/algorithms.md §2.4). With
prog = min(1, step / schedule_steps), mid = (p_min + p_max)/2, amp = (p_max − p_min)/2:

  constant    p_const
  linear      p_min + (p_max − p_min)·prog            linear_dec  p_max − (p_max − p_min)·prog
  sin         mid − amp·cos(π·prog)   (S-curve up)    cos         mid + amp·cos(π·prog)
  quad        p_min + (p_max − p_min)·prog^power      quad_dec    p_max − (p_max − p_min)·prog^power
  cubic       mid + amp·(2·prog − 1)^3                cubic_dec   mid − amp·(2·prog − 1)^3

Defaults are the reference's (p_const 1.0, range [−2, 2], 1000 steps, power 2). The maths
run uses linear_dec from 2 to −2 over 500 steps. Step counting is the caller's choice: the
ALFWorld run ticks once per rollout batch, so p is constant within a batch.
"""
import jax
import jax.numpy as jnp

SCHEDULES = ("constant", "linear", "linear_dec", "sin", "cos", "quad", "quad_dec", "cubic",
             "cubic_dec")


def holder_p(step: int | jax.Array, *, schedule: str = "constant", p_const: float = 1.0,
             p_min: float = -2.0, p_max: float = 2.0, schedule_steps: int = 1000,
             power: float = 2.0) -> jax.Array:
  """HölderPO exponent p at `step` (f32 scalar). Pure jnp: `step` may be traced.

  Raises:
    ValueError: `schedule` is not one of `SCHEDULES`.
  """
  if schedule not in SCHEDULES:
    raise ValueError(f"Unknown HölderPO p schedule {schedule!r}; expected one of {SCHEDULES}.")
  if schedule == "constant":
    return jnp.asarray(p_const, jnp.float32)
  step = jnp.maximum(jnp.asarray(step, jnp.float32), 0.0)
  prog = jnp.minimum(1.0, step / jnp.maximum(jnp.asarray(schedule_steps, jnp.float32), 1.0))
  lo, hi = jnp.float32(p_min), jnp.float32(p_max)
  mid, amp = (lo + hi) / 2.0, (hi - lo) / 2.0
  value = {
      "linear": lambda: lo + (hi - lo) * prog,
      "linear_dec": lambda: hi - (hi - lo) * prog,
      "sin": lambda: mid - amp * jnp.cos(jnp.pi * prog),
      "cos": lambda: mid + amp * jnp.cos(jnp.pi * prog),
      "quad": lambda: lo + (hi - lo) * prog ** power,
      "quad_dec": lambda: hi - (hi - lo) * prog ** power,
      "cubic": lambda: mid + amp * (2.0 * prog - 1.0) ** 3,
      "cubic_dec": lambda: mid - amp * (2.0 * prog - 1.0) ** 3,
  }[schedule]()
  return value.astype(jnp.float32)
