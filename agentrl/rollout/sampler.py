# pylint: disable=invalid-name
"""Batched, KV-cached token sampling in one jitted program per shape bucket.

  sampler = Sampler(graphdef, pad_id=tok.pad_id)
  out = sampler.generate(params, prompts, rng=key, max_new_tokens=64, temperature=0.7,
                         top_k=50, top_p=0.95, stop_ids=tok.end_of_turn_ids)
  out.tokens_BN, out.logp_BN, out.lengths_B          # host numpy

Design (docs/kernels.md §6; after tunix's vanilla sampler): prompts are left-padded so that every
row's last prompt token sits in the same column; one prefill writes them into a static-shape
KV cache at slots [0, P - 1), then a `lax.while_loop` feeds one token per step (the last
prompt token first) at slot P - 1 + s and exits as soon as every row has stopped. Prefill and
decode live in one jitted program; the cache is created inside it and threaded through the
loop carry, so XLA updates it in place and no cache buffer ever crosses the host boundary
(tunix splits prefill and decode into two programs and therefore has to donate the cache
between them). Params are an argument of the program (graphdef + nnx.State), never constants
baked into the HLO, so new weights after an update reuse the compiled program.

Shapes are bucketed to powers of two (batch, prompt length, new tokens, stop-set size) so a
run compiles a handful of programs. Per-row prompt lengths, per-row token budgets, per-row
greedy flags, the temperature and top-p are runtime values; only top-k (it fixes the shape
of `lax.top_k`), whether top-p is on, and the log-prob mode are static.

Log-probs. `logp_mode="tempered"` (the default) reports log softmax(logits / temperature) at
the sampled token: the temperature-only distribution, which is exactly what
`policy.token_logprobs(..., temperature=T)` recomputes, so the rollout/trainer mismatch is
~0. `logp_mode="truncated"` reports the log-prob under the distribution actually sampled
from after top-k/top-p truncation and renormalization (>= the tempered value); use it for
importance corrections against the true behaviour policy. Without top-k/top-p both are
identical. Greedy rows report the log-prob of the argmax token under the same distribution.
All log-probs are float32.

Sampling randomness is per row: row i at step s uses fold_in(fold_in(rng, i), s), so a row's
sample does not depend on how many other rows share its batch or bucket.
"""
import dataclasses
import functools
from typing import Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.models import transformer

LOGP_MODES = ("tempered", "truncated")


def bucket(n: int, minimum: int = 1) -> int:
  """Smallest power of two >= max(n, minimum)."""
  n = max(int(n), int(minimum), 1)
  return 1 << (n - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class SampleOutput:
  """Host-side result for the B requested rows (bucket padding removed).

  tokens_BN[i, :lengths_B[i]] are the sampled ids (a stop id, when hit, is included and is
  the last one); later columns hold pad_id. logp_BN is 0 past lengths_B.
  """
  tokens_BN: np.ndarray      # int32 [B, max_new_tokens]
  logp_BN: np.ndarray        # float32 [B, max_new_tokens]
  lengths_B: np.ndarray      # int32 number of sampled tokens per row
  stopped_B: np.ndarray      # bool, the row ended on one of its stop ids (not on its budget)
  num_steps: int             # tokens per row the program generated before every row was done


def _top_p_keep(z_BV, top_p):
  """Nucleus of each row without sorting V: keep {p_i >= c}, c the largest with mass >= top_p.

  The kept mass is a step function of c that changes only at the p_i, so the largest valid c
  is one of the p_i: the smallest set of most likely tokens whose mass reaches top_p (ties at
  c kept). Non-negative float32s order like their int32 bit patterns, so bisection over the
  bits finds c exactly in 31 masked sums, ~10x cheaper than a full sort of V on CPU.
  """
  probs_BV = jax.nn.softmax(z_BV, axis=-1)
  as_float = lambda bits_B: jax.lax.bitcast_convert_type(bits_B, jnp.float32)[:, None]

  def step(_, lo_hi):
    lo_B, hi_B = lo_hi              # invariant: mass(lo) >= top_p > mass(hi)
    mid_B = lo_B + (hi_B - lo_B) // 2
    ok_B = jnp.sum(jnp.where(probs_BV >= as_float(mid_B), probs_BV, 0.0), axis=-1) >= top_p
    return jnp.where(ok_B, mid_B, lo_B), jnp.where(ok_B, hi_B, mid_B)

  hi_B = jax.lax.bitcast_convert_type(probs_BV.max(axis=-1), jnp.int32) + 1
  lo_B, _ = jax.lax.fori_loop(0, 31, step, (jnp.zeros_like(hi_B), hi_B))
  return probs_BV >= as_float(lo_B)


def _filter_logits(z_BV, top_p, *, top_k: int, use_top_p: bool):
  """Masks (to -inf) the tokens that top-k and then top-p remove; ties at a cutoff are kept."""
  if top_k <= 0:
    return jnp.where(_top_p_keep(z_BV, top_p), z_BV, -jnp.inf) if use_top_p else z_BV
  sorted_BK = jax.lax.top_k(z_BV, min(top_k, z_BV.shape[-1]))[0]   # descending
  if use_top_p:
    # top-p acts on the top-k-renormalized distribution (HF order: top-k, then top-p). Keep
    # the smallest prefix whose mass reaches top_p: a token stays if the mass before it < p.
    probs_BK = jax.nn.softmax(sorted_BK, axis=-1)
    before_BK = jnp.cumsum(probs_BK, axis=-1) - probs_BK
    n_keep_B = jnp.maximum(jnp.sum(before_BK < top_p, axis=-1), 1)
    cutoff_B = jnp.take_along_axis(sorted_BK, (n_keep_B - 1)[:, None], axis=-1)[:, 0]
  else:
    cutoff_B = sorted_BK[:, -1]
  return jnp.where(z_BV < cutoff_B[:, None], -jnp.inf, z_BV)


def categorical(keys_B, z_BV):
  """One draw per row from softmax(z_BV) (-inf entries are never drawn), by inverse CDF.

  Token j is drawn iff cdf[j-1] < u * total <= cdf[j] with u ~ U(0, 1], so P(j) = p_j
  exactly. One uniform per row instead of Gumbel-max's V of them: ~4x cheaper on CPU for
  V = 49k, where the per-row random bits dominated the sampling step.
  """
  p_BV = jnp.exp(z_BV - jnp.max(z_BV, axis=-1, keepdims=True))
  cdf_BV = jnp.cumsum(p_BV, axis=-1)
  u_B = 1.0 - jax.vmap(jax.random.uniform)(keys_B)           # (0, 1]: u * total > 0
  return jnp.sum(cdf_BV < (u_B * cdf_BV[:, -1])[:, None], axis=-1).astype(jnp.int32)


def entropy_temperature(logits_BV, temperature, adaptive_6, *, eps: float = 1e-6):
  """HAPO's adaptive sampling temperature [B, 1] (arXiv 2509.16591; starriver030515/HAPO).

  adaptive_6 = (tau, signed, m, s, pos_max, neg_min): the strength tau (`temperature_tau`,
  0.05 in the released config), the sign convention, and `trust_region.hapo_entropy_stats`
  of the previous update. With H the entropy of softmax(logits) at this step,
  h = (log max(H, eps) - m) / (s + eps), h_hat = h / pos_max for h > 0 and h / neg_min
  otherwise (h / |neg_min| when signed), clipped to [-1, 1]; the row samples at
  temperature * (1 + tau * h_hat). The released sampler's normalising statistics come from
  outside the function shown in the authors' notes; [INF] here they are the last update's, and
  signed = 1 (low-entropy tokens cool down, as the paper describes) is the default
  (`experiments/shaping/hapo.py`). tau = 0 is the plain temperature.
  """
  tau, signed, m, s, pos_max, neg_min = (adaptive_6[i] for i in range(6))
  z_BV = logits_BV.astype(jnp.float32)
  logp_BV = jax.nn.log_softmax(z_BV, axis=-1)
  h_B1 = -jnp.sum(jnp.exp(logp_BV) * jnp.where(jnp.isfinite(logp_BV), logp_BV, 0.0), axis=-1,
                  keepdims=True)
  h_B1 = (jnp.log(jnp.maximum(h_B1, eps)) - m) / (s + eps)
  neg_scale = jnp.where(signed > 0, -neg_min, neg_min)
  h_hat_B1 = jnp.clip(jnp.where(h_B1 > 0, h_B1 / pos_max, h_B1 / neg_scale), -1.0, 1.0)
  return temperature * (1.0 + tau * h_hat_B1)


def adaptive_params(values):
  """`entropy_temperature`'s float32[6] from 6 numbers, or None; anything else is an error."""
  if values is None:
    return None
  a_6 = np.asarray(values, np.float32)
  if a_6.shape != (6,) or not np.all(np.isfinite(a_6)):
    raise ValueError("adaptive_temperature must be 6 finite floats (tau, signed, m, s, "
                     f"pos_max, neg_min; sampler.entropy_temperature); got {values!r}.")
  if not 0.0 <= a_6[0] < 1.0:
    raise ValueError(f"adaptive_temperature's tau must be in [0, 1) (the temperature ranges "
                     f"over T (1 +- tau)); got {a_6[0]}.")
  return a_6


def sample_tokens(logits_BV, keys_B, greedy_B, temperature, top_p, *, top_k, use_top_p,
                  logp_mode, adaptive_6=None, force_B=None, alternatives: int = 0):
  """One sampling step: (token_B int32, logp_B float32), and with `alternatives` = A > 0 also
  the A most likely tokens and their log-probs ([B, A] each), in the log-prob's terms.

  adaptive_6: None, or `entropy_temperature`'s parameters: each row then samples (and reports
  its log-prob) at its own entropy-adapted temperature.
  force_B: None, or int32 [B]: where >= 0, that token instead of a draw (its log-prob is
  reported as a sampled one's would be).
  """
  if adaptive_6 is not None:
    temperature = entropy_temperature(logits_BV, temperature, adaptive_6)
  z_BV = logits_BV.astype(jnp.float32) / temperature
  filtered_BV = _filter_logits(z_BV, top_p, top_k=top_k, use_top_p=use_top_p)
  sampled_B = categorical(keys_B, filtered_BV)
  tok_B = jnp.where(greedy_B, jnp.argmax(z_BV, axis=-1), sampled_B).astype(jnp.int32)
  if force_B is not None:
    tok_B = jnp.where(force_B >= 0, force_B, tok_B)
  src_BV = z_BV if logp_mode == "tempered" else filtered_BV
  logp_BV = jax.nn.log_softmax(src_BV, axis=-1)
  logp_B = jnp.take_along_axis(logp_BV, tok_B[:, None], axis=-1)[:, 0]
  if not alternatives:
    return tok_B, logp_B
  top_logp_BA, top_BA = jax.lax.top_k(logp_BV, alternatives)
  return tok_B, logp_B, top_BA.astype(jnp.int32), top_logp_BA


def _generate(graphdef, params, prompt_BP, prompt_len_B, max_new_B, stop_BK, greedy_B,
              temperature, top_p, rng, *, num_new, top_k, use_top_p, logp_mode, pad_id,
              cache_dtype, on_trace):
  """The jitted program: prefill, then decode until every row stops or after num_new steps."""
  on_trace()
  model = nnx.merge(graphdef, params)
  B, P = prompt_BP.shape
  row_keys_B = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(B))
  sample = functools.partial(sample_tokens, greedy_B=greedy_B, temperature=temperature, top_p=top_p,
                             top_k=top_k, use_top_p=use_top_p, logp_mode=logp_mode)

  def step_keys(s):
    return jax.vmap(lambda k: jax.random.fold_in(k, s))(row_keys_B)

  def is_stop(tok_B):
    return jnp.any(tok_B[:, None] == stop_BK, axis=-1)

  # Left padding: row i's real tokens occupy columns [P - len_i, P), rotary positions from 0.
  # The prefill writes columns [0, P - 1) and discards its logits (XLA drops the unused
  # [B, P, V] projection); the loop's first step feeds column P - 1, whose logits give
  # response token 0, so prefill never materializes logits for the whole prompt.
  pad_B = P - prompt_len_B
  col_P = jnp.arange(P, dtype=jnp.int32)
  mask_BP = col_P[None, :] >= pad_B[:, None]
  pos_BP = jnp.maximum(col_P[None, :] - pad_B[:, None], 0)
  cache = transformer.init_cache(model.cfg, B, P + num_new, dtype=cache_dtype)
  if P > 1:
    _, cache = model.decode(prompt_BP[:, :-1], pos_BP[:, :-1], mask_BP[:, :-1], cache,
                            jnp.int32(0))

  def cond(carry):
    s, _, _, _, _, _, _, done_B = carry
    return (s < num_new) & ~jnp.all(done_B)

  def body(carry):
    s, cache, feed_B, tokens_BN, logp_BN, lengths_B, stopped_B, done_B = carry
    # Step s feeds the last prompt token (s = 0) or response token s - 1 at cache slot
    # P - 1 + s; its logits predict response token s.
    logits_B1V, cache = model.decode(feed_B[:, None], (prompt_len_B - 1 + s)[:, None],
                                     jnp.ones((B, 1), bool), cache, P - 1 + s)
    new_B, new_logp_B = sample(logits_B1V[:, 0], step_keys(s))
    live_B = ~done_B
    tokens_BN = jax.lax.dynamic_update_slice(
        tokens_BN, jnp.where(live_B, new_B, pad_id)[:, None], (0, s))
    logp_BN = jax.lax.dynamic_update_slice(
        logp_BN, jnp.where(live_B, new_logp_B, 0.)[:, None], (0, s))
    lengths_B = lengths_B + live_B.astype(jnp.int32)
    stopped_B = stopped_B | (live_B & is_stop(new_B))
    done_B = done_B | stopped_B | (lengths_B >= max_new_B)
    return s + 1, cache, new_B, tokens_BN, logp_BN, lengths_B, stopped_B, done_B

  carry = (jnp.int32(0), cache, prompt_BP[:, -1], jnp.full((B, num_new), pad_id, jnp.int32),
           jnp.zeros((B, num_new), jnp.float32), jnp.zeros((B,), jnp.int32),
           jnp.zeros((B,), bool), max_new_B <= 0)
  steps, _, _, tokens_BN, logp_BN, lengths_B, stopped_B, _ = jax.lax.while_loop(
      cond, body, carry)
  return tokens_BN, logp_BN, lengths_B, stopped_B, steps


class Sampler:
  """Compiled sampling programs for one model graph; `generate` is the host entry point.

  Holds one `jax.jit` whose cache is keyed by the bucketed shapes and the static options
  (top_k, top-p on/off, logp_mode), so `num_traces` stays small over a whole run.
  """

  def __init__(self, graphdef, *, pad_id: int, cache_dtype=None, min_batch_bucket: int = 1,
               min_prompt_bucket: int = 16, min_new_bucket: int = 16):
    self.pad_id = int(pad_id)
    self.min_batch_bucket = min_batch_bucket
    self.min_prompt_bucket = min_prompt_bucket
    self.min_new_bucket = min_new_bucket
    self.num_traces = 0
    self._program = jax.jit(functools.partial(
        _generate, graphdef, pad_id=self.pad_id, cache_dtype=cache_dtype,
        on_trace=self._count_trace),
        static_argnames=("num_new", "top_k", "use_top_p", "logp_mode"))

  def _count_trace(self):
    self.num_traces += 1

  def generate(self, params, prompts: Sequence[Sequence[int]], *, rng: jax.Array,
               max_new_tokens: int | Sequence[int], temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, greedy: bool | Sequence[bool] = False,
               stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
               logp_mode: str = "tempered") -> SampleOutput:
    """Samples up to max_new_tokens ids after each prompt.

    Args:
      params: the policy's nnx.State (the graphdef was given at construction).
      prompts: B lists of token ids (unpadded, each non-empty).
      rng: a PRNG key.
      max_new_tokens: one budget for all rows or one per row.
      temperature: > 0; divides the logits before filtering, sampling and log-probs.
      top_k: keep the k largest logits (0 = off).
      top_p: nucleus mass in (0, 1]; 1 = off. Applied after top-k.
      greedy: argmax decoding, for all rows or per row (e.g. a ReMax baseline row).
      stop_ids: ids that end a row (included in its output), shared or one list per row.
      logp_mode: "tempered" or "truncated"; see the module docstring.
    """
    B = len(prompts)
    lens = [len(p) for p in prompts]
    max_new = _per_row("max_new_tokens", max_new_tokens, B, int)
    greedy_rows = _per_row("greedy", greedy, B, bool)
    stops = _stop_rows(stop_ids, B)
    validate_settings(lens, max_new, temperature, top_k, top_p, logp_mode)
    if B == 0:
      empty = np.zeros((0, max(max_new, default=0)), np.int32)
      return SampleOutput(empty, empty.astype(np.float32), np.zeros(0, np.int32),
                          np.zeros(0, bool), 0)

    Bb = bucket(B, self.min_batch_bucket)
    Pb = bucket(max(lens), self.min_prompt_bucket)
    Nb = bucket(max(max(max_new), 1), self.min_new_bucket)
    Kb = bucket(max(len(s) for s in stops))
    # Bucket-padding rows are one pad token long (so attention has a valid key) with budget 0.
    # Explicit transfer, so experiments may run under jax_transfer_guard="disallow".
    inputs = jax.device_put((
        _left_pad(prompts, Bb, Pb, self.pad_id), _pad(lens, Bb, 1), _pad(max_new, Bb, 0),
        _left_pad(stops, Bb, Kb, -1),
        _pad(greedy_rows, Bb, False, bool), np.float32(temperature), np.float32(top_p)))
    out = self._program(params, *inputs, rng, num_new=Nb, top_k=int(top_k),
                        use_top_p=top_p < 1.0, logp_mode=logp_mode)
    tokens_BN, logp_BN, lengths_B, stopped_B, steps = jax.device_get(out)
    n = max(max_new)
    return SampleOutput(tokens_BN[:B, :n], logp_BN[:B, :n], lengths_B[:B], stopped_B[:B],
                        int(steps))


@functools.lru_cache(maxsize=8)
def _shared_sampler(graphdef, pad_id: int, cache_dtype) -> Sampler:
  return Sampler(graphdef, pad_id=pad_id, cache_dtype=cache_dtype)


def generate(graphdef, params, prompts: Sequence[Sequence[int]], *, pad_id: int,
             cache_dtype=None, **kwargs) -> SampleOutput:
  """Functional form of `Sampler.generate`; reuses one Sampler per (graphdef, pad_id)."""
  return _shared_sampler(graphdef, int(pad_id), cache_dtype).generate(params, prompts, **kwargs)


def _per_row(name, value, B, cast):
  if isinstance(value, (int, bool, np.integer, np.bool_)):
    return [cast(value)] * B
  values = [cast(v) for v in value]
  if len(values) != B:
    raise ValueError(f"{name} has {len(values)} entries but there are {B} prompts; pass one "
                     "value for all rows or one per prompt.")
  return values


def _stop_rows(stop_ids, B):
  stop_ids = list(stop_ids)
  if stop_ids and not isinstance(stop_ids[0], (int, np.integer)):
    rows = [[int(t) for t in row] for row in stop_ids]
    if len(rows) != B:
      raise ValueError(f"stop_ids has {len(rows)} rows but there are {B} prompts; pass one "
                       "flat list of ids for all rows or one list per prompt.")
    return rows
  return [[int(t) for t in stop_ids]] * B


def validate_settings(lens, max_new, temperature, top_k, top_p, logp_mode):
  """Raises ValueError naming the first bad prompt length or sampling setting."""
  for i, n in enumerate(lens):
    if n == 0:
      raise ValueError(f"prompt {i} is empty; sampling needs at least one token (e.g. BOS).")
  if any(n < 0 for n in max_new):
    raise ValueError(f"max_new_tokens must be >= 0, got {min(max_new)}.")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}; use greedy=True for argmax.")
  if top_k < 0:
    raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}.")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {top_p}.")
  if logp_mode not in LOGP_MODES:
    raise ValueError(f"Unknown logp_mode {logp_mode!r}; expected one of {LOGP_MODES}.")


def _left_pad(rows, n, width, fill):
  out = np.full((n, width), fill, np.int32)
  for i, row in enumerate(rows):
    out[i, width - len(row):] = row
  return out


def _pad(values, n, fill, dtype=np.int32):
  out = np.full((n,), fill, dtype)
  out[:len(values)] = values
  return out
