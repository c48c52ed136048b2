# pylint: disable=invalid-name
"""Length-shaped outcome rewards for efficient reasoning: HAPO, HBPO and a geometric discount.

Each function maps per-response data ([B] arrays: correctness, response length in tokens, a
budget) to a scalar reward [B]; feed the result to a group estimator (`estimators.grpo`,
`efficiency.hbpo`). Formulas and sources: docs/algorithms.md §12.

- HAPO (Huang et al. 2025, arXiv 2505.11225; code HCY123902/HAPO `utils.py`,
  `grpo_trainer.py`): `hapo_length_reward`, `hapo_reward`, and the history of the shortest
  correct length per prompt, `LengthHistory` (a pytree a train state can hold) updated by the
  pure `update_history`; `PromptSlots` maps prompt keys to table rows on the host.
- HBPO (Lyu et al. 2025, arXiv 2507.15844; code ZJU-REAL/HBPO `rllm/rewards/math_reward.py`):
  `hbpo_reward`, the budget-aware piecewise reward.
- `geometric_length_discount`: the correctness reward discounted by gamma^L (the "EAPO
  geometric reward discount" of the issue) [INF, docs/algorithms.md §12.3].

Lengths count the policy's sampled response tokens (the `loss_mask` sum), as HBPO's
`valid_response_length` does; HAPO re-tokenizes the completion's text without special tokens,
which can differ from that count by the final stop token [INF].
"""
from collections.abc import Hashable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

# HBPO's math_reward.py writes pi as this constant; math.pi changes rewards by ~1e-5 relative.
HBPO_PI = 3.1416


def _check_same_shape(name: str, *arrays) -> None:
  shapes = {tuple(jnp.shape(a)) for a in arrays}
  if len(shapes) != 1 or len(next(iter(shapes))) != 1:
    raise ValueError(f"{name} expects [B] arrays of one shape; got shapes "
                     f"{[tuple(jnp.shape(a)) for a in arrays]}.")


# ------------------------------------------------------------------------------------------
# HAPO: history-aware length reward.
# ------------------------------------------------------------------------------------------


def hapo_length_reward(length_B: jax.Array, correct_B: jax.Array, history_B: jax.Array, *,
                       w: float = 1.0, kind: str = "cosine",
                       tolerance: float = 0.1) -> jax.Array:
  """HAPO's length reward [B], w * r_len, against h = the prompt's shortest correct length.

  HAPO `utils.compute_len_reward` (kind="cosine", the default `type_lr`):
    r = cos(pi/2 * L/h) if L < 2h else -1;  correct: max(-0.7, r);  incorrect: min(0, r).
  `compute_len_reward_linear` (kind="linear", tolerance 0.1 as `HistroyTracker`):
    correct:   1 - L/h if L < h;  0 if L < (1 + tol) h;  else max(-0.7, -(L - (1 + tol) h)/h)
    incorrect: 0 if L < (1 + tol) h;  else max(-1, -(L - (1 + tol) h)/h).
  r = 0 where h is undefined (no correct response to that prompt seen yet: `history_B` not
  finite, or <= 0). The clamp at -0.7 keeps every correct response above every incorrect one.

  Args:
    length_B: response length in tokens.
    correct_B: 1/True for a correct response.
    history_B: h for each row's prompt, e.g. `LengthHistory.lookup(slot_B)`; inf = undefined.
    w: the weight `w_lr` (official default 1.0).
  """
  _check_same_shape("hapo_length_reward", length_B, correct_B, history_B)
  if kind not in ("cosine", "linear"):
    raise ValueError(f"kind must be 'cosine' or 'linear', got {kind!r}.")
  L = jnp.asarray(length_B, jnp.float32)
  h = jnp.asarray(history_B, jnp.float32)
  correct = jnp.asarray(correct_B) > 0
  defined = jnp.isfinite(h) & (h > 0)
  h = jnp.where(defined, h, 1.0)  # keeps the unused branches finite
  if kind == "cosine":
    r = jnp.where(L < 2.0 * h, jnp.cos(L / h * (jnp.pi / 2.0)), -1.0)
    r = jnp.where(correct, jnp.maximum(-0.7, r), jnp.minimum(0.0, r))
  else:
    over = -(L - (1.0 + tolerance) * h) / h
    within = L < (1.0 + tolerance) * h
    r_correct = jnp.where(L < h, 1.0 - L / h, jnp.where(within, 0.0, jnp.maximum(-0.7, over)))
    r_wrong = jnp.where(within, 0.0, jnp.maximum(-1.0, over))
    r = jnp.where(correct, r_correct, r_wrong)
  return jnp.where(defined, r, 0.0) * w


def hapo_reward(correct_B: jax.Array, length_B: jax.Array, history_B: jax.Array, *,
                w: float = 1.0, kind: str = "cosine") -> jax.Array:
  """HAPO's total reward [B]: r_correct + w * r_len (`grpo_trainer.combined_reward_func`).

  r_correct is 1 for a correct response, 0 otherwise; w = 0 gives the plain correctness
  reward. The official repetition penalty (`rep_penalty`, 0 by default) is not included.
  """
  r_len = hapo_length_reward(length_B, correct_B, history_B, w=w, kind=kind)
  return (jnp.asarray(correct_B) > 0).astype(jnp.float32) + r_len


@flax.struct.dataclass
class LengthHistory:
  """HAPO's per-prompt history, one slot per prompt: a small pytree for the train state.

  h_N is the shortest correct length seen (mode "min"; the running mean in mode "mean"), +inf
  while none was seen; count_N the weight of h in mode "mean" (HAPO's `count_dict`). HAPO
  keeps the same table as a tensor of MAX_TRAIN_SET_SIZE + MAX_VALID_SET_SIZE = 11000 entries
  indexed by dataset position (`utils.check_dataset_len_and_init_len_dict`).
  """
  h_N: jax.Array
  count_N: jax.Array

  @classmethod
  def create(cls, num_slots: int) -> "LengthHistory":
    if num_slots < 1:
      raise ValueError(f"num_slots must be >= 1, got {num_slots}.")
    return cls(h_N=jnp.full((num_slots,), jnp.inf, jnp.float32),
               count_N=jnp.zeros((num_slots,), jnp.float32))

  def lookup(self, slot_B: jax.Array) -> jax.Array:
    """h of each row's slot [B]; +inf (undefined) for slot -1 or any slot outside the table."""
    N = self.h_N.shape[0]
    slot_B = jnp.asarray(slot_B, jnp.int32)
    h_B = jnp.take(self.h_N, jnp.clip(slot_B, 0, N - 1))
    return jnp.where((slot_B >= 0) & (slot_B < N), h_B, jnp.inf)


def update_history(history: LengthHistory, slot_B: jax.Array, length_B: jax.Array,
                   correct_B: jax.Array, *, mode: str = "min") -> LengthHistory:
  """The table after one batch: each slot folds in its rows' correct lengths (pure, jit-able).

  mode "min" (HAPO's default): h <- min(h, shortest correct length in the batch). mode "mean":
  h <- a running mean of the correct lengths, as `combined_reward_func`'s ratio-weighted
  update; that loop runs once per *row* of a prompt, so a batch whose m rows of a prompt hold
  n correct lengths of sum s folds them in m times: h <- (c h + m s) / (c + m n), c <- c + m n.
  Rows with slot -1 (padding, evaluation) and incorrect rows change nothing. Compute this
  step's rewards from the table *before* the update, as HAPO does.
  """
  _check_same_shape("update_history", slot_B, length_B, correct_B)
  if mode not in ("min", "mean"):
    raise ValueError(f"mode must be 'min' or 'mean', got {mode!r}.")
  N = history.h_N.shape[0]
  slot_B = jnp.asarray(slot_B, jnp.int32)
  # Out-of-range index N is dropped by the scatters below (negative indices would wrap).
  index_B = jnp.where(slot_B >= 0, slot_B, N)
  correct_B = (jnp.asarray(correct_B) > 0) & (slot_B >= 0)
  L_B = jnp.asarray(length_B, jnp.float32)
  scatter_add = lambda x_B: jnp.zeros((N,), jnp.float32).at[index_B].add(x_B, mode="drop")
  rows_N = scatter_add((slot_B >= 0).astype(jnp.float32))          # m
  n_N = scatter_add(correct_B.astype(jnp.float32))                 # n
  sum_N = scatter_add(jnp.where(correct_B, L_B, 0.0))              # s
  count_N = history.count_N + rows_N * n_N
  if mode == "min":
    batch_min_N = jnp.full((N,), jnp.inf, jnp.float32).at[index_B].min(
        jnp.where(correct_B, L_B, jnp.inf), mode="drop")
    return LengthHistory(h_N=jnp.minimum(history.h_N, batch_min_N), count_N=count_N)
  old_N = jnp.where(history.count_N > 0, history.h_N, 0.0)
  mean_N = (history.count_N * old_N + rows_N * sum_N) / jnp.maximum(count_N, 1.0)
  return LengthHistory(h_N=jnp.where(n_N > 0, mean_N, history.h_N), count_N=count_N)


class PromptSlots:
  """Host-side map from prompt keys (seed, dataset index, text hash) to `LengthHistory` slots.

  A key gets the next free slot the first time it is seen, so the mapping is the list of keys
  in slot order: `keys()` saves it with a checkpoint and `PromptSlots(n, keys=saved)` restores
  it. HAPO indexes its table by dataset position directly; this also covers keys that are not
  small integers.
  """

  def __init__(self, num_slots: int, *, keys: Sequence[Hashable] = ()):
    if num_slots < 1:
      raise ValueError(f"num_slots must be >= 1, got {num_slots}.")
    self.num_slots = num_slots
    self._slot: dict[Hashable, int] = {}
    for key in keys:
      self._assign(key)

  def _assign(self, key: Hashable) -> int:
    if key not in self._slot:
      if len(self._slot) >= self.num_slots:
        raise ValueError(f"PromptSlots is full ({self.num_slots} slots) and got a new key "
                         f"{key!r}; create the LengthHistory with more slots.")
      self._slot[key] = len(self._slot)
    return self._slot[key]

  def __call__(self, keys: Sequence[Hashable]) -> np.ndarray:
    """int32 [B] slots of the keys, assigning free slots to new ones."""
    return np.asarray([self._assign(k) for k in keys], np.int32)

  def keys(self) -> list[Hashable]:
    return list(self._slot)


# ------------------------------------------------------------------------------------------
# HBPO: budget-aware piecewise reward.
# ------------------------------------------------------------------------------------------


def hbpo_budget_reward(budget_B: jax.Array, *, max_len: int = 4096, beta: float = 4.0,
                       pi: float = HBPO_PI) -> jax.Array:
  """f2(b) = beta cos(pi b / (2 L_max)) [B]: HBPO's reward at the budget (paper Eq. f2)."""
  return beta * jnp.cos(pi * jnp.asarray(budget_B, jnp.float32) / (2.0 * max_len))


def hbpo_reward(correct_B: jax.Array, length_B: jax.Array, budget_B: jax.Array, *,
                formatted_B: jax.Array | None = None, max_len: int = 4096, beta: float = 4.0,
                alpha: float | None = None, within_budget: str = "min",
                incorrect_reward: float = 0.0, format_error_reward: float = -1.0,
                pi: float = HBPO_PI) -> jax.Array:
  """HBPO's reward [B] for responses generated under token budget b (`math_reward.py`).

  With f1 = beta cos(pi L / (2 L_max)) - alpha |L - b| (cosine decay plus deviation penalty)
  and f2 = `hbpo_budget_reward(b)`, a correct response with L <= L_max gets
    within_budget="min"  (the released code): min(f1, f2) for every L. Beyond the budget this
                         is f1; inside it is non-decreasing in L and equals f2 near b;
    within_budget="flat" (the paper's Eq. reward_intra): f2 for L <= b, f1 beyond.
  A correct response longer than L_max and an incorrect one get `incorrect_reward` (0); one
  with no parseable answer (`formatted_B` False: no closing think tag or boxed answer) gets
  `format_error_reward` (-1). Defaults are the released code's: beta = 4, L_max = 4096 (the
  training context), alpha = 1 / L_max, pi written as 3.1416.
  """
  _check_same_shape("hbpo_reward", correct_B, length_B, budget_B)
  if within_budget not in ("min", "flat"):
    raise ValueError(f"within_budget must be 'min' or 'flat', got {within_budget!r}.")
  alpha = 1.0 / max_len if alpha is None else alpha
  L = jnp.asarray(length_B, jnp.float32)
  b = jnp.asarray(budget_B, jnp.float32)
  f1 = beta * jnp.cos(pi * L / (2.0 * max_len)) - alpha * jnp.abs(L - b)
  f2 = hbpo_budget_reward(b, max_len=max_len, beta=beta, pi=pi)
  shaped = jnp.minimum(f1, f2) if within_budget == "min" else jnp.where(L <= b, f2, f1)
  good = (jnp.asarray(correct_B) > 0) & (L <= max_len)
  reward = jnp.where(good, shaped, incorrect_reward)
  if formatted_B is not None:
    reward = jnp.where(jnp.asarray(formatted_B) > 0, reward, format_error_reward)
  return reward


# ------------------------------------------------------------------------------------------
# Geometric length discount.
# ------------------------------------------------------------------------------------------


def geometric_length_discount(reward_B: jax.Array, length_B: jax.Array, *, gamma: float,
                              undiscounted_B: jax.Array | None = None) -> jax.Array:
  """gamma^L * reward + undiscounted [B]: the outcome reward discounted per generated token.

  The issue's "EAPO geometric reward discount" [INF]: no EAPO paper or code with this reward
  was available offline, so the form follows the discounted-RL view of efficient reasoning
  (Ayoub et al. 2025, arXiv 2510.23486, abstract): the environment (correctness) reward is
  discounted by gamma per reasoning token, while format rewards (`undiscounted_B`) are not.
  gamma = 1 returns the reward unchanged. There is no source default, so gamma is required.
  """
  _check_same_shape("geometric_length_discount", reward_B, length_B)
  if not 0.0 < gamma <= 1.0:
    raise ValueError(f"gamma must be in (0, 1], got {gamma}.")
  L = jnp.asarray(length_B, jnp.float32)
  out = jnp.exp(L * jnp.log(jnp.float32(gamma))) * jnp.asarray(reward_B, jnp.float32)
  return out if undiscounted_B is None else out + jnp.asarray(undiscounted_B, jnp.float32)
