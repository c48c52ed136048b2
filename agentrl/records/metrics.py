"""Per-step metrics: JSONL, TensorBoard event files, optional Weights & Biases, console lines.

One flat dict of scalars per step goes to every sink through `Writer.write(step, scalars)`.
The JSONL file (`<workdir>/metrics.jsonl`, one `{"step": s, ...}` object per line) is the
record that tests and plots read; TensorBoard files come from tensorboardX (no TensorFlow);
Weights & Biases is imported only when a project is configured.

Resuming: `Writer(workdir, ..., resume_step=s)` drops JSONL records after step s (they belong
to the killed run's unsaved steps, which the resumed run recomputes) and starts TensorBoard
with `purge_step=s + 1`, so the files read exactly as if the run had never stopped.

Well-known keys, shown on the console line when present: reward, success (the rollout's
sampled success, at the sampling temperature), eval/success (held-out greedy success), kl,
entropy, clipfrac, rollout/turn_cut_frac, and the phase times with their throughputs:
time/rollout (rollout/tokens_per_s: sampled tokens per second of rollout), time/score,
time/update (update/tokens_per_s: real, non-padding tokens trained on per second of update),
which sum to time/step; time/eval is an evaluation's time, outside the step.
"""
from collections.abc import Iterator, Mapping, Sequence
import contextlib
import json
import math
import os
import sys
import threading
import time
from typing import Any

import numpy as np

JSONL = "metrics.jsonl"

# (key, console label, format) for the progress line, in display order.
_CONSOLE = (
    ("reward", "reward", "{:.3f}"),
    ("success", "sampled success", "{:.1%}"),
    ("eval/success", "held-out greedy success", "{:.1%}"),
    ("eval/valid_turns", "valid turns", "{:.0%}"),
    ("eval/turns", "turns", "{:.2f}"),
    ("kl", "kl", "{:.2e}"),
    ("entropy", "ent", "{:.3f}"),
    ("clipfrac", "clip", "{:.3f}"),
    ("rollout/turn_cut_frac", "cut", "{:.0%}"),
)
# (phase time key, its throughput key or None): the phases of a step, which sum to time/step.
_PHASES = (("time/rollout", "rollout/tokens_per_s"), ("time/score", None),
           ("time/update", "update/tokens_per_s"))

# Keys whose values depend on wall time; everything else in a run's records is reproducible.
TIMING_KEYS = ("time/rollout", "time/score", "time/update", "time/step", "time/eval",
               "time/rollout_busy", "rollout/tokens_per_s", "update/tokens_per_s")



def to_python(value: Any) -> float | int | None:
  """A JSON-able Python scalar; non-finite floats become None (JSON has no NaN)."""
  value = np.asarray(value)
  if value.size != 1:
    raise ValueError(f"metric values must be scalars, got shape {value.shape}")
  value = value.reshape(()).item()
  if isinstance(value, bool):
    return int(value)
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """All records of a metrics JSONL file (a torn last line from a killed run is skipped)."""
  records = []
  with open(path) as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue  # only a killed writer's unterminated final line can fail to parse
  return records


def _truncate_jsonl(path: str, last_step: int) -> None:
  if not os.path.exists(path):
    return
  kept = [r for r in read_jsonl(path) if r.get("step", -1) <= last_step]
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in kept)
  os.replace(tmp, path)  # atomic: a kill here leaves either the old or the new file


def merge_phases(**sources: Mapping[str, float]) -> dict[str, float]:
  """One flat record from the phases' metrics; a name two phases both log is an error.

  A silent overwrite would make one name mean two things (e.g. a loss logging the in-update
  KL as `kl` over the score step's KL(pi_old || pi_ref)); give the second quantity its own
  name instead (`kl_loss`).
  """
  record, owner = {}, {}
  for source, metrics in sources.items():
    for key, value in metrics.items():
      if key in owner:
        raise ValueError(f"metric {key!r} is logged by both the {owner[key]} and the {source} "
                         "phase; rename one (one name, one meaning: see docs/metrics.md)")
      record[key], owner[key] = value, source
  return record


def progress_line(step: int, total_steps: int, scalars: Mapping[str, Any],
                  note: str = "") -> str:
  """'step 3/150 | reward 0.420 | ... | rollout 0.51s (9,000 tok/s) + score ... = step 0.9s'.

  `note` is appended in parentheses (e.g. that the step includes compilation).
  """
  parts = [f"step {step}/{total_steps}"]
  for key, label, fmt in _CONSOLE:
    value = scalars.get(key)
    if value is not None:
      parts.append(f"{label} {fmt.format(value)}")
  phases = []
  for key, rate in _PHASES:
    if scalars.get(key) is not None:
      speed = f" ({scalars[rate]:,.0f} tok/s)" if scalars.get(rate) else ""
      phases.append(f"{key.split('/')[1]} {scalars[key]:.2f}s{speed}")
  if phases:
    total = (f" = step {scalars['time/step']:.2f}s" if scalars.get("time/step") is not None
             else "")
    parts.append(" + ".join(phases) + total)
  if scalars.get("time/eval") is not None:
    parts.append(f"eval {scalars['time/eval']:.2f}s")
  if scalars.get("skipped"):
    parts.append("SKIPPED (non-finite loss)")
  line = " | ".join(parts)
  return f"{line} ({note})" if note else line


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A plain aligned text table (floats to 4 significant digits)."""
  cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row] for row in rows]
  widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
  line = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
  rule = "  ".join("-" * w for w in widths)
  return "\n".join([line(header), rule, *(line(r) for r in cells)])


def summary_table(records: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None) -> str:
  """first / last / min / max / mean of each key over a run's records."""
  if keys is None:
    keys = sorted({k for r in records for k in r if k != "step"})
  rows = []
  for key in keys:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    if values:
      rows.append([key, float(values[0]), float(values[-1]), float(min(values)),
                   float(max(values)), float(np.mean(values))])
  return format_table(["metric", "first", "last", "min", "max", "mean"], rows)


@contextlib.contextmanager
def timed(times: dict[str, float], name: str) -> Iterator[None]:
  """Adds the wall time of the block to times[f"time/{name}"] (seconds)."""
  start = time.perf_counter()
  try:
    yield
  finally:
    key = f"time/{name}"
    times[key] = times.get(key, 0.0) + time.perf_counter() - start


class Heartbeat:
  """Prints "  <label>: 30s so far" every `period` seconds while a long phase runs.

  A real model's rollout or update can take minutes with nothing on the console; the loop sets
  the current phase with `phase(label)` and `phase(None)` when idle. Runs one daemon thread;
  use as a context manager. period <= 0 disables it.
  """

  def __init__(self, period: float, stream=None):
    self.period, self._stream = period, stream or sys.stdout
    self._label, self._start, self._due = None, 0.0, math.inf
    self._lock, self._stop = threading.Lock(), threading.Event()
    self._thread = threading.Thread(target=self._beat, daemon=True)

  def phase(self, label: str | None) -> None:
    with self._lock:
      self._label, self._start = label, time.perf_counter()
      self._due = self._start + self.period

  def _beat(self) -> None:
    while not self._stop.wait(min(self.period / 4, 1.0)):
      with self._lock:
        now, label = time.perf_counter(), self._label
        due = label is not None and now >= self._due
        if due:
          self._due += self.period
      if due:
        print(f"  {label}: {now - self._start:.0f}s so far", file=self._stream, flush=True)

  def __enter__(self) -> "Heartbeat":
    if self.period > 0:
      self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()


class Writer:
  """Writes one dict of scalars per step to JSONL, TensorBoard, W&B and the console."""

  def __init__(self, workdir: str, *, total_steps: int, tensorboard: bool = True,
               wandb: Mapping[str, Any] | None = None, console: bool = True,
               resume_step: int | None = None, stream=None):
    """Opens the sinks.

    Args:
      workdir: output directory (created if missing).
      total_steps: shown as the denominator of the progress line.
      tensorboard: write TensorBoard event files under `<workdir>/tb`, with the run's
        `<workdir>/config.json` (when present) as the text summary `config`.
      wandb: keyword arguments for `wandb.init` (e.g. project, name, config); None disables it.
      console: print a progress line per step.
      resume_step: the step restored from a checkpoint; later records are dropped.
      stream: where console lines go (default sys.stdout).
    """
    os.makedirs(workdir, exist_ok=True)
    self.workdir, self.total_steps, self.console = workdir, total_steps, console
    self.path = os.path.join(workdir, JSONL)
    self._stream = stream or sys.stdout
    if resume_step is None:
      open(self.path, "w").close()
    else:
      _truncate_jsonl(self.path, resume_step)
    self._file = open(self.path, "a")
    self._tb = None
    if tensorboard:
      import tensorboardX  # pylint: disable=g-import-not-at-top
      purge = None if resume_step is None else resume_step + 1
      self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tb"), purge_step=purge)
      config = os.path.join(workdir, "config.json")  # written by rundir.write_config
      if os.path.exists(config):  # shown in TensorBoard's Text tab, next to the curves
        with open(config) as f:
          self._tb.add_text("config", f"```json\n{f.read()}\n```", global_step=resume_step or 0)
    self._wandb = None
    if wandb:
      import wandb as wandb_lib  # pylint: disable=g-import-not-at-top
      self._wandb = wandb_lib.init(dir=workdir, **dict(wandb))

  def write(self, step: int, scalars: Mapping[str, Any], note: str = "") -> dict[str, Any]:
    """Logs `scalars` for `step` everywhere; returns the JSON record written.

    `note` goes on the console line only (e.g. "includes compilation"), not into the record.
    """
    record = {"step": int(step), **{k: to_python(v) for k, v in scalars.items()}}
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()  # a killed run keeps every completed step's line
    numeric = {k: v for k, v in record.items() if k != "step" and v is not None}
    if self._tb is not None:
      for key, value in numeric.items():
        self._tb.add_scalar(key, value, global_step=step)
    if self._wandb is not None:
      self._wandb.log(numeric, step=step)
    if self.console:
      print(progress_line(step, self.total_steps, record, note), file=self._stream,
            flush=True)
    return record

  def records(self) -> list[dict[str, Any]]:
    return read_jsonl(self.path)

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()
