# pylint: disable=invalid-name
"""A bounded per-prompt replay buffer of scored trajectories: host-side, fixed-shape, exact.

The buffer holds up to C trajectories of T tokens in fixed-shape numpy arrays (one slot per
row), so it is a plain pytree of arrays: `loop.run(host_state=Holder(empty(C, T)))` saves it
in each checkpoint's tree and restores it on resume (the empty buffer's shapes are the
template), so a resumed run sees it bit for bit. Every function is pure:
it returns a new Buffer and leaves its argument untouched. Sampling takes an integer seed
(derive it from the run's seed and step), so it replays exactly after a resume.

Each stored row keeps what an off-policy loss needs: token ids, the input and loss masks,
the behaviour (sampler) log-probs per token, the outcome reward, the policy version that
sampled it (updates applied, as `Batch.version_B`) and the prompt key (an int32: a data
stream index, or `prompt_key(text)`). A FIFO history of the most recent rewards (every added
row, stored or not) gives SPEAR's percentile baseline (`baseline`).

Bounds. `add` stores a row in a free slot unless its prompt already holds `per_prompt_cap`
rows or the buffer is full; then it evicts within the prompt, or globally, by `evict`:
  "oldest"         the row added first (FIFO; ARPO's per-task buffer [INF: FIFO]).
  "lowest_reward"  the lowest reward, oldest among ties; a new row whose reward is below
                   that victim's is dropped instead, so the buffer keeps the best rows.
`evict_stale` drops rows sampled more than `max_age` versions ago (SPEAR's
`trajectory_tolerate_steps`, default 10).

ARPO (Lu et al. 2025, arXiv 2505.16282): `arpo_plan` picks, for each group with no success, a
stored success of its prompt and the row it replaces; `splice` writes those rows into the
host batch arrays, behaviour log-probs and version included, so the loss's ratio for a
replayed row is π_θ / π_old(stored). The math and sources: docs/algorithms.md §16.

Into a training batch: `splice_batch` (ARPO: stored rows in place of sampled ones) and
`append_batch` (SPEAR: stored rows after the sampled ones) write stored rows into a host
`types.Batch`, their behaviour log-probs in `sampler_logp_BT` and the rows whose π_old the
score step must keep in `aux["keep_logp_B"]`; `keep_stored_logp` applies that mask to the
score step's output (`stored_logp_score` wraps a score step with it).
"""
import hashlib

import flax
import jax
import jax.numpy as jnp
import numpy as np

from agentrl import types

EVICT = ("oldest", "lowest_reward")


@flax.struct.dataclass
class Buffer:
  """C slots of T tokens; a slot is live where `filled_C`. Scalars are 0-d int32 arrays."""
  tokens_CT: np.ndarray        # int32 token ids
  input_mask_CT: np.ndarray    # bool, real tokens
  loss_mask_CT: np.ndarray     # float32, policy-sampled tokens
  old_logp_CT: np.ndarray      # float32 behaviour (sampler) log-probs
  reward_C: np.ndarray         # float32 outcome reward
  version_C: np.ndarray        # int32 policy version that sampled the row
  prompt_C: np.ndarray         # int32 prompt key
  order_C: np.ndarray          # int32 insertion number (larger = newer)
  filled_C: np.ndarray         # bool
  next_order: np.ndarray       # int32 scalar: the next insertion number
  recent_reward_H: np.ndarray  # float32 FIFO of the last H added rewards
  recent_n: np.ndarray         # int32 scalar: rewards ever added to the history


class Holder:
  """The run's buffer as a `loop.HostState` (`loop.run(host_state=holder)`).

  The rollout or advantage code reads `holder.buffer` and assigns the new one; the loop saves
  it with each checkpoint and puts the restored one back on resume.
  """

  def __init__(self, buffer: Buffer):
    self.buffer = buffer

  def tree(self) -> Buffer:
    return self.buffer

  def restore(self, tree: Buffer) -> None:
    self.buffer = tree


def empty(capacity: int, seq_len: int, *, history: int = 1) -> Buffer:
  """An empty buffer of `capacity` slots of `seq_len` tokens and a `history`-reward FIFO."""
  if capacity < 1 or seq_len < 1 or history < 1:
    raise ValueError(f"capacity, seq_len and history must be >= 1; got {capacity}, {seq_len}, "
                     f"{history}.")
  c, t = capacity, seq_len
  return Buffer(
      tokens_CT=np.zeros((c, t), np.int32), input_mask_CT=np.zeros((c, t), bool),
      loss_mask_CT=np.zeros((c, t), np.float32), old_logp_CT=np.zeros((c, t), np.float32),
      reward_C=np.zeros((c,), np.float32), version_C=np.zeros((c,), np.int32),
      prompt_C=np.zeros((c,), np.int32), order_C=np.zeros((c,), np.int32),
      filled_C=np.zeros((c,), bool), next_order=np.zeros((), np.int32),
      recent_reward_H=np.zeros((history,), np.float32), recent_n=np.zeros((), np.int32))


def prompt_key(text: str) -> int:
  """A stable 31-bit key for a prompt's text (blake2b), for prompts without an index."""
  return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") >> 1


def size(buf: Buffer) -> int:
  return int(buf.filled_C.sum())


def _copy(buf: Buffer) -> dict[str, np.ndarray]:
  return {f.name: np.array(getattr(buf, f.name)) for f in buf.__dataclass_fields__.values()}


def _victim(a: dict, candidates_C: np.ndarray, evict: str) -> int:
  """The slot to evict among `candidates_C` (bool): FIFO, or lowest reward then oldest."""
  idx = np.flatnonzero(candidates_C)
  if evict == "oldest":
    return int(idx[np.argmin(a["order_C"][idx])])
  # lexsort: last key is primary; lowest reward first, then oldest.
  return int(idx[np.lexsort((a["order_C"][idx], a["reward_C"][idx]))[0]])


def add(buf: Buffer, *, prompt_B, tokens_BT, input_mask_BT, loss_mask_BT, old_logp_BT,
        reward_B, version: int, keep_B=None, per_prompt_cap: int,
        evict: str = "oldest") -> Buffer:
  """Records every row's reward in the history and stores the rows where `keep_B`.

  Args:
    buf: the buffer.
    prompt_B: int prompt keys [B]. tokens_BT, input_mask_BT, loss_mask_BT, old_logp_BT: the
      scored batch's rows [B, T] (T = the buffer's length). reward_B: outcome rewards [B].
    version: the policy version that sampled these rows.
    keep_B: bool [B], which rows to store (None: all), e.g. successes (ARPO) or advantage
      above a threshold (SPEAR).
    per_prompt_cap: the most rows one prompt may hold.
    evict: "oldest" or "lowest_reward" (module docstring).

  Returns:
    The new buffer.
  """
  if evict not in EVICT:
    raise ValueError(f"evict={evict!r} must be one of {EVICT}.")
  if per_prompt_cap < 1:
    raise ValueError(f"per_prompt_cap must be >= 1; got {per_prompt_cap}.")
  t = buf.tokens_CT.shape[1]
  tokens_BT = np.asarray(tokens_BT)
  if tokens_BT.ndim != 2 or tokens_BT.shape[1] != t:
    raise ValueError(f"tokens_BT must be [B, {t}] (the buffer's length); got {tokens_BT.shape}.")
  reward_B = np.asarray(reward_B, np.float32)
  b = tokens_BT.shape[0]
  keep_B = np.ones((b,), bool) if keep_B is None else np.asarray(keep_B, bool)
  a = _copy(buf)
  h = a["recent_reward_H"].shape[0]
  for r in reward_B:
    a["recent_reward_H"][int(a["recent_n"]) % h] = r
    a["recent_n"] = np.asarray(a["recent_n"] + 1, np.int32)
  rows = {"tokens_CT": tokens_BT, "input_mask_CT": np.asarray(input_mask_BT),
          "loss_mask_CT": np.asarray(loss_mask_BT), "old_logp_CT": np.asarray(old_logp_BT)}
  for i in np.flatnonzero(keep_B):
    prompt = int(prompt_B[i])
    same_C = a["filled_C"] & (a["prompt_C"] == prompt)
    if same_C.sum() >= per_prompt_cap:
      slot = _victim(a, same_C, evict)
    elif not a["filled_C"].all():
      slot = int(np.flatnonzero(~a["filled_C"])[0])
    else:
      slot = _victim(a, a["filled_C"], evict)
    if a["filled_C"][slot] and evict == "lowest_reward" and reward_B[i] < a["reward_C"][slot]:
      continue
    for name, x in rows.items():
      a[name][slot] = x[i]
    a["reward_C"][slot] = reward_B[i]
    a["version_C"][slot] = version
    a["prompt_C"][slot] = prompt
    a["order_C"][slot] = a["next_order"]
    a["filled_C"][slot] = True
    a["next_order"] = np.asarray(a["next_order"] + 1, np.int32)
  return Buffer(**a)


def evict_stale(buf: Buffer, *, version: int, max_age: int) -> Buffer:
  """Drops rows with version − version_C >= max_age (SPEAR keeps a delay below tolerance)."""
  a = _copy(buf)
  a["filled_C"] &= (version - a["version_C"]) < max_age
  return Buffer(**a)


def slots(buf: Buffer, prompt: int, *, min_reward: float = -np.inf,
          k: int | None = None) -> np.ndarray:
  """The live slots of `prompt` with reward > min_reward, newest first, at most k."""
  live_C = buf.filled_C & (buf.prompt_C == prompt) & (buf.reward_C > min_reward)
  idx = np.flatnonzero(live_C)
  return idx[np.argsort(-buf.order_C[idx], kind="stable")][:k]


def sample(buf: Buffer, n: int, *, seed: int, min_reward: float = -np.inf) -> np.ndarray:
  """Up to n distinct live slots with reward > min_reward, uniformly, deterministic in seed."""
  idx = np.flatnonzero(buf.filled_C & (buf.reward_C > min_reward))
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(idx, size=min(n, idx.size), replace=False))


def rows(buf: Buffer, slots_S: np.ndarray) -> dict[str, np.ndarray]:
  """The stored rows at `slots_S` as [S, ...] arrays keyed like a Batch's fields."""
  return {"tokens_BT": buf.tokens_CT[slots_S], "input_mask_BT": buf.input_mask_CT[slots_S],
          "loss_mask_BT": buf.loss_mask_CT[slots_S], "old_logp_BT": buf.old_logp_CT[slots_S],
          "reward_B": buf.reward_C[slots_S], "version_B": buf.version_C[slots_S],
          "prompt_B": buf.prompt_C[slots_S]}


def baseline(buf: Buffer, *, percentile: float = 50.0) -> float:
  """The percentile of the recent rewards (SPEAR's recalibration baseline; 50 = median)."""
  n = min(int(buf.recent_n), buf.recent_reward_H.shape[0])
  if n == 0:
    raise ValueError("baseline needs at least one recorded reward; add a batch first.")
  return float(np.percentile(buf.recent_reward_H[:n], percentile))


def arpo_plan(buf: Buffer, reward_B, prompt_P, *, group_size: int, seed: int,
              success: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
  """ARPO's replay of rare successes: which stored row replaces which row of each group.

  A group (prompt p, rows p·G .. p·G + G − 1) with no reward > `success` gets the newest
  stored success of its prompt in place of one of its rows, chosen uniformly with `seed`
  [INF: which row]. Returns (slot_P, row_P): the buffer slot and batch row per group, −1 for
  a group left as sampled (it has a success, or its prompt has none stored).
  """
  reward_PG = np.asarray(reward_B, np.float32).reshape(-1, group_size)
  rng = np.random.default_rng(seed)
  pick_P = rng.integers(0, group_size, size=reward_PG.shape[0])
  slot_P = np.full((reward_PG.shape[0],), -1, np.int32)
  row_P = np.full((reward_PG.shape[0],), -1, np.int32)
  for p, prompt in enumerate(np.asarray(prompt_P)):
    if (reward_PG[p] > success).any():
      continue
    found = slots(buf, int(prompt), min_reward=success, k=1)
    if found.size:
      slot_P[p], row_P[p] = found[0], p * group_size + pick_P[p]
  return slot_P, row_P


def splice(batch: dict[str, np.ndarray], buf: Buffer, slot_P: np.ndarray, row_P: np.ndarray,
           *, keep_stored_logp: bool = True) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """Writes the planned stored rows into copies of the host batch arrays.

  `batch` holds [B, ...] numpy arrays under `rows`' keys (those present are replaced).
  With `keep_stored_logp` the replayed rows carry their stored behaviour log-probs, so the
  ratio is π_θ / π_old(stored) and the score step must not overwrite `old_logp_BT` there;
  without it `old_logp_BT` is left for the score step to recompute, as the ARPO authors'
  verl trainer does for every row (the ratio then starts at 1). Returns (batch, replayed_B).
  """
  out = {k: np.array(v) for k, v in batch.items()}
  replayed_B = np.zeros((next(iter(out.values())).shape[0],), bool)
  use = slot_P >= 0
  stored = rows(buf, slot_P[use])
  for name, x in stored.items():
    if name in out and (keep_stored_logp or name != "old_logp_BT"):
      out[name][row_P[use]] = x
  replayed_B[row_P[use]] = True
  return out, replayed_B


# A stored row's fields in a `types.Batch`: its behaviour log-probs become the batch's sampler
# log-probs (what `keep_stored_logp` keeps), the rest keep their names.
_BATCH_FIELDS = {"tokens_BT": "tokens_BT", "input_mask_BT": "input_mask_BT",
                 "loss_mask_BT": "loss_mask_BT", "old_logp_BT": "sampler_logp_BT",
                 "reward_B": "reward_B", "version_B": "version_B"}


def positions(input_mask_BT: np.ndarray) -> np.ndarray:
  """Rotary positions of right-padded rows: 0 at the first token, 0 on padding (as `pack`)."""
  mask = np.asarray(input_mask_BT, bool)
  return np.where(mask, np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)


def splice_batch(batch: types.Batch, buf: Buffer, slot_P: np.ndarray, row_P: np.ndarray, *,
                 keep_stored_logp: bool = True) -> tuple[types.Batch, np.ndarray]:
  """ARPO's splice on a host Batch (numpy fields; `version_B` set): (batch, replayed_B).

  The planned stored rows (`arpo_plan`) replace rows of `batch`: tokens, masks, reward,
  version, positions, and the stored behaviour log-probs in `sampler_logp_BT`; `turn_BT` on
  a replayed row is 0 on its real tokens (the buffer keeps no turns). With
  `keep_stored_logp`, `aux["keep_logp_B"]` (float32) marks the replayed rows, whose π_old the
  score function then keeps (the function `keep_stored_logp`: ratio π_θ / π_old(stored));
  without it the mask is 0 and every row's π_old is the score step's recompute (the ARPO
  authors' trainer).
  """
  fields = {b: np.asarray(getattr(batch, b)) for b in _BATCH_FIELDS.values()}
  spliced, replayed_B = splice({k: fields[v] for k, v in _BATCH_FIELDS.items()}, buf,
                               slot_P, row_P)
  out = {v: spliced[k] for k, v in _BATCH_FIELDS.items()}
  turn_BT = np.array(batch.turn_BT)
  turn_BT[replayed_B] = np.where(out["input_mask_BT"][replayed_B], 0, -1)
  keep_B = (replayed_B & keep_stored_logp).astype(np.float32)
  aux = dict(batch.aux or {}, keep_logp_B=keep_B)
  return batch.replace(**out, positions_BT=positions(out["input_mask_BT"]), turn_BT=turn_BT,
                       truncated_B=np.where(replayed_B, False, batch.truncated_B),
                       aux=aux), replayed_B


def append_batch(batch: types.Batch, buf: Buffer, slots_S: np.ndarray, rows_R: int,
                 **aux_R: np.ndarray) -> types.Batch:
  """SPEAR's replay rows after a host Batch's B rows (numpy; `version_B` set): B + rows_R rows.

  The first len(slots_S) <= rows_R appended rows are the stored rows at `slots_S` (their
  π_old kept: `aux["keep_logp_B"]` = 1); the rest repeat row 0 with a zero loss mask, so the
  batch keeps one shape whatever the buffer holds. `aux_R` are per-appended-row arrays [R]
  (the sampled rows get 0), e.g. the replayed rows' advantages; `aux["replay_B"]` marks the
  live appended rows.
  """
  s = len(slots_S)
  if s > rows_R:
    raise ValueError(f"{s} slots do not fit in rows_R={rows_R} appended rows.")
  stored = rows(buf, np.asarray(slots_S, np.int64))
  b = batch.tokens_BT.shape[0]
  pad = np.zeros((rows_R - s,), np.int64)

  def extend(name, tail):
    head = np.asarray(getattr(batch, name))
    filler = head[pad]
    if name == "loss_mask_BT":
      filler = np.zeros_like(filler)
    return np.concatenate([head, np.asarray(tail, head.dtype), filler])

  out = {v: extend(v, stored[k]) for k, v in _BATCH_FIELDS.items()}
  live_R = np.arange(rows_R) < s
  out["positions_BT"] = extend("positions_BT", positions(stored["input_mask_BT"]))
  out["turn_BT"] = extend("turn_BT", np.where(stored["input_mask_BT"], 0, -1))
  out["truncated_B"] = extend("truncated_B", np.zeros((s,), bool))
  tail = lambda x_R: np.concatenate([np.zeros((b,), np.float32), np.asarray(x_R, np.float32)])
  aux = {k: np.concatenate([np.asarray(v), np.zeros((rows_R,), np.asarray(v).dtype)])
         for k, v in (batch.aux or {}).items()}
  aux.update({k: tail(v) for k, v in aux_R.items()})
  aux["keep_logp_B"], aux["replay_B"] = tail(live_R), tail(live_R)
  return batch.replace(**out, aux=aux)


def keep_stored_logp(scored: types.Batch) -> types.Batch:
  """The score step's output with π_old = the stored log-probs on the rows of
  `aux["keep_logp_B"]` (`splice_batch`, `append_batch`): their ratio is π_θ / π_old(stored),
  not the recomputed 1. Pure jnp; call it inside the jitted score function."""
  keep_B1 = jax.lax.stop_gradient(scored.aux["keep_logp_B"])[:, None] > 0
  return scored.replace(old_logp_BT=jnp.where(keep_B1, scored.sampler_logp_BT,
                                              scored.old_logp_BT))


def stored_logp_score(score_step):
  """score_fn(params, batch) for `loop.run` from a `loop.make_score_step` without a reference:
  the learner's π_old for every row, then `keep_stored_logp`. Jit it in the experiment."""

  def score_fn(params, batch: types.Batch):
    scored, metrics = score_step(params, None, batch)
    return keep_stored_logp(scored), metrics

  return score_fn
