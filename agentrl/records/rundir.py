"""A run's working directory: created with a clear error, locked against a second run, and
the files that describe the run (config.json on the way in, summary.json and curves.png on
the way out).

`lock(workdir)` takes an exclusive `fcntl.flock` on <workdir>/LOCK and writes the holder's
pid, host and start time into it. The kernel drops a flock when its process dies (kill -9
included), so a lock left by a dead run is simply taken over; a live holder makes the
second run fail at once with a message that names it. The lock is re-entrant within one
process (a test or notebook may run `train` twice on one workdir) and is released by
`unlock` or at process exit.

`config_changes(old, new)` lists what differs between a run's stored config.json and the
config it is resumed with, so the resume can refuse shape-changing edits and log the rest.
A run directory belongs to the experiment that created it (recorded in <workdir>/run.json):
another experiment is refused before anything is written, since its loss would silently
continue the first one's checkpoints.
"""
import datetime
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections as mlc

from agentrl import checkpoint
from agentrl import configs
from agentrl.models import lora
from agentrl.records import metrics as metrics_lib
from agentrl.records import plots

LOCK_FILE = "LOCK"
RUN_FILE = "run.json"  # {"experiment": "grpo"}: which experiment's run this directory holds
_HELD: dict[str, int] = {}  # abspath of a locked workdir -> the open LOCK file descriptor


class WorkdirError(RuntimeError):
  """The workdir cannot be used: not creatable, not writable, or held by another run."""


def prepare(workdir: str) -> str:
  """Creates `workdir` if needed and checks it is writable; returns its absolute path."""
  path = os.path.abspath(workdir)
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise WorkdirError(f"--workdir={workdir} cannot be created ({e.strerror}); choose a "
                       "directory you can write to") from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise WorkdirError(f"--workdir={workdir} is not writable; choose a directory you can "
                       "write to")
  return path


def _holder(path: str) -> str:
  try:
    with open(path) as f:
      info = json.load(f)
    return f"pid {info['pid']} on {info['host']} since {info['since']}"
  except (OSError, ValueError, KeyError):
    return "another process"


def lock(workdir: str) -> None:
  """Takes the workdir's lock or raises WorkdirError naming the run that holds it."""
  path = prepare(workdir)
  if path in _HELD:
    return
  lock_path = os.path.join(path, LOCK_FILE)
  fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)
    raise WorkdirError(f"--workdir={workdir} is in use by {_holder(lock_path)}: two runs in "
                       "one workdir would interleave their metrics and checkpoints. Wait for "
                       "it, stop it, or choose another --workdir") from None
  info = {"pid": os.getpid(), "host": socket.gethostname(),
          "since": datetime.datetime.now().isoformat(timespec="seconds")}
  os.ftruncate(fd, 0)
  os.pwrite(fd, json.dumps(info).encode(), 0)
  _HELD[path] = fd


def unlock(workdir: str) -> None:
  """Releases a lock this process holds (no-op otherwise)."""
  fd = _HELD.pop(os.path.abspath(workdir), None)
  if fd is not None:
    os.close(fd)  # closing the descriptor drops the flock


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
  """(dotted key, old value, new value) for every leaf that differs; absent is None."""
  a, b = configs.flatten(json.loads(json.dumps(old))), configs.flatten(json.loads(json.dumps(new)))
  return [(key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b))
          if a.get(key) != b.get(key)]


# Config keys whose change makes a run's checkpoints or tokenizer unusable: a resume with a
# different value is refused (the checkpoint restore also checks every state shape).
STRUCTURAL_KEYS = ("model.", "task.")
# Model keys that only change how the same weights are computed: a resume may change them.
COMPUTE_KEYS = ("model.unroll_layers", "model.logprob_impl", "model.remat", "model.attention")


def experiment_of(run_dir: str) -> str | None:
  """The experiment whose run `run_dir` holds (its RUN_FILE); None for a run made before
  RUN_FILE existed."""
  path = os.path.join(run_dir, RUN_FILE)
  if not os.path.exists(path):
    return None
  data = _read_json(path)
  name = data.get("experiment") if isinstance(data, dict) else None
  if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w*", name):
    raise configs.ConfigError(f"{path} must hold {{\"experiment\": \"<name>\"}}, got "
                              f"{data!r}: restore it, or remove it")
  return name


def is_run_dir(path: str) -> bool:
  """Whether `path` is an experiment's workdir (its lock, run file, or config and checkpoints)."""
  return (os.path.exists(os.path.join(path, LOCK_FILE))
          or os.path.exists(os.path.join(path, RUN_FILE))
          or (os.path.isfile(os.path.join(path, "config.json"))
              and os.path.isdir(os.path.join(path, "ckpt"))))


def has_checkpoints(run_dir: str) -> bool:
  """Whether the run saved any state (RL or SFT warm-start checkpoints). A run that stopped
  before its first save (e.g. its model failed to load) may be restarted with another model
  or task: nothing of it would be resumed."""
  return any(checkpoint.saved_steps(os.path.join(run_dir, d)) for d in ("ckpt", "warm_start"))


def atomic_write(path: str, text: str) -> None:
  """Writes `text` to `path` through a temporary file and a rename."""
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)  # atomic: a reader never sees half a file


def write_config(config: mlc.ConfigDict, workdir: str, *, experiment: str) -> float:
  """Locks the workdir and writes <workdir>/config.json; returns the start time.

  `experiment` names the experiment (its file's stem, e.g. "grpo"); it is recorded in
  RUN_FILE, and a workdir holding another experiment's run is refused with a WorkdirError
  naming both, before anything is written. A run made before RUN_FILE existed resumes and
  gets it. On a resume (config.json already there) the configs are compared: changes to
  STRUCTURAL_KEYS are refused with a ConfigError listing them, before anything is written,
  once the run has checkpoints (`has_checkpoints`); other changes (a new learning rate, more
  steps) are printed, one line each, and the new config is recorded.
  """
  lock(workdir)
  owner = experiment_of(workdir)
  if owner is not None and owner != experiment:
    raise WorkdirError(f"--workdir={workdir} holds a run of the {owner} "
                       f"experiment; {experiment} cannot continue it (its checkpoints and "
                       "config are another method's). Use another --workdir")
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    changes = config_changes(read_config(workdir).to_dict(), config.to_dict())
    refused = [f"config.{k}: {old!r} -> {new!r}" for k, old, new in changes
               if k.startswith(STRUCTURAL_KEYS) and k not in COMPUTE_KEYS]
    if refused and has_checkpoints(workdir):
      raise configs.ConfigError(
          f"--workdir={workdir} holds a run with a different model or task ("
          f"{'; '.join(refused)}); its checkpoints cannot be resumed with this config. Use "
          "another --workdir, or the stored values")
    for key, old, new in changes:
      print(f"Resuming {workdir} with config.{key} changed: {old!r} -> {new!r}", flush=True)
  if owner is None:
    atomic_write(os.path.join(workdir, RUN_FILE), json.dumps({"experiment": experiment}))
  atomic_write(path, config.to_json(indent=2))
  return time.perf_counter()


def _read_json(path: str) -> Any:
  """The JSON value in `path`; a ConfigError naming the file if it cannot be read or parsed."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, UnicodeDecodeError) as e:
    raise configs.ConfigError(f"{path} cannot be read ({e})") from None
  except json.JSONDecodeError as e:
    raise configs.ConfigError(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column "
                              f"{e.colno}; truncated or hand-edited?): restore it") from None


def read_config(run_dir: str, schema: Mapping[str, configs.Key] | None = None, *,
                required: Sequence[str] = ()) -> mlc.ConfigDict:
  """The config.json that `write_config` left in a run's workdir, checked.

  A file that is not a JSON object, a stored value that does not fit `schema` (only the keys
  present are checked, so a run made before a key existed still reads) and a missing
  `required` key each raise one ConfigError naming the file and the key.
  """
  path = os.path.join(run_dir, "config.json")
  data = _read_json(path)
  if not isinstance(data, dict):
    raise configs.ConfigError(f"{path} must hold a JSON object of config keys, got a "
                              f"{type(data).__name__}: restore it")
  try:
    configs.validate_present(data, schema or {}, required=required)
  except configs.ConfigError as e:
    raise configs.ConfigError(f"{path}: {e}") from None
  return mlc.ConfigDict(data)


# ---------------------------------------------------------------------------------------------
# Summary.
# ---------------------------------------------------------------------------------------------
def _seconds(records, sft_info) -> dict[str, float]:
  """Where the run's time went, summed over its records (so resumed runs count every step)."""
  total = lambda key: float(sum(r.get(key) or 0.0 for r in records))
  return {"sft": float((sft_info or {}).get("seconds", 0.0)), "train": total("time/step"),
          "rollout": total("time/rollout"), "score": total("time/score"),
          "update": total("time/update"), "eval": total("time/eval")}


def write_summary(workdir: str, result, *, name: str, start: float,
                  sft_info: dict | None = None, extra: dict | None = None) -> dict:
  """Prints the before/after table and writes summary.json and curves.png.

  summary.json's `seconds` splits the run's time into SFT, RL training (its rollout, score and
  update phases) and evaluations, summed over every step's record, so a resumed run reports
  the whole run. `extra` (JSON-able) is added to the summary as it is (e.g. OPD's
  `teacher_success`). A run that was already complete (this process ran no step) keeps its
  summary.json and curves.png; the table is printed from them. A replay (`loop.replay`)
  writes {method, replay, step, update} (the replayed update's means) and no curves.
  """
  path = os.path.join(workdir, "summary.json")
  if getattr(result, "replay", ""):  # a replayed update (loop.replay) trains no run
    summary = {"method": name, "replay": result.replay, "step": result.step,
               "update": result.records[-1]}
    atomic_write(path, json.dumps(summary, indent=2))
    unlock(workdir)
    return summary
  if result.steps_run == 0 and os.path.exists(path):
    with open(path) as f:
      summary = json.load(f)
    print(f"{workdir} is already complete ({result.step} steps); its summary.json is kept.")
    _print_summary(summary, result.records, workdir)
    unlock(workdir)
    return summary
  before = result.evals["0"]["eval/success"]
  after = result.evals[str(result.step)]["eval/success"]
  config = read_config(workdir) if os.path.exists(os.path.join(workdir, "config.json")) else None
  summary = {"method": name, "success_before": before, "success_after": after,
             "eval_problems": config.eval.num_problems if config and "eval" in config else None,
             "steps": result.step, "seconds": _seconds(result.records, sft_info),
             "process_seconds": time.perf_counter() - start, "sft": sft_info or {},
             "final": {k: v for k, v in result.records[-1].items()
                       if k not in metrics_lib.TIMING_KEYS}, **(extra or {})}
  atomic_write(path, json.dumps(summary, indent=2))
  plots.plot_curves(result.records, os.path.join(workdir, "curves.png"),
                    title=f"{name}: {workdir}")
  _print_summary(summary, result.records, workdir)
  unlock(workdir)
  return summary


def _print_summary(summary: dict, records, workdir: str) -> None:
  print(metrics_lib.summary_table([r for r in records if r.get("step", 0) > 0],
                                  ["reward", "success", "kl", "entropy", "clipfrac",
                                   "grad_norm"]))
  print()
  before, after = summary["success_before"], summary["success_after"]
  n = summary.get("eval_problems")
  print(metrics_lib.format_table(
      ["held-out greedy success", "before RL", "after RL", "change"],
      [[f"{n} problems" if n else "held-out set", f"{before:.1%}", f"{after:.1%}",
        f"{100 * (after - before):+.1f} points"]]))
  if "teacher_success" in summary:  # on-policy distillation: the gap to the teacher
    print(f"teacher: {summary['teacher_success']:.1%} (the student closed "
          f"{_closed(before, after, summary['teacher_success'])} of the gap)")
  print(f"\n{summary['method']}: {summary['steps']} steps -> {workdir}")
  sec = summary.get("seconds")
  if not sec:  # a summary written before the time split existed
    return
  sft = f"SFT {sec['sft']:.0f}s, " if sec["sft"] else ""
  print(f"time: {sft}RL training {sec['train']:.0f}s (rollout {sec['rollout']:.0f}s, score "
        f"{sec['score']:.0f}s, update {sec['update']:.0f}s), evaluations {sec['eval']:.0f}s; "
        f"this process {summary.get('process_seconds', 0):.0f}s")


def _closed(before: float, after: float, target: float) -> str:
  return f"{(after - before) / (target - before):.0%}" if target > before else "none"


def saved_step(run_dir: str, step: str, *, flag: str = "config.step") -> tuple[str, int]:
  """(directory, step number) of checkpoint `step` ("latest", "warm_start" or a step number)
  of the run in `run_dir`, read-only; a ConfigError naming `flag` when there is none."""
  if step == "warm_start":
    directory = os.path.join(run_dir, "warm_start")
  else:
    directory = os.path.join(run_dir, "ckpt")
  steps = checkpoint.saved_steps(directory)
  if not steps:
    other = ("" if step == "warm_start"
             or not checkpoint.saved_steps(os.path.join(run_dir, "warm_start"))
             else f", or give {flag}=warm_start (its SFT warm start)")
    raise configs.ConfigError(f"{flag}={step!r}: {directory} holds no checkpoint; wait for "
                              f"the run's first save{other}")
  wanted = steps[-1] if step in ("latest", "warm_start") else int(step)
  if wanted not in steps:
    raise configs.ConfigError(f"{flag}={step!r} was not kept: {directory} has steps "
                              f"{steps}; give one of them, 'latest' or 'warm_start'")
  return directory, wanted


def load_params(run_dir: str, step: str, params, *, flag: str = "config.step"):
  """The policy params of checkpoint `step` of the run in `run_dir`, and the step restored.

  A LoRA run's checkpoints hold its adapters only: they are read onto the frozen base, the
  run's SFT warm start if it had one (else the pretrained weights `params` hold). A missing
  checkpoint is a ConfigError naming `flag` (`saved_step`).
  """
  if lora.has_adapters(params) and step == "warm_start":
    base, step = load_params(run_dir, step, params["base"], flag=flag)
    return lora.with_base(params, base), step
  if lora.has_adapters(params):
    if checkpoint.saved_steps(os.path.join(run_dir, "warm_start")):
      params, _ = load_params(run_dir, "warm_start", params, flag=flag)
    trained, step = load_params(run_dir, step, lora.trainable(params), flag=flag)
    return lora.combine(params, trained), step
  directory, wanted = saved_step(run_dir, step, flag=flag)
  path = ("params",) if step == "warm_start" else ("state", "params")
  params = checkpoint.read_subtree(directory, path, params, step=wanted)
  return params, step if step == "warm_start" else str(wanted)
