# pylint: disable=invalid-name
"""Sample and token selection and token credit weights (D3S, DelTA); no gradients flow here.

- D3S (Wang et al. 2025, arXiv 2509.22115; no public code): per group, the subset of k
  rollouts whose advantages have the largest variance (`max_variance_subset`, exact), the
  tokens with the largest |A_t| * H_t (`d3s_token_mask`), and a keep-ratio curriculum
  (`d3s_keep_ratio`). Dropped rollouts and tokens get loss mask 0. docs/algorithms.md §13.1.
- DelTA (Zhang, Wu & Lin 2026, arXiv 2605.21467; code RUCBM/DelTA, `verl-DelTA/verl/workers/
  actor/dp_actor.py` `compute_log_prob_h`): per-token coefficients from the discriminator
  that the policy-gradient update induces (`delta_token_weights`). docs/algorithms.md §13.2.
- `top_fraction_mask`: the ceil(rho * N) highest-scoring valid tokens, over the batch or per
  row; D3S and `agentrl.advantages.shaping.lowest_fraction_mean` build on it.

Selections are data for the loss (a new mask or a detached weight): every output is 0 where
the loss mask is 0, and inputs there (NaN padding included) are never read.
"""
import jax
import jax.numpy as jnp

from agentrl.losses import schedules
from agentrl import types

SCOPES = ("batch", "row")


def _keep_count(fraction, n):
  """ceil(fraction * n), at least 1 when n > 0; a 1e-6 relative slack keeps 0.2 * 10 at 2."""
  n = n.astype(jnp.float32)
  k = jnp.ceil(jnp.asarray(fraction, jnp.float32) * n * (1.0 - 1e-6))
  return jnp.where(n > 0, jnp.clip(k, 1.0, n), 0.0)


def top_fraction_mask(score_BT: jax.Array, mask_BT: jax.Array, *, fraction: float | jax.Array,
                      scope: str = "batch") -> jax.Array:
  """Float {0, 1} [B, T]: the ceil(fraction * N) valid tokens with the highest score.

  N counts the valid tokens of the whole batch (`scope="batch"`) or of each row
  (`scope="row"`); at least one token is kept wherever N > 0. Ties keep the earlier position
  (row-major). `fraction` may be traced (a schedule inside jit); fraction >= 1 keeps every
  valid token.
  """
  if scope not in SCOPES:
    raise ValueError(f"Unknown selection scope {scope!r}; use one of {SCOPES}.")
  if score_BT.shape != mask_BT.shape or score_BT.ndim != 2:
    raise ValueError(f"score_BT and mask_BT must be matching [B, T] arrays; got "
                     f"{score_BT.shape} and {mask_BT.shape}.")
  if isinstance(fraction, (int, float)) and not 0.0 <= fraction:
    raise ValueError(f"fraction must be >= 0; got {fraction}.")
  valid_BT = mask_BT > 0
  key_BT = jnp.where(valid_BT, score_BT.astype(jnp.float32), -jnp.inf)
  if scope == "batch":
    key_BT = key_BT.reshape(1, -1)
  order = jnp.argsort(-key_BT, axis=-1, stable=True)
  rank = jnp.argsort(order, axis=-1, stable=True).reshape(score_BT.shape)
  n = valid_BT.sum() if scope == "batch" else valid_BT.sum(-1, keepdims=True)
  keep_BT = (rank < _keep_count(fraction, n)) & valid_BT
  return keep_BT.astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# D3S.
# ---------------------------------------------------------------------------------------------
def max_variance_subset(value_B: jax.Array, *, group_size: int, k: int) -> jax.Array:
  """Bool [B]: per group, the k rollouts whose values have the largest variance (exact).

  D3S's sample level keeps the subset maximising Var(A) (arXiv 2509.22115, abstract). Pass
  the advantages (or the rewards: within a group the advantage is an increasing affine map of
  the reward, so both give the same subset). Variance as a function of one member is a
  convex quadratic, so an optimal subset never leaves out a value more extreme than one it
  keeps: it is the j smallest plus the k - j largest values for some j, and all k + 1
  candidates are scored. For 0/1 rewards this balances correct and incorrect rollouts.
  Ties between equally good subsets go to the smaller j and, within equal values, to the
  earlier row. Rows that are dropped should get loss mask 0 (`keep_B[:, None] * mask_BT`).
  [INF] Whether the kept rollouts' advantages are recomputed on the subset is the caller's
  choice; the paper's abstract does not say.
  """
  x_PG = types.grouped(value_B, group_size)
  if not 1 <= k <= group_size:
    raise ValueError(f"k must be in [1, group_size={group_size}]; got {k}.")
  x_PG = x_PG - x_PG.mean(axis=1, keepdims=True)  # centring keeps the sums well conditioned
  order_PG = jnp.argsort(x_PG, axis=1, stable=True)
  s_PG = jnp.take_along_axis(x_PG, order_PG, axis=1)
  pad = lambda c: jnp.pad(c, ((0, 0), (1, 0)))
  c1, c2 = pad(jnp.cumsum(s_PG, axis=1)), pad(jnp.cumsum(s_PG * s_PG, axis=1))
  j_J = jnp.arange(k + 1)
  hi_J = group_size - (k - j_J)  # the top k - j values are sorted positions [hi, G)
  total_PJ = c1[:, j_J] + c1[:, -1:] - c1[:, hi_J]
  square_PJ = c2[:, j_J] + c2[:, -1:] - c2[:, hi_J]
  var_PJ = square_PJ / k - jnp.square(total_PJ / k)
  best_P1 = jnp.argmax(var_PJ, axis=1)[:, None]
  pos_G = jnp.arange(group_size)[None, :]
  keep_sorted_PG = (pos_G < best_P1) | (pos_G >= group_size - (k - best_P1))
  rank_PG = jnp.argsort(order_PG, axis=1, stable=True)
  return jnp.take_along_axis(keep_sorted_PG, rank_PG, axis=1).reshape(-1)


def d3s_token_mask(adv_BT: jax.Array, entropy_BT: jax.Array, mask_BT: jax.Array, *,
                   keep_ratio: float | jax.Array, scope: str = "batch") -> jax.Array:
  """D3S token level: keep the top `keep_ratio` tokens by |A_t| * H_t; new loss mask [B, T].

  H_t is the policy entropy at the position that sampled token t: the second output of
  `agentrl.models.policy.token_logprobs(model, tokens_BT, positions_BT, input_mask_BT,
  temperature=..., return_entropy=True)`, column-aligned with the log-probs. A sequence
  advantage is passed as `adv_B[:, None]`.
  [INF] `scope`: "batch" ranks tokens across all groups (the abstract's "across groups"),
  "row" within each response; the count is ceil(keep_ratio * N). The schedule of
  `keep_ratio` is `d3s_keep_ratio`.
  """
  adv_BT = jnp.broadcast_to(jnp.asarray(adv_BT, jnp.float32), mask_BT.shape)
  score_BT = jnp.abs(adv_BT) * entropy_BT.astype(jnp.float32)
  return top_fraction_mask(score_BT, mask_BT, fraction=keep_ratio, scope=scope)


def d3s_keep_ratio(step: int | jax.Array, *, start: float, end: float, total_steps: int,
                   schedule: str = "linear") -> jax.Array:
  """D3S curriculum [INF]: a keep ratio moving from `start` (aggressive) to `end` (relaxed).

  The abstract says only that down-sampling starts aggressive and relaxes; the shape and the
  end points are unknown, so all are arguments. `schedule`: "linear", "sin" (an S-curve:
  start + (end - start)(1 - cos(pi prog))/2) or "constant" (start), with prog = min(1,
  step / total_steps); `step` may be traced.
  """
  if schedule not in ("linear", "sin", "constant"):
    raise ValueError(f"Unknown D3S keep-ratio schedule {schedule!r}; use 'linear', 'sin' or "
                     "'constant'.")
  if not (0.0 < start <= 1.0 and 0.0 < end <= 1.0):
    raise ValueError(f"keep ratios must be in (0, 1]; got start={start}, end={end}.")
  # holder_p's "linear" and "sin" interpolate from p_min to p_max for either order of the two.
  return schedules.holder_p(step, schedule=schedule, p_const=start, p_min=start, p_max=end,
                            schedule_steps=total_steps)


# ---------------------------------------------------------------------------------------------
# DelTA.
# ---------------------------------------------------------------------------------------------
def _margin_scale(margin_BT, select_BT, eps):
  """sqrt(max(population variance of margin over the selected tokens, eps)), as the code."""
  n = jnp.maximum(select_BT.sum(), 1.0)
  mean = jnp.where(select_BT, margin_BT, 0.0).sum() / n
  var = jnp.where(select_BT, jnp.square(margin_BT), 0.0).sum() / n - jnp.square(mean)
  return jnp.sqrt(jnp.maximum(var, eps))


def delta_token_weights(h_BTD: jax.Array, logp_BT: jax.Array, adv_B: jax.Array,
                        mask_BT: jax.Array, *, steps: int = 1, w_min: float = 0.8,
                        w_max: float = 1.2, eps: float = 1e-8) -> jax.Array:
  """DelTA token coefficients w [B, T] (mean 1 over the batch's valid tokens; 0 where masked).

  The update `sum A_i grad logp` is a linear discriminator between advantage-weighted
  centroids of token-gradient vectors, and tokens shared by both sides (formatting) dilute
  it. As the official `compute_log_prob_h` ("Normal" implementation), on the whole batch:

    v_t = (1 - p_t) h_t, the last-layer gradient proxy (h_t: the final hidden state that
      predicts token t, after the final norm; p_t = exp(logp_t) of the rollout policy);
    mu+ (mu-) = the mean of v over the tokens of rows with A > 0 (A < 0), weighted by |A|;
    m+_t = |v - mu-|^2 - |v - mu+|^2 on positive rows, m-_t = -m+_t on negative rows; gamma+
      (gamma-) = the standard deviation of m+ (m-) over its side's tokens;
    `steps` times (the launcher's K = 1): mu+ <- the mean of v weighted by sigmoid(m+ / gamma+)
      * A+ (likewise mu-), then m and gamma are recomputed (gamma from the margins before the
      centroid moved, as the code does);
    w_t = w_min + (w_max - w_min) sigmoid(m / gamma) on its side's rows, w_min where A = 0,
      then rescaled so that the mean of w over all valid tokens is 1.

  Use the result as token advantages `adv_B[:, None] * w` in the usual PPO loss (the
  launcher: token-mean, clip 0.2/0.28, dual clip 10). w_min = w_max = 1 gives w = 1, i.e.
  GRPO. The centroid distance is Euclidean (the code computes a diagonal metric and then
  overwrites it with ones). With the model of `agentrl.models`, h for token t is
  `model.hidden(...)` at position t - 1, the column alignment of `policy.token_logprobs`.

  Args:
    h_BTD: final hidden states aligned with the tokens they predict.
    logp_BT: rollout-policy log-probs of the sampled tokens (p_t = exp(logp_t)).
    adv_B: sequence advantages (the code reads `advantages[:, 0]`).
    mask_BT: the loss mask.
    steps: centroid refinement steps (K, default 1).
    w_min, w_max: coefficient range (lam_min 0.8 and lam_max 1.2 in run_DelTA.sh).
    eps: the code's clamps (centroid denominators, margin variance).
  """
  if h_BTD.ndim != 3 or h_BTD.shape[:2] != mask_BT.shape or logp_BT.shape != mask_BT.shape or (
      adv_B.shape != mask_BT.shape[:1]):
    raise ValueError(f"delta_token_weights expects h [B, T, D], logp [B, T], adv [B], mask "
                     f"[B, T]; got {h_BTD.shape}, {logp_BT.shape}, {adv_B.shape}, "
                     f"{mask_BT.shape}.")
  if steps < 0 or not w_min <= w_max:
    raise ValueError(f"Need steps >= 0 and w_min <= w_max; got {steps}, {w_min}, {w_max}.")
  valid_BT = mask_BT > 0
  prob_BT = jnp.exp(jnp.where(valid_BT, logp_BT.astype(jnp.float32), 0.0))
  v_BTD = jnp.where(valid_BT[..., None], (1.0 - prob_BT)[..., None] * h_BTD.astype(jnp.float32),
                    0.0)
  adv_B = jax.lax.stop_gradient(adv_B.astype(jnp.float32))
  pos_BT, neg_BT = (adv_B > 0)[:, None] & valid_BT, (adv_B < 0)[:, None] & valid_BT
  base_pos_BT = jnp.where(pos_BT, adv_B[:, None], 0.0)
  base_neg_BT = jnp.where(neg_BT, -adv_B[:, None], 0.0)

  def centroid(w_BT):
    return jnp.einsum("bt,btd->d", w_BT, v_BTD) / jnp.maximum(w_BT.sum(), eps)

  def margins(mu_pos_D, mu_neg_D):
    d_pos_BT = jnp.square(v_BTD - mu_pos_D[None, None, :]).sum(-1)
    d_neg_BT = jnp.square(v_BTD - mu_neg_D[None, None, :]).sum(-1)
    return d_neg_BT - d_pos_BT, d_pos_BT - d_neg_BT

  mu_pos_D, mu_neg_D = centroid(base_pos_BT), centroid(base_neg_BT)
  m_pos_BT, m_neg_BT = margins(mu_pos_D, mu_neg_D)
  g_pos, g_neg = _margin_scale(m_pos_BT, pos_BT, eps), _margin_scale(m_neg_BT, neg_BT, eps)
  for _ in range(steps):
    mu_pos_D = centroid(jax.nn.sigmoid(m_pos_BT / g_pos) * base_pos_BT)
    mu_neg_D = centroid(jax.nn.sigmoid(m_neg_BT / g_neg) * base_neg_BT)
    g_pos, g_neg = _margin_scale(m_pos_BT, pos_BT, eps), _margin_scale(m_neg_BT, neg_BT, eps)
    m_pos_BT, m_neg_BT = margins(mu_pos_D, mu_neg_D)
  span = w_max - w_min
  w_BT = jnp.where(pos_BT, w_min + span * jax.nn.sigmoid(m_pos_BT / g_pos),
                   jnp.where(neg_BT, w_min + span * jax.nn.sigmoid(m_neg_BT / g_neg), w_min))
  w_BT = jnp.where(valid_BT, w_BT, 0.0)
  n_valid = valid_BT.sum().astype(jnp.float32)
  return jax.lax.stop_gradient(w_BT * (n_valid / jnp.maximum(w_BT.sum(), 1e-8)))

