# pylint: disable=invalid-name
"""Pooled group statistics shared by the turn-level credit methods (docs/algorithms.md §5).

IGPO, SIOP and InfoPO z-score a *pool* per prompt: every selected (row, turn) or (row, token)
entry of the prompt's G rows, not one value per row. They differ only in the std they divide
by (population or unbiased, their own guards), so the shared part is the centring.
"""
import jax
import jax.numpy as jnp


def centre(x_PN: jax.Array, select_PN: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Centres the selected entries of each pool (row p of [P, N]) on their mean.

  Returns the centred values (0 where not selected), the pool sizes [P, 1] and the sums of
  squared deviations [P, 1]. A pool of equal values centres to exactly 0: values are shifted
  by the pool's smallest one first (x - mean(x) can be one ulp off in float32).
  """
  if x_PN.ndim != 2 or select_PN.shape != x_PN.shape:
    raise ValueError(f"pooling.centre expects matching [P, N] arrays; got {x_PN.shape} and "
                     f"{select_PN.shape}.")
  x_PN = x_PN.astype(jnp.float32)
  count_P1 = select_PN.sum(axis=1, keepdims=True).astype(jnp.float32)
  low_P1 = jnp.where(select_PN, x_PN, jnp.inf).min(axis=1, keepdims=True)
  d_PN = jnp.where(select_PN, x_PN - jnp.where(count_P1 > 0, low_P1, 0.0), 0.0)
  centred_PN = jnp.where(select_PN,
                         d_PN - d_PN.sum(axis=1, keepdims=True) / jnp.maximum(count_P1, 1.0),
                         0.0)
  return centred_PN, count_P1, jnp.square(centred_PN).sum(axis=1, keepdims=True)
