"""Learning-curve PNGs of one run (`plot_curves`) or of several runs overlaid (`plot_runs`).

Panels are chosen from what a run logged (`choose_panels`): held-out greedy success first (its
step-0 point is the baseline before RL), then the usual RL diagnostics, then every
method-specific scalar the run logged (HölderPO's `holder_p`, CTPO's `tis_weight`, R2VPO's
dual variable `lam`, ...), so nothing a method computes is logged but never drawn. Timing,
throughput, env counters and rollout bookkeeping are left to the JSONL and TensorBoard. Two
series that are equal at every step (reward and success under a binary reward) share a panel.
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
_NOT_CURVES = ("time/", "env/", "rollout/", "update/")
MAX_PANELS = 15


def _numeric(records: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
  return [(r["step"], float(r[key])) for r in records
          if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def choose_panels(records: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None,
                  *, max_panels: int = MAX_PANELS) -> list[list[str]]:
  """Panels (each a list of keys drawn together) for `records`.

  With `keys`, those that occur, one per panel. Otherwise STANDARD, then method-specific keys
  (anything else numeric that is not timing, throughput or a counter), at most `max_panels`.
  A key whose series equals an earlier panel's at every step joins that panel.
  """
  present = {k for r in records for k in r if k != "step" and _numeric(records, k)}
  if keys is not None:
    chosen = [k for k in keys if k in present]
  else:
    extra = sorted(k for k in present if k not in STANDARD and k not in _GENERIC
                   and not k.startswith(_NOT_CURVES))
    chosen = [k for k in STANDARD if k in present] + extra
  panels: list[list[str]] = []
  for key in chosen:
    series = _numeric(records, key)
    twin = next((p for p in panels if _numeric(records, p[0]) == series), None)
    if twin is not None:
      twin.append(key)
    elif len(panels) < max_panels:
      panels.append([key])
  return panels


def _figure(n: int):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  cols = min(3, n)
  rows = -(-n // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
  for ax in list(axes.flat)[n:]:
    ax.axis("off")
  return plt, fig, list(axes.flat)[:n]


def _save(plt, fig, path: str, title: str) -> None:
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _draw(ax, points, label=None):
  # Evaluations are a handful of points: markers keep the step-0 baseline visible.
  marker = "o" if len(points) <= 12 else None
  ax.plot(*zip(*points), marker=marker, markersize=3, label=label)


def plot_curves(records: Sequence[Mapping[str, Any]], path: str,
                keys: Sequence[str] | None = None, *, title: str = "") -> list[str]:
  """Writes a PNG grid of one run's curves; returns the panel titles drawn."""
  panels = choose_panels(records, keys)
  if not panels:
    raise ValueError(f"none of the requested metrics occur in the records; available: "
                     f"{sorted({k for r in records for k in r} - {'step'})}")
  plt, fig, axes = _figure(len(panels))
  titles = [" = ".join(p) for p in panels]
  for ax, panel, name in zip(axes, panels, titles):
    _draw(ax, _numeric(records, panel[0]))
    ax.set_title(name)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  _save(plt, fig, path, title)
  return titles


def plot_runs(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str,
              keys: Sequence[str] | None = None, *, title: str = "") -> list[str]:
  """Writes a PNG with one panel per metric and one line per run; returns the keys drawn.

  Without `keys`: the panels `choose_panels` picks for any of the runs, in STANDARD order.
  """
  if keys is None:
    seen: list[str] = []
    for records in runs.values():
      for panel in choose_panels(records):
        seen += [k for k in panel if k not in seen]
    keys = [k for k in STANDARD if k in seen] + [k for k in seen if k not in STANDARD]
  keys = [k for k in keys if any(_numeric(r, k) for r in runs.values())][:MAX_PANELS]
  if not keys:
    raise ValueError("the runs share no metric to plot")
  plt, fig, axes = _figure(len(keys))
  for ax, key in zip(axes, keys):
    for label, records in runs.items():
      points = _numeric(records, key)
      if points:
        _draw(ax, points, label)
    ax.set_title(key)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  _save(plt, fig, path, title)
  return list(keys)
