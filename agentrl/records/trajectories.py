"""Trajectory records: what the agent did at a step, token by token, in the run directory.

Every `Settings.every` steps the loop writes, to <workdir>/trajectories/,

  step_%06d.jsonl.gz   a header line, then one JSON line per recorded row in batch order (a
                       sample of the step's groups, a few rows each, chosen best and worst
                       rewarded first), for people and the viewer (scripts/view_trajectories.py)
  batch_%06d.npz       every field of the step's whole training batch, as the update saw it
                       (scored, with advantages), for `--config.replay_batch=RUN_DIR:STEP`

Record steps are 1, 1 + every, 1 + 2 every, ...: step s's rows were sampled by the policy after
s - 1 updates, so they are the rollouts of the policy evaluated at step s - 1 (with
`every = eval.every`, the policy of every evaluation), and step s - 1's checkpoint is the state
a replay starts from. Files are written to a temporary name and renamed (a reader never sees
half a file); the newest `keep` record steps are kept. A resumed run deletes the records of
steps after the checkpoint it resumes from and writes on from there.

A row's JSON object (`read_step` returns them as dicts; every per-token list covers the row's
real tokens, prompt included, in order):

  row, group, sample    index in the batch; the group (prompt) it belongs to; index in it
  parent, fork_at       branching: the row it continues and the tokens shared with it (-1, 0
                        for a root)
  version               updates applied to the policy that sampled it
  reward, success, done, truncated, turn_rewards, infos
                        the episode's outcome, per env step rewards and infos (JSON-safe)
  tokens, pieces        token ids and each token's text (`pieces` joined is the row's text;
                        null when the rollout carried no tokenizer)
  role                  per token: "prompt" (the first prompt), "model" (sampled, trained or
                        not), "env" (what the environment or the chat template added:
                        observations, tool results, role headers)
  turn                  per token: the turn index (-1 on the first prompt)
  turns                 [{index, role, start, end, text}]: the maximal runs of one (turn, role)
  loss_mask             per token 0/1: the tokens the loss trains
  sampler_logp, logp    per token: the sampler's log-prob and the trainer's (pi_old) one
  adv, entropy, ref_logp, value, ret
                        per token, when the batch has them: advantage, entropy of pi_old,
                        reference log-prob, critic value and return
Floats are rounded to 5 significant decimals; NaN and inf become null.
"""
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import glob
import gzip
import json
import math
import os
import re
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np

from agentrl import types

DIRNAME = "trajectories"
FORMAT = "agentrl-trajectories"
VERSION = 1
_STEP_FILE = "step_{:06d}.jsonl.gz"
_BATCH_FILE = "batch_{:06d}.npz"
_STEP_RE = re.compile(r"(?:step|batch)_(\d{6,})\.(?:jsonl\.gz|npz)$")
# Batch fields written per token into a row, under the name the row uses.
TOKEN_FIELDS = {"sampler_logp_BT": "sampler_logp", "old_logp_BT": "logp", "adv_BT": "adv",
                "entropy_BT": "entropy", "ref_logp_BT": "ref_logp", "value_BT": "value",
                "ret_BT": "ret"}


class RecordsError(RuntimeError):
  """Records that are missing or unreadable; the message names the file and what exists."""


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the loop records (config.log.trajectories_*; `every` = 0 records nothing)."""
  every: int = 0
  rows_per_group: int = 4     # rows recorded per group: best and worst rewarded first
  max_groups: int = 16        # groups recorded per step, spread evenly over the batch
  keep: int = 10              # newest record steps kept on disk
  prompts_per_step: int = 0   # groups in the batch: rows [i*G, (i+1)*G) share a prompt, G =
                              # B // prompts_per_step (0, or not a divisor: one row a group)
  full_batch: bool = True     # also write the whole batch (batch_%06d.npz) for replay


def is_record_step(step: int, every: int) -> bool:
  """Whether `step` (1-based) is a record step: 1, 1 + every, 1 + 2 every, ..."""
  return every > 0 and step >= 1 and (step - 1) % every == 0


def directory(run_dir: str) -> str:
  return os.path.join(run_dir, DIRNAME)


def step_path(run_dir: str, step: int) -> str:
  return os.path.join(directory(run_dir), _STEP_FILE.format(step))


def batch_path(run_dir: str, step: int) -> str:
  return os.path.join(directory(run_dir), _BATCH_FILE.format(step))


# ---- Choosing the rows.


def select_rows(reward_B: np.ndarray, real_B: np.ndarray, *, group_size: int,
                rows_per_group: int, max_groups: int) -> list[int]:
  """The rows to record, ascending: up to `max_groups` groups holding a real row, spread
  evenly over the batch, and in each up to `rows_per_group` of its real rows taken best,
  worst, second best, second worst, ... by reward (ties by row), so that a group's best and
  worst rewarded rows are among those recorded."""
  B = len(real_B)
  G = max(1, group_size)
  groups = [g for g in range(math.ceil(B / G)) if real_B[g * G:(g + 1) * G].any()]
  if len(groups) > max_groups:
    groups = [groups[i] for i in np.linspace(0, len(groups) - 1, max_groups).round().astype(int)]
  chosen = []
  for g in groups:
    rows = [r for r in range(g * G, min(B, (g + 1) * G)) if real_B[r]]
    ranked = sorted(rows, key=lambda r: (-float(reward_B[r]), r))
    order = [ranked[i // 2] if i % 2 == 0 else ranked[-1 - i // 2] for i in range(len(ranked))]
    seen = []
    for r in order:
      if r not in seen:
        seen.append(r)
    chosen += seen[:rows_per_group]
  return sorted(chosen)


# ---- Text of every token.


def pieces(decode: Callable[[Sequence[int]], str], ids: Sequence[int], *,
           context: int = 4) -> list[str]:
  """Each token's text, such that "".join(pieces) == decode(ids) wherever the tokenizer's
  decoding is prefix-stable.

  A token's text is what it adds to the decoding of the `context` tokens before it (a
  SentencePiece word start keeps its space, a byte-level BPE character split over tokens
  appears whole on the token that completes it), the way streaming detokenizers do; where the
  shorter decoding is not a prefix of the longer one, the token's own decoding is used.
  """
  out = []
  for i in range(len(ids)):
    lo = max(0, i - context)
    after = decode(ids[lo:i + 1])
    if after.endswith("\ufffd"):  # an incomplete character: its bytes come with a later token
      out.append("")
      continue
    before = decode(ids[lo:i]).rstrip("\ufffd")
    out.append(after[len(before):] if after.startswith(before) else decode(ids[i:i + 1]))
  return out


# ---- Building rows.


def _roles(turn: np.ndarray, loss_mask: np.ndarray) -> list[str]:
  return ["prompt" if t < 0 else "model" if m > 0 else "env" for t, m in zip(turn, loss_mask)]


def _turns(turn: np.ndarray, roles: Sequence[str], texts: Sequence[str] | None) -> list[dict]:
  """Maximal runs of one (turn, role), with their text when the pieces are known."""
  runs, start = [], 0
  for i in range(1, len(roles) + 1):
    if i == len(roles) or (turn[i], roles[i]) != (turn[start], roles[start]):
      run = {"index": int(turn[start]), "role": roles[start], "start": start, "end": i}
      if texts is not None:
        run["text"] = "".join(texts[start:i])
      runs.append(run)
      start = i
  return runs


def _floats(x: np.ndarray) -> list[float | None]:
  return [None if not math.isfinite(v) else float(f"{v:.5g}") for v in np.asarray(x, float)]


def json_safe(x: Any) -> Any:
  """`x` with everything JSON cannot hold made readable (numpy scalars and arrays to
  numbers and lists, NaN/inf to null, other objects to their repr)."""
  if isinstance(x, Mapping):
    return {str(k): json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [json_safe(v) for v in x]
  if isinstance(x, np.ndarray):
    return json_safe(x.tolist())
  if isinstance(x, (bool, np.bool_)):
    return bool(x)
  if isinstance(x, (int, np.integer)):
    return int(x)
  if isinstance(x, (float, np.floating)):
    return float(x) if math.isfinite(x) else None
  if x is None or isinstance(x, str):
    return x
  return repr(x)


def make_rows(batch: Mapping[str, np.ndarray], rows: Sequence[int], *, group_size: int,
              trajectories: Sequence[Any] | None = None,
              decode: Callable[[Sequence[int]], str] | None = None) -> list[dict]:
  """The JSON rows of batch rows `rows` (host arrays of a `types.Batch`, by field name).

  `trajectories`: the rollout's host trajectories (agent_loop.Trajectory), one per batch row
  in order, for the episode fields (turn rewards, infos, success, parent); `decode`: the
  tokenizer's decode, for the pieces and the turns' text.
  """
  out = []
  for r in rows:
    n = int(np.asarray(batch["input_mask_BT"][r]).sum())
    tokens = np.asarray(batch["tokens_BT"][r][:n])
    loss_mask = np.asarray(batch["loss_mask_BT"][r][:n])
    turn = (np.asarray(batch["turn_BT"][r][:n]) if batch.get("turn_BT") is not None
            else np.where(loss_mask > 0, 0, -1))
    traj = trajectories[r] if trajectories is not None and r < len(trajectories) else None
    # The sampled tokens: the trajectory's own mask where known (a credit method may have
    # masked sampled tokens out of the batch's loss mask).
    sampled = (np.asarray(traj.loss_mask[:n]) if traj is not None and len(traj.loss_mask) >= n
               else loss_mask)
    roles = _roles(turn, sampled)
    texts = pieces(decode, [int(t) for t in tokens]) if decode is not None else None
    row = {"row": int(r), "group": int(r // group_size), "sample": int(r % group_size),
           "parent": -1, "fork_at": 0, "version": None, "reward": None, "success": None,
           "done": None, "truncated": None, "turn_rewards": None, "infos": None}
    if batch.get("version_B") is not None:
      row["version"] = int(batch["version_B"][r])
    if batch.get("reward_B") is not None:
      row["reward"] = _floats(batch["reward_B"][r:r + 1])[0]
    if batch.get("truncated_B") is not None:
      row["truncated"] = bool(batch["truncated_B"][r])
    if traj is not None:
      row.update(parent=int(traj.parent), fork_at=int(traj.fork_at), done=bool(traj.done),
                 truncated=bool(traj.truncated), turn_rewards=_floats(traj.turn_rewards),
                 infos=json_safe(list(traj.infos)),
                 success=any(bool(i.get("success")) for i in traj.infos))
    row.update(length=n, tokens=tokens.tolist(), pieces=texts, role=roles,
               turn=turn.astype(int).tolist(), turns=_turns(turn, roles, texts),
               loss_mask=(loss_mask > 0).astype(int).tolist())
    for field, name in TOKEN_FIELDS.items():
      if batch.get(field) is not None:
        row[name] = _floats(np.asarray(batch[field][r][:n]))
    out.append(row)
  return out


# ---- Writing and reading.


def write_step(run_dir: str, step: int, rows: Sequence[dict], header: Mapping[str, Any], *,
               batch: Mapping[str, np.ndarray] | None = None, keep: int = 10) -> str:
  """Writes step `step`'s records (and with `batch` its whole batch) atomically, then deletes
  all but the newest `keep` record steps; returns the JSONL path."""
  os.makedirs(directory(run_dir), exist_ok=True)
  path = step_path(run_dir, step)
  head = {"format": FORMAT, "version": VERSION, "step": int(step), "rows": len(rows),
          **json_safe(dict(header))}
  tmp = path + ".tmp"
  with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as f:
    f.write(json.dumps(head, allow_nan=False) + "\n")
    for row in rows:
      f.write(json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n")
  os.replace(tmp, path)
  if batch is not None:
    bpath = batch_path(run_dir, step)
    with open(bpath + ".tmp", "wb") as f:
      np.savez_compressed(f, **{k: np.asarray(v) for k, v in batch.items() if v is not None})
    os.replace(bpath + ".tmp", bpath)
  for old in steps(run_dir)[:-keep] if keep > 0 else []:
    _remove(run_dir, old)
  return path


def _remove(run_dir: str, step: int) -> None:
  for path in (step_path(run_dir, step), batch_path(run_dir, step)):
    if os.path.exists(path):
      os.remove(path)


def truncate(run_dir: str, after_step: int) -> None:
  """Deletes the records of steps after `after_step` (a resumed run rewrites them)."""
  for step in steps(run_dir) + batch_steps(run_dir):
    if step > after_step:
      _remove(run_dir, step)
  for tmp in glob.glob(os.path.join(directory(run_dir), "*.tmp")):
    os.remove(tmp)


def _steps(run_dir: str, suffix: str) -> list[int]:
  found = []
  for path in glob.glob(os.path.join(directory(run_dir), f"*{suffix}")):
    match = _STEP_RE.search(os.path.basename(path))
    if match:
      found.append(int(match.group(1)))
  return sorted(set(found))


def steps(run_dir: str) -> list[int]:
  """The steps with trajectory records (step_%06d.jsonl.gz), ascending."""
  return _steps(run_dir, ".jsonl.gz")


def batch_steps(run_dir: str) -> list[int]:
  """The steps whose whole batch was written (batch_%06d.npz), ascending."""
  return _steps(run_dir, ".npz")


def read_step(run_dir: str, step: int | None = None) -> tuple[dict, list[dict]]:
  """(header, rows) of step `step`'s records (None: the newest); RecordsError if absent."""
  have = steps(run_dir)
  if step is None and have:
    step = have[-1]
  if step is None or step not in have:
    raise RecordsError(f"no trajectory records of step {step} in {directory(run_dir)}; "
                       f"recorded steps: {have or 'none'} (config.log.trajectories_every sets "
                       "how often a run records)")
  path = step_path(run_dir, step)
  try:
    with gzip.open(path, "rt", encoding="utf-8") as f:
      lines = [json.loads(line) for line in f if line.strip()]
  except (OSError, EOFError, ValueError) as e:
    raise RecordsError(f"{path} cannot be read ({e})") from None
  if not lines or lines[0].get("format") != FORMAT:
    raise RecordsError(f"{path} is not an agentrl trajectory record (no {FORMAT} header)")
  return lines[0], lines[1:]


def read_batch(run_dir: str, step: int) -> dict[str, np.ndarray]:
  """Step `step`'s whole batch by field name (`aux/<name>` for Batch.aux entries)."""
  path = batch_path(run_dir, step)
  if not os.path.exists(path):
    raise RecordsError(f"no recorded batch of step {step} in {directory(run_dir)}; steps "
                       f"with a batch: {batch_steps(run_dir) or 'none'}")
  with np.load(path) as npz:
    return {k: npz[k] for k in npz.files}


# ---- From the loop's device batch.


def host_batch(batch: Any) -> dict[str, np.ndarray]:
  """A `types.Batch`'s fields as host arrays by name (`aux/<name>` for its aux entries; None
  fields left out), gathered from every process of a multi-host run."""
  arrays = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)
            if f.name != "aux" and getattr(batch, f.name) is not None}
  arrays.update({f"aux/{k}": v for k, v in (batch.aux or {}).items()})
  if jax.process_count() > 1:
    arrays = multihost_utils.process_allgather(arrays, tiled=True)
  return {k: np.asarray(v) for k, v in jax.device_get(arrays).items()}


def to_batch(arrays: Mapping[str, np.ndarray]) -> types.Batch:
  """The `types.Batch` of `host_batch`'s arrays (on the default device)."""
  names = {f.name for f in dataclasses.fields(types.Batch)}
  unknown = sorted(k for k in arrays if k not in names and not k.startswith("aux/"))
  if unknown:
    raise RecordsError(f"recorded batch fields {unknown} are not types.Batch fields")
  fields = {k: jax.device_put(v) for k, v in arrays.items() if not k.startswith("aux/")}
  aux = {k[4:]: jax.device_put(v) for k, v in arrays.items() if k.startswith("aux/")}
  return types.Batch(**fields, aux=aux or None)


def record(run_dir: str, step: int, batch: Any, *, settings: Settings,
           trajectories: Sequence[Any] | None = None, tokenizer: Any = None,
           metrics: Mapping[str, Any] | None = None) -> str:
  """Writes step `step`'s records from its scored device batch (every process calls it; the
  first one writes); returns the JSONL path ("" on other processes).

  `trajectories` (one per batch row, in order) and `tokenizer` are the rollout's
  (`collect.Rollout`); rows past the end of `trajectories` are padding and not recorded.
  """
  arrays = host_batch(batch)
  if jax.process_index() != 0:
    return ""
  real_B = arrays["input_mask_BT"].any(axis=1)
  if trajectories is not None:  # rows past the rollout's trajectories pad the batch
    real_B[len(trajectories):] = False
  B, P = len(real_B), settings.prompts_per_step
  group_size = B // P if P and B % P == 0 else 1
  reward_B = arrays.get("reward_B", np.zeros(B, np.float32))
  rows = select_rows(reward_B, real_B, group_size=group_size,
                     rows_per_group=settings.rows_per_group, max_groups=settings.max_groups)
  decode = tokenizer.decode if tokenizer is not None else None
  made = make_rows(arrays, rows, group_size=group_size, trajectories=trajectories,
                   decode=decode)
  header = {"rows_in_batch": B, "group_size": group_size,
            "fields": sorted(TOKEN_FIELDS[f] for f in TOKEN_FIELDS if f in arrays),
            "metrics": dict(metrics or {})}
  return write_step(run_dir, step, made, header,
                    batch=arrays if settings.full_batch else None, keep=settings.keep)
