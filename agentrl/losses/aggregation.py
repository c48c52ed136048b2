# pylint: disable=invalid-name
"""Loss aggregation: how a per-token loss matrix becomes one scalar.

The aggregation mode is part of the algorithm (algorithms.md §0.3): global token-mean and
per-sequence mean are different estimators. Losses in `agentrl.losses` return unreduced
`[B, T]` (or `[B]`) values and the caller reduces them here, once.

Modes (m is the loss mask, L the per-token loss):

  token-mean               sum_{i,t} m L / sum_{i,t} m            (verl default; DAPO, CTPO)
  token-sum                sum_{i,t} m L
  seq-mean-token-mean      mean_i [ sum_t m L / sum_t m ]          (GRPO paper, GSPO)
  seq-mean-token-sum       mean_i sum_t m L
  seq-mean-token-sum-norm  sum_{i,t} m L / C, C a constant          (Dr.GRPO in verl)
  seq-mean                 mean_i L_i for sequence-level losses [B] (GSPO seq, GMPO, HölderPO)

Microbatch invariance. Pass `norm` computed once over the *whole* minibatch with
`normalizer(mask, mode)`; then summing `aggregate(part, norm=norm)` over any split of the rows
equals the unsplit value. Without `norm`, each call normalizes by its own rows, which is what
a single-batch user wants but is not split-invariant (averaging per-microbatch token-means is
a different estimator when microbatches hold different token counts).

Sequence means run over *valid* sequences only (at least one unmasked token), as verl does,
so fully masked rows (e.g. void samples) neither contribute nor dilute.
"""
import chex
import jax
import jax.numpy as jnp

MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
         "seq-mean-token-sum-norm", "seq-mean")


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"Unknown aggregation mode {mode!r}; expected one of {MODES}.")


def normalizer(mask: jax.Array, mode: str) -> jax.Array:
  """The denominator `aggregate` uses for `mode`, computed over all rows of `mask`.

  Compute it on the full minibatch and pass it as `norm=` to each microbatch's `aggregate`.
  For `seq-mean-token-sum-norm` it is the constant C = T (the padded length); pass your own
  constant (e.g. max response length) instead if you prefer.
  """
  _check_mode(mode)
  mask = mask.astype(jnp.float32)
  if mode == "token-mean":
    return jnp.maximum(mask.sum(), 1.0)
  if mode == "token-sum":
    return jnp.ones((), jnp.float32)
  if mode == "seq-mean-token-sum-norm":
    return jnp.asarray(mask.shape[-1], jnp.float32)
  if mode == "seq-mean":
    return jnp.maximum(mask.sum(), 1.0)
  valid_B = mask.sum(-1) > 0
  return jnp.maximum(valid_B.sum().astype(jnp.float32), 1.0)


def aggregate(loss: jax.Array, mask: jax.Array, mode: str, *,
              norm: jax.Array | float | None = None) -> jax.Array:
  """Reduces a masked loss to a scalar (float32).

  Args:
    loss: `[B, T]` per-token loss, or `[B]` per-sequence loss for mode "seq-mean".
    mask: same shape as `loss`; 1 where the entry counts. Masked entries are excluded with
      `where`, so a NaN or inf there cannot leak into the value or the gradient.
    mode: one of `MODES`.
    norm: optional global denominator from `normalizer(full_mask, mode)`; see module doc.
  """
  _check_mode(mode)
  chex.assert_equal_shape([loss, mask])
  if mode == "seq-mean":
    chex.assert_rank(loss, 1)
  else:
    chex.assert_rank(loss, 2)
  mask_f = mask.astype(jnp.float32)
  masked = jnp.where(mask_f > 0, loss.astype(jnp.float32), 0.0) * mask_f
  denom = normalizer(mask_f, mode) if norm is None else jnp.asarray(norm, jnp.float32)

  if mode in ("token-mean", "token-sum", "seq-mean-token-sum-norm", "seq-mean"):
    return masked.sum() / denom
  if mode == "seq-mean-token-mean":
    per_seq_B = masked.sum(-1) / jnp.maximum(mask_f.sum(-1), 1.0)
  else:  # seq-mean-token-sum
    per_seq_B = masked.sum(-1)
  # Rows with no valid token contribute exactly 0 (their masked sum is 0).
  return per_seq_B.sum() / denom


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  """Mean of x over entries where mask is 1; 0 where nothing is unmasked (no NaN)."""
  mask_f = mask.astype(jnp.float32)
  total = jnp.where(mask_f > 0, x, 0.0).sum(axis) if axis is not None else (
      jnp.where(mask_f > 0, x, 0.0).sum())
  count = mask_f.sum(axis) if axis is not None else mask_f.sum()
  return total / jnp.maximum(count, 1.0)


def masked_whiten(x: jax.Array, mask: jax.Array, *, shift_mean: bool = True,
                  eps: float = 1e-8) -> jax.Array:
  """verl's `masked_whiten`: (x - mean) / sqrt(unbiased masked var + eps) over all entries.

  Used by GAE, REINFORCE++ and the batch-whitened baselines (algorithms.md §0.4). Masked
  entries come back as exactly 0. With `shift_mean=False` the mean is added back (verl option).
  """
  mask_f = mask.astype(jnp.float32)
  x = x.astype(jnp.float32)
  mean = masked_mean(x, mask_f)
  count = mask_f.sum()
  sq = jnp.where(mask_f > 0, (x - mean) ** 2, 0.0).sum()
  # Unbiased (N-1) variance like torch; a single valid entry has variance 0, not NaN.
  var = sq / jnp.maximum(count - 1.0, 1.0)
  white = (x - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    white = white + mean
  return jnp.where(mask_f > 0, white, 0.0)
