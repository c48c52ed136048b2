"""Studies over many runs: each run is an experiment binary in a subprocess, resumable.

  timing = study.run_experiment("agent", "runs/study/grpo_seed0", ["--config.seed=0"])
  curves = study.read_curves("runs/study/grpo_seed0")
  study.mean_std([0.41, 0.44, 0.39], ".1f", 100.0)         # "41.3 ± 2.5"

Used by scripts/efficiency_study.py and scripts/credit_study.py. A run whose summary.json
reports the requested steps is finished (a study skips it); a killed run resumes from its
last checkpoint through the experiment's own resume.
"""
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time
from typing import Sequence

import numpy as np

from agentrl.records import metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
_TIME_FILE = "study_time.json"


def summary(workdir: str) -> dict:
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def finished(workdir: str, steps: int) -> bool:
  """Whether the run in `workdir` completed `steps` RL steps."""
  path = os.path.join(workdir, "summary.json")
  return os.path.exists(path) and summary(workdir).get("steps") == steps


def share_warm_start(workdir: str, sources: Sequence[str]) -> None:
  """Copies the first warm start (the SFT policy) found among `sources` into a new run.

  One SFT policy for every run of a study: its seeds vary the RL runs (sampling, prompt order)
  and every method starts from the same policy. Nothing happens if the run has its own.
  """
  target = os.path.join(workdir, "warm_start")
  if os.path.exists(target):
    return
  for source in sources:
    source = os.path.join(source, "warm_start")
    if os.path.isdir(source) and os.listdir(source):
      os.makedirs(workdir, exist_ok=True)
      shutil.copytree(source, target)
      return


def children_cpu() -> float:
  """User + system CPU seconds of the finished child processes: a measure of a run's work
  that does not grow when other jobs share the machine, as its wall time does."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def experiment_module(name: str) -> str:
  """'experiments.<family>.<name>' for an experiment's file name ("grpo"), found in the tree.

  Experiments live in one folder per family (experiments/policy/grpo.py); a name is unique
  across families, so callers name an experiment by its file alone.
  """
  found = sorted(ROOT.glob(f"experiments/*/{name}.py")) + sorted(
      ROOT.glob(f"experiments/{name}.py"))
  if len(found) != 1:
    known = sorted(p.stem for p in ROOT.glob("experiments/**/*.py") if p.stem != "__init__")
    raise ValueError(f"no single experiment named {name!r} under {ROOT / 'experiments'} "
                     f"(found {len(found)}); known: {', '.join(known)}")
  return ".".join(found[0].relative_to(ROOT).with_suffix("").parts)


def run_experiment(experiment: str, workdir: str, flags: Sequence[str]) -> dict:
  """Runs (or resumes) `python -m experiments.<family>.<experiment> --workdir=<workdir> <flags>`.

  Its output goes to <workdir>/log.txt; a failing run raises CalledProcessError naming the
  command. Returns and writes (<workdir>/study_time.json) its wall and CPU seconds.
  """
  os.makedirs(workdir, exist_ok=True)
  command = [sys.executable, "-m", experiment_module(experiment), f"--workdir={workdir}", *flags]
  start, cpu = time.perf_counter(), children_cpu()
  with open(os.path.join(workdir, "log.txt"), "a") as log:
    subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
  timing = {"wall_s": time.perf_counter() - start, "cpu_s": children_cpu() - cpu}
  with open(os.path.join(workdir, _TIME_FILE), "w") as f:
    json.dump(timing, f)
  return timing


def process_time(workdir: str) -> dict:
  """The wall and CPU seconds of the process that ran the run (NaN for a resumed run)."""
  path = os.path.join(workdir, _TIME_FILE)
  if not os.path.exists(path):
    return {"wall_s": float("nan"), "cpu_s": float("nan")}
  with open(path) as f:
    return json.load(f)


def read_curves(workdir: str) -> dict:
  """A run's evaluation records (`evals`), training records (`train`) and summary."""
  records = metrics.read_jsonl(os.path.join(workdir, metrics.JSONL))
  return {"evals": [r for r in records if "eval/success" in r],
          "train": [r for r in records if r["step"] > 0],
          "summary": summary(workdir), **process_time(workdir)}


def mean_std(values, fmt: str = ".2f", scale: float = 1.0) -> str:
  """"mean ± std" over seeds (sample std, ddof 1; 0 for one seed)."""
  values = np.asarray(values, np.float64) * scale
  std = values.std(ddof=1) if len(values) > 1 else 0.0
  return f"{values.mean():{fmt}} ± {std:{fmt}}"


def normalized_auc(steps: Sequence[float], values: Sequence[float]) -> float:
  """Trapezoidal area under values(steps) divided by the step span: the curve's mean level."""
  x, y = np.asarray(steps, np.float64), np.asarray(values, np.float64)
  if x.size < 2 or x[-1] == x[0]:
    return float(y.mean()) if y.size else float("nan")
  return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2 / (x[-1] - x[0]))


def write_results(out: str, script: str, text: str, png: str, start: float) -> None:
  """Writes <out>/results.txt (the command, the table, the curves) and prints the table."""
  command = f"python scripts/{script} " + " ".join(sys.argv[1:])
  with open(os.path.join(out, "results.txt"), "w") as f:
    f.write(f"`{command}`\n\n{text}\n\n![curves]({os.path.basename(png)})\n")
  print(f"\n{text}\n\n{png}\nstudy wall time {time.perf_counter() - start:.0f}s "
        "(runs already finished are not re-run)")
