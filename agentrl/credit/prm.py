# pylint: disable=invalid-name
"""Process-reward-model credit: PRM-dense turn rewards and VPPO first-error localisation.

Docs: docs/algorithms.md §15.3-§15.4. Steps are turns (or segments, `rewards.process`); s_k is
the PRM's probability that step k is good (sigmoid of `heads.StepHead`'s logit), o the outcome
reward. Every function returns per-turn rewards r [B, U] (0 on invalid turns) whose returns
R_k = sum_{j >= k} r_j (`estimators.discounted_turn_returns`, gamma 1) are the method's step
values; they then go through a turn-level advantage (e.g. `mapo.turn_level` /
`mapo.batch_level`, `gigpo`) and `estimators.broadcast_turn_to_tokens`.

- `dense_turn_rewards`, form "sum": r_k = c_p s_k, plus c_o o on the last turn, so
  R_k = c_p sum_{j >= k} s_j + c_o o. Math-Shepherd's step-by-step PPO (Wang et al. 2024,
  arXiv 2312.08935) gives the PRM score as the reward at the end of each step (c_o = 0);
  PRIME (Cui et al. 2025, arXiv 2502.01456) adds the process and outcome returns
  (c_p = c_o = 1 [INF on the exact combination: PRIME baselines each with leave-one-out]).
- form "min" (PURE, Cheng et al. 2025, arXiv 2504.15275): the value is the minimum of future
  process rewards, R_k = c_p min_{j >= k} s_j + c_o o, so one overrated step cannot lift the
  return. PURE realises the min with a softmin-weighted transform at a temperature; this is
  its zero-temperature limit, written as telescoping rewards [INF]. PURE's "+VR" variant adds
  the verifiable outcome (c_o > 0).
- `vppo_turn_rewards` (Liu et al. 2026, arXiv 2601.18984): a failed rollout is split at its
  first wrong step k* (`first_error`) into a verified good prefix (steps < k*), which is
  credited, and the erroneous suffix, which alone is penalised; a successful rollout keeps the
  outcome reward. As returns: R_k = success_reward on a success; on a failure R_k =
  prefix_reward for k < k* and fail_reward for k >= k*, i.e. the reward prefix_reward -
  fail_reward sits on the last step of the good prefix [INF on the values; the paper places a
  dense reward on the good prefix's final token].
"""
import jax
import jax.numpy as jnp

from agentrl.credit import igpo

FORMS = ("sum", "min")


def _check(turn_mask_BU: jax.Array, **named: jax.Array) -> None:
  if turn_mask_BU.ndim != 2:
    raise ValueError(f"turn_mask has shape {turn_mask_BU.shape}; expected [B, U].")
  for name, x in named.items():
    want = turn_mask_BU.shape if x.ndim == 2 else turn_mask_BU.shape[:1]
    if x.shape != want:
      raise ValueError(f"{name} has shape {x.shape}; expected {want}.")


def _reverse_scan(fn, x_BU: jax.Array, valid_BU: jax.Array, init: float) -> jax.Array:
  """out_k = fn(x_k, carry) on valid turns, carry = that output, from the last turn back."""
  def step(carry_B, xs):
    x_B, valid_B = xs
    out_B = jnp.where(valid_B, fn(x_B, carry_B), carry_B)
    return out_B, out_B
  init_B = jnp.full(x_BU.shape[:1], init, jnp.float32)
  _, out_UB = jax.lax.scan(step, init_B, (x_BU.T, valid_BU.T), reverse=True)
  return out_UB.T


def returns_to_rewards(return_BU: jax.Array, turn_mask_BU: jax.Array) -> jax.Array:
  """Per-turn rewards whose undiscounted returns are `return_BU`: r_k = R_k - R_next, with
  R_next the next valid turn's return (0 after the last); invalid turns get 0."""
  _check(turn_mask_BU, return_BU=return_BU)
  valid_BU = turn_mask_BU > 0
  ret_BU = jnp.where(valid_BU, return_BU.astype(jnp.float32), 0.0)
  # The carry after turn k (from the back) is R_k; shift it by one valid turn.
  next_BU = _reverse_scan(lambda x, _: x, ret_BU, valid_BU, 0.0)
  after_BU = jnp.concatenate([next_BU[:, 1:], jnp.zeros_like(next_BU[:, :1])], axis=1)
  return jnp.where(valid_BU, ret_BU - after_BU, 0.0)


def dense_turn_rewards(score_BU: jax.Array, outcome_B: jax.Array, turn_mask_BU: jax.Array, *,
                       form: str = "min", process_coef: float = 1.0,
                       outcome_coef: float = 1.0) -> jax.Array:
  """PRM-dense per-turn rewards [B, U] mixed with the outcome (module docstring).

  Args:
    score_BU: PRM step scores s_k (probabilities in [0, 1]; data, no gradient).
    outcome_B: the outcome reward o (verifier or env).
    turn_mask_BU: 1 on turns that happened.
    form: "sum" (Math-Shepherd PPO, PRIME) or "min" (PURE) credit of the process scores.
    process_coef: c_p [INF: 1.0].
    outcome_coef: c_o, the outcome's weight; 0 is PRM-only [INF: 1.0].
  """
  if form not in FORMS:
    raise ValueError(f"dense_turn_rewards form={form!r}; expected one of {FORMS}.")
  _check(turn_mask_BU, score_BU=score_BU, outcome_B=outcome_B)
  valid_BU = turn_mask_BU > 0
  s_BU = jnp.where(valid_BU, score_BU.astype(jnp.float32), 0.0)
  if form == "sum":
    process_BU = s_BU
  else:
    suffix_min_BU = _reverse_scan(jnp.minimum, s_BU, valid_BU, jnp.inf)
    process_BU = returns_to_rewards(suffix_min_BU, turn_mask_BU)
  outcome_BU = jnp.where(igpo.last_turn(turn_mask_BU),
                         outcome_B.astype(jnp.float32)[:, None], 0.0)
  return jnp.where(valid_BU, process_coef * process_BU + outcome_coef * outcome_BU, 0.0)


def first_error(correct_BU: jax.Array, turn_mask_BU: jax.Array) -> jax.Array:
  """Int32 [B] index k* of the first valid step judged wrong; the number of valid steps if
  none is (a fully verified row). `correct_BU` is bool (e.g. PRM score > 0.5, or a checker)."""
  _check(turn_mask_BU, correct_BU=correct_BU)
  valid_BU = turn_mask_BU > 0
  wrong_BU = valid_BU & ~correct_BU.astype(bool)
  index_U = jnp.arange(turn_mask_BU.shape[1], dtype=jnp.int32)
  count_B = valid_BU.sum(1).astype(jnp.int32)
  return jnp.min(jnp.where(wrong_BU, index_U[None, :], count_B[:, None]), axis=1)


def prefix_mask(correct_BU: jax.Array, turn_mask_BU: jax.Array) -> jax.Array:
  """Bool [B, U]: the verified good prefix, valid steps before `first_error`."""
  index_U = jnp.arange(turn_mask_BU.shape[1], dtype=jnp.int32)
  return (turn_mask_BU > 0) & (index_U[None, :] < first_error(correct_BU, turn_mask_BU)[:, None])


def vppo_turn_rewards(correct_BU: jax.Array, success_B: jax.Array, turn_mask_BU: jax.Array, *,
                      success_reward: float = 1.0, prefix_reward: float = 0.5,
                      fail_reward: float = 0.0) -> jax.Array:
  """VPPO per-turn rewards [B, U] (module docstring); returns are the step values.

  Args:
    correct_BU: bool per-step correctness (PRM judgement or verifiable steps).
    success_B: bool outcome of each row.
    turn_mask_BU: 1 on turns that happened.
    success_reward: R of every step of a successful row [INF: 1.0].
    prefix_reward: R of a failed row's good-prefix steps [INF: 0.5, between fail and success].
    fail_reward: R of a failed row's steps from the first error on [INF: 0.0].
  """
  _check(turn_mask_BU, correct_BU=correct_BU, success_B=success_B)
  success_B = success_B.astype(bool)
  good_BU = prefix_mask(correct_BU, turn_mask_BU)
  failed_BU = jnp.where(good_BU, prefix_reward, fail_reward)
  return_BU = jnp.where(success_B[:, None], success_reward, failed_BU)
  return returns_to_rewards(return_BU, turn_mask_BU)
