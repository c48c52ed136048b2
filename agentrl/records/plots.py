"""Learning-curve PNGs of one run (`plot_curves`) or of several runs overlaid (`plot_runs`).

Panels are chosen from what a run logged (`choose_panels`): held-out greedy success first (its
step-0 point is the baseline before RL), then the usual RL diagnostics, then every
method-specific scalar the run logged (HölderPO's `holder_p`, CTPO's `tis_weight`, R2VPO's
dual variable `lam`, ...), so nothing a method computes is logged but never drawn. Timing,
throughput, env counters and rollout bookkeeping are left to the JSONL and TensorBoard. Two
series that are equal at every step and vary (reward and success under a binary reward) share
a panel.
The panel order is fixed (STANDARD, then the rest alphabetically) and capped at MAX_PANELS,
so a figure stays readable and the same method's runs always look alike.
"""
from collections.abc import Mapping, Sequence
import os
from typing import Any

# The usual diagnostics, in display order; each is drawn when the run logged it.
STANDARD = ("eval/success", "success", "reward", "kl", "kl_loss", "kl_in_reward", "entropy",
            "clipfrac", "seq_clipfrac", "loss", "grad_norm", "groups_with_signal")
# Logged for every policy loss; useful in TensorBoard, too generic for the summary figure.
_GENERIC = ("ratio_mean", "ratio_max", "seq_ratio_mean", "seq_ratio_max", "ppo_kl",
            "clipfrac_high", "clipfrac_low", "clipfrac_lower", "seq_clipfrac_high",
            "seq_clipfrac_low", "skipped", "logp_mismatch", "adv_abs_mean")
# Another panel's curve moved by a constant: R2VPO's V_hat - delta is ratio_var shifted.
_REDUNDANT = ("constraint_residual",)
_NOT_CURVES = ("time/", "env/", "rollout/", "update/")
# Room for every panel of the widest method (PPO: 9 standard + 7 critic diagnostics).
MAX_PANELS = 18


def _numeric(records: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
  return [(r["step"], float(r[key])) for r in records
          if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def choose_panels(records: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None,
                  *, max_panels: int = MAX_PANELS) -> list[list[str]]:
  """Panels (each a list of keys drawn together) for `records`.

  With `keys`, those that occur, one per panel. Otherwise STANDARD, then method-specific keys
  (anything else numeric that is not timing, throughput or a counter), at most `max_panels`.
  A key whose series equals an earlier panel's at every step joins that panel, unless the
  series is constant: a 0 that several metrics share (no KL before the policy moves, no clip
  on an idle run) is a coincidence, not one quantity under two names.
  """
  names = {k for r in records for k in r} - {"step"}
  series = {k: points for k in names if (points := _numeric(records, k))}
  if keys is not None:
    chosen = [k for k in keys if k in series]
  else:
    extra = sorted(k for k in series if k not in STANDARD + _GENERIC + _REDUNDANT
                   and not k.startswith(_NOT_CURVES))
    chosen = [k for k in STANDARD if k in series] + extra
  panels: list[list[str]] = []
  for key in chosen:
    varies = len({v for _, v in series[key]}) > 1
    twin = next((p for p in panels if varies and series[p[0]] == series[key]), None)
    if twin is not None:
      twin.append(key)
    elif len(panels) < max_panels:
      panels.append([key])
  return panels


def _figure(n: int):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top
  cols = min(3, n)
  rows = -(-n // cols)
  # Constrained layout leaves room for the suptitle, which tight_layout would overlap.
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False,
                           layout="constrained")
  for ax in list(axes.flat)[n:]:
    ax.axis("off")
  for ax in list(axes.flat)[:n]:
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # steps are whole
    ax.grid(alpha=0.3)
  return plt, fig, list(axes.flat)[:n]


def _save(plt, fig, axes, steps, path: str, title: str) -> None:
  lo, hi = min(steps), max(steps)
  if hi > lo:  # one step range for every panel, so the step-0 baseline lines up with step 1
    pad = 0.02 * (hi - lo)
    for ax in axes:
      ax.set_xlim(lo - pad, hi + pad)
  if title:
    fig.suptitle(title)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _draw(ax, points, label=None, color="C0"):
  # Evaluations are a handful of points: markers keep the step-0 baseline visible.
  marker = "o" if len(points) <= 12 else None
  return ax.plot(*zip(*points), marker=marker, markersize=3, label=label, color=color)[0]


def _check_requested(keys: Sequence[str] | None,
                     runs: Sequence[Sequence[Mapping[str, Any]]]) -> None:
  """A requested key no run logged is a typo to report, not a panel to drop silently."""
  if keys is None:
    return
  available = sorted({k for records in runs for r in records for k in r} - {"step"})
  unknown = [k for k in keys if not any(_numeric(records, k) for records in runs)]
  if unknown:
    raise ValueError(f"no numeric values for {', '.join(unknown)} in the records; "
                     f"available: {available}")


def plot_curves(records: Sequence[Mapping[str, Any]], path: str,
                keys: Sequence[str] | None = None, *, title: str = "") -> list[str]:
  """Writes a PNG grid of one run's curves; returns the panel titles drawn."""
  _check_requested(keys, [records])
  panels = choose_panels(records, keys)
  if not panels:
    raise ValueError("the records hold no metric to plot")
  plt, fig, axes = _figure(len(panels))
  titles = [" = ".join(p) for p in panels]
  for ax, panel, name in zip(axes, panels, titles):
    _draw(ax, _numeric(records, panel[0]))
    ax.set_title(name)
  _save(plt, fig, axes, [r["step"] for r in records], path, title)
  return titles


def _shared_panels(runs: Sequence[Sequence[Mapping[str, Any]]]) -> list[list[str]]:
  """The union of the runs' `choose_panels`, STANDARD first; a key shares a panel only where it
  equals the same other key in every run that logs it (reward and success under binary
  rewards in all the runs)."""
  order: list[str] = []
  heads: dict[str, set[str]] = {}  # key -> the first keys of the panels it is in, per run
  for records in runs:
    for panel in choose_panels(records):
      for key in panel:
        if key not in order:
          order.append(key)
        heads.setdefault(key, set()).add(panel[0])
  follows = {k: next(iter(h)) for k, h in heads.items() if len(h) == 1 and k not in h}
  order = [k for k in STANDARD if k in order] + [k for k in order if k not in STANDARD]
  return [[h, *(k for k in order if follows.get(k) == h)] for h in order if h not in follows]


def plot_runs(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str,
              keys: Sequence[str] | None = None, *, title: str = "") -> list[str]:
  """Writes a PNG with one panel per metric and one line per run; returns the panels drawn.

  Without `keys`: the panels `choose_panels` picks for any of the runs, in STANDARD order.
  """
  _check_requested(keys, list(runs.values()))
  if keys is None:
    panels = _shared_panels(list(runs.values()))[:MAX_PANELS]
  else:
    panels = [[k] for k in keys][:MAX_PANELS]
  if not panels:
    raise ValueError("the runs hold no metric to plot")
  plt, fig, axes = _figure(len(panels))
  titles = [" = ".join(p) for p in panels]
  handles = {}
  for ax, panel, name in zip(axes, panels, titles):
    # A run keeps its colour in every panel, also where the other runs log nothing.
    for i, (label, records) in enumerate(runs.items()):
      points = _numeric(records, panel[0])
      if points:
        handles.setdefault(label, _draw(ax, points, label, color=f"C{i % 10}"))
    ax.set_title(name)
  fig.legend(handles=list(handles.values()), loc="outside upper center",
             ncols=min(len(handles), 3), fontsize=8)
  _save(plt, fig, axes, [r["step"] for records in runs.values() for r in records], path, title)
  return titles
