# pylint: disable=invalid-name
"""Loss aggregation: how a per-token loss matrix becomes one scalar.

The aggregation mode is part of the algorithm (docs/algorithms.md §0.3): global token-mean and
per-sequence mean are different estimators. Losses in `agentrl.losses` return unreduced
`[B, T]` (or `[B]`) values and the caller reduces them here, once.

Modes (m is the loss mask, L the per-token loss):

  token-mean               sum_{i,t} m L / sum_{i,t} m            (verl default; DAPO, CTPO)
  token-sum                sum_{i,t} m L
  seq-mean-token-mean      mean_i [ sum_t m L / sum_t m ]          (GRPO paper, GSPO)
  seq-mean-token-sum       mean_i sum_t m L
  seq-mean-token-sum-norm  mean_i [ sum_t m L / C ]                (Dr.GRPO; verl)
                           = sum_{i,t} m L / (n_seq C), C a constant, default T
  seq-mean                 mean_i L_i for sequence-level losses [B] (GSPO seq, GMPO, HölderPO)

seq-mean-token-sum-norm is Dr.GRPO's (Liu et al. 2025, arXiv 2503.20783) length-unbiased
aggregate: each sequence's token sum is divided by one constant C instead of its own length
(oat's `masked_sum(..., constant_normalizer=generate_max_length)`), then averaged over the
n_seq valid sequences. verl's `agg_loss` gives the same value: its seq-mean over valid
sequences divided by `loss_scale_factor` (default: the padded response length T). Pass C as
`seq_norm_const` (Dr.GRPO uses the maximum generation length); without it C = T.

Microbatch invariance. Pass `norm` computed once over the *whole* minibatch with
`normalizer(mask, mode)` (plus `seq_norm_const=C` for seq-mean-token-sum-norm); then summing
`aggregate(part, norm=norm)` over any split of the rows equals the unsplit value. Without `norm`, each call normalizes by its own rows, which is what
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


def normalizer(mask: jax.Array, mode: str, *,
               seq_norm_const: float | None = None) -> jax.Array:
  """The denominator `aggregate` uses for `mode`, computed over all rows of `mask`.

  Compute it on the full minibatch and pass it as `norm=` to each microbatch's `aggregate`.
  For `seq-mean-token-sum-norm` it is n_seq · C: the number of valid sequences times the
  constant C = `seq_norm_const` (default T, the padded length); `seq_norm_const` is an error
  for any other mode.
  """
  _check_mode(mode)
  if seq_norm_const is not None:
    if mode != "seq-mean-token-sum-norm":
      raise ValueError(f"seq_norm_const only applies to 'seq-mean-token-sum-norm'; got mode "
                       f"{mode!r}.")
    if isinstance(seq_norm_const, (int, float)) and not seq_norm_const > 0:
      raise ValueError(f"seq_norm_const must be > 0; got {seq_norm_const}.")
  mask = mask.astype(jnp.float32)
  if mode == "token-mean":
    return jnp.maximum(mask.sum(), 1.0)
  if mode == "token-sum":
    return jnp.ones((), jnp.float32)
  if mode == "seq-mean":
    return jnp.maximum(mask.sum(), 1.0)
  valid_B = mask.sum(-1) > 0
  n_seq = jnp.maximum(valid_B.sum().astype(jnp.float32), 1.0)
  if mode == "seq-mean-token-sum-norm":
    const = mask.shape[-1] if seq_norm_const is None else seq_norm_const
    return n_seq * jnp.asarray(const, jnp.float32)
  return n_seq


def aggregate(loss: jax.Array, mask: jax.Array, mode: str, *,
              norm: jax.Array | float | None = None,
              seq_norm_const: float | None = None) -> jax.Array:
  """Reduces a masked loss to a scalar (float32).

  Args:
    loss: `[B, T]` per-token loss, or `[B]` per-sequence loss for mode "seq-mean".
    mask: same shape as `loss`; 1 where the entry counts. Masked entries are excluded with
      `where`, so a NaN or inf there cannot leak into the value or the gradient.
    mode: one of `MODES`.
    norm: optional global denominator from `normalizer(full_mask, mode, ...)`; it replaces the
      whole denominator (see module doc).
    seq_norm_const: the constant C of "seq-mean-token-sum-norm" (default T). With `norm`, pass
      it to `normalizer` instead.
  """
  _check_mode(mode)
  if norm is not None and seq_norm_const is not None:
    raise ValueError("norm= is the whole denominator; pass seq_norm_const to normalizer() "
                     "and its result as norm=.")
  chex.assert_equal_shape([loss, mask])
  if mode == "seq-mean":
    chex.assert_rank(loss, 1)
  else:
    chex.assert_rank(loss, 2)
  mask_f = mask.astype(jnp.float32)
  masked = jnp.where(mask_f > 0, loss.astype(jnp.float32), 0.0) * mask_f
  if norm is None:
    denom = normalizer(mask_f, mode, seq_norm_const=seq_norm_const)
  else:
    denom = jnp.asarray(norm, jnp.float32)

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

  Used by GAE, REINFORCE++ and the batch-whitened baselines (docs/algorithms.md §0.4). Masked
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
