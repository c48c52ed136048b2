"""Collapse and reward-hacking alarms over a run's stream of per-step metric records.

  monitor = alarms.Monitor(alarms.Settings(), run_dir=workdir)
  monitor.replay(earlier_records)                 # a resumed run: no warning printed again
  scalars, warnings = monitor.observe(step, record)
  record.update(scalars)                          # alarm/entropy_collapse ... (1.0 or 0.0)
  for line in warnings: print(line)

`Monitor.observe` reads the flat record the loop writes for a step (docs/metrics.md's names)
and returns one `alarm/<name>` metric per alarm whose inputs the record has: 1.0 on a step
where the alarm's condition holds, else 0.0. Each alarm warns once per run, on its first
firing, with the step and the evidence. The detectors are pure functions of the recent points
of each metric; the monitor only keeps those points. What each alarm watches:

  entropy_collapse   `entropy` below `entropy_min` while success did not rise over the last
                     `entropy_window` steps.
  length_explosion   `rollout/response_tokens_mean` at least `length_factor` times its lowest
                     level within the last `length_window` steps, or the truncation rate
                     `rollout/turn_cut_frac` (model turns cut by the token budget) above
                     `truncation_max`. `rollout/truncated_frac` is not read: it also counts
                     the episodes a turn limit ended, which a failing agent reaches with
                     short turns.
  reward_divergence  a trained reward (`REWARD_KEYS`) rising over the last `divergence_window`
                     steps while sampled success falls over them, or while held-out success
                     fell at the last evaluation: the reward-hacking signature.
  repetition         `rollout/repetition` (model turns that repeat their own n-grams) above
                     `repetition_max`.
  invalid_actions    `rollout/invalid_turns` (env steps that reported an error) rising by
                     `invalid_rise` over the last `invalid_window` steps, or above `invalid_max`.

Rising and falling are least-squares trends over the window, not single steps: the fitted
change must reach the margin and the slope's t-statistic `trend_t`, so one noisy step neither
fires nor hides a trend. Levels compared with a threshold are the median of the last
`smooth` steps, for the same reason. Success is sampled `success`; where the window holds two
or more held-out evaluations (`eval/success`), the entropy alarm also counts a held-out rise.
"""
from collections.abc import Iterable, Mapping, Sequence
import collections
import dataclasses
import math

import numpy as np

# The mean rewards a run trains on, whose rise the divergence alarm compares with success: the
# rollout's reward, and the credit and shaping methods' own (docs/metrics.md).
REWARD_KEYS = ("reward", "siop_reward_mean", "info_gain_mean", "progress_mean",
               "turn_reward_mean", "spa/turn_reward_mean", "step_reward_mean", "opd_reward",
               "hbpo/reward", "eapo/discounted_reward", "hapo/length_reward")
SUCCESS, HELD_OUT = "success", "eval/success"
ENTROPY = "entropy"
LENGTH, TURN_CUT = "rollout/response_tokens_mean", "rollout/turn_cut_frac"
REPETITION, INVALID = "rollout/repetition", "rollout/invalid_turns"
ALARMS = ("entropy_collapse", "length_explosion", "reward_divergence", "repetition",
          "invalid_actions")
# Short names for tables (scripts/compare_runs.py's alarms column).
LABELS = {"entropy_collapse": "entropy", "length_explosion": "length",
          "reward_divergence": "divergence", "repetition": "repetition",
          "invalid_actions": "invalid"}
VIEWER = "scripts/view_trajectories.py"


@dataclasses.dataclass(frozen=True)
class Settings:
  """Thresholds and windows (windows count steps that logged the metric). Values marked
  [INF] are this library's choices, not taken from a paper."""
  entropy_min: float = 0.05        # [INF] nats per sampled token
  entropy_window: int = 20         # [INF]
  success_rise: float = 0.02       # [INF] fitted rise of success that counts as not flat
  length_window: int = 10          # [INF]
  length_factor: float = 2.0       # the "doubling"
  truncation_max: float = 0.3      # [INF]
  divergence_window: int = 10      # [INF]
  reward_rise: float = 0.1         # [INF] fitted rise, relative to the window's mean |reward|
  success_drop: float = 0.05       # [INF] fitted fall of sampled success; least held-out drop
  held_out_drop: float = 0.2       # [INF] held-out drop relative to the evaluation before
  repetition_max: float = 0.3      # [INF]
  invalid_window: int = 10         # [INF]
  invalid_rise: float = 0.05       # [INF] fitted rise of the invalid-turn fraction
  invalid_max: float = 0.5         # [INF]
  trend_t: float = 2.5             # [INF] |slope / standard error| of a rise or fall
  smooth: int = 3                  # [INF] steps whose median is a thresholded level

  def __post_init__(self):
    for name in ("entropy_window", "length_window", "divergence_window", "invalid_window"):
      if getattr(self, name) < 3:
        raise ValueError(f"alarm setting {name}={getattr(self, name)}: a trend needs at least "
                         "3 steps; set it to 3 or more.")
    if self.smooth < 1:
      raise ValueError(f"alarm setting smooth={self.smooth}: set it to 1 or more.")


Points = Sequence[tuple[int, float]]   # (step, value) of one metric, oldest first


@dataclasses.dataclass(frozen=True)
class Trend:
  """A least-squares line through points: its values at the first and last step, and t."""
  first_step: int
  last_step: int
  start: float
  end: float
  t: float

  @property
  def change(self) -> float:
    return self.end - self.start


def trend(points: Points) -> Trend:
  """The least-squares line of value on step; t = slope / its standard error (±inf for points
  exactly on a sloped line, 0 for a flat one)."""
  x = np.asarray([s for s, _ in points], np.float64)
  y = np.asarray([v for _, v in points], np.float64)
  dx = x - x.mean()
  sxx = float(dx @ dx)
  slope = float(dx @ (y - y.mean())) / sxx if sxx else 0.0
  fit = y.mean() + slope * dx
  dof, resid = len(points) - 2, float(((y - fit) ** 2).sum())
  if dof <= 0 or not slope:
    t = 0.0
  elif resid <= 1e-20 * sxx * slope * slope:   # on the line, up to rounding
    t = math.copysign(math.inf, slope)
  else:
    t = slope / math.sqrt(resid / dof / sxx)
  return Trend(int(x[0]), int(x[-1]), float(fit[0]), float(fit[-1]), t)


def levels(points: Points, smooth: int) -> list[tuple[int, float]]:
  """(step, median of the `smooth` values ending there) for each point that has them."""
  values = [v for _, v in points]
  return [(points[i][0], float(np.median(values[i + 1 - smooth:i + 1])))
          for i in range(smooth - 1, len(points))]


def above(points: Points, threshold: float, smooth: int) -> float | None:
  """The latest level (`levels`) when it is above `threshold`, else None."""
  now = levels(points[-smooth:], smooth)
  return now[-1][1] if now and now[-1][1] > threshold else None


def _pct(x: float) -> str:
  return f"{x:.0%}"


def entropy_collapse(entropy: Points, success: Points, held_out: Points,
                     s: Settings) -> str:
  """Evidence when entropy is below `entropy_min` and success did not rise, else ""."""
  value, recent = entropy[-1][1], success[-s.entropy_window:]
  if value >= s.entropy_min or len(recent) < 3:   # under 3 points no trend tells flat
    return ""
  tr = trend(recent)
  rose = [tr.change >= s.success_rise]
  flat = f"sampled success {_pct(tr.start)} -> {_pct(tr.end)}"
  evals = [p for p in held_out if p[0] >= tr.first_step]
  if len(evals) >= 2:
    rose.append(evals[-1][1] - evals[0][1] >= s.success_rise)
    flat += f", held-out {_pct(evals[0][1])} -> {_pct(evals[-1][1])}"
  if any(rose):
    return ""
  return (f"entropy collapse: entropy {value:.3f} is below {s.entropy_min} while success did "
          f"not rise over steps {tr.first_step}-{tr.last_step} ({flat}); the policy has "
          "stopped exploring")


def length_explosion(length: Points, turn_cut: Points, s: Settings) -> str:
  """Evidence when response length at least multiplied by `length_factor` within the window,
  or the truncation rate is above `truncation_max`, else ""."""
  smoothed = levels(length[-(s.length_window + s.smooth):], s.smooth)
  if len(smoothed) >= 2:
    (low_step, low), now = min(smoothed[:-1], key=lambda p: p[1]), smoothed[-1][1]
    if low > 0 and now >= s.length_factor * low:
      return (f"length explosion: mean response length rose {low:.1f} -> {now:.1f} tokens "
              f"over steps {low_step}-{length[-1][0]} (x{now / low:.1f}); responses may "
              "ramble or loop")
  cut = above(turn_cut, s.truncation_max, s.smooth)
  if cut is not None:
    return (f"length explosion: {_pct(cut)} of model turns were cut by the token budget "
            f"({TURN_CUT} above {_pct(s.truncation_max)}); responses outgrow the budget")
  return ""


def reward_divergence(rewards: Mapping[str, Points], success: Points, held_out: Points,
                      s: Settings) -> str:
  """Evidence when a reward rises over the window while success falls, else ""."""
  step = max(p[-1][0] for p in (*rewards.values(), success, held_out) if p)
  falls, sampled_rose = [], False
  recent = success[-s.divergence_window:]
  if len(recent) >= s.divergence_window:
    tr = trend(recent)
    if tr.change <= -s.success_drop and tr.t <= -s.trend_t:
      falls.append(f"sampled success fell {_pct(tr.start)} -> {_pct(tr.end)}")
    sampled_rose = tr.change >= s.success_rise
  # A held-out drop counts only while sampled success does not rise with the reward: then the
  # reward still tracks the task, and the drop is the evaluation's noise or overfitting.
  if len(held_out) >= 2 and not sampled_rose:
    (was_step, was), (now_step, now) = held_out[-2:]
    fresh = now_step > step - s.divergence_window
    if fresh and was - now >= max(s.success_drop, s.held_out_drop * was):
      falls.append(f"held-out success fell {_pct(was)} -> {_pct(now)} (steps {was_step} -> "
                   f"{now_step})")
  if not falls:
    return ""
  for key, points in rewards.items():
    recent = points[-s.divergence_window:]
    if len(recent) < s.divergence_window:
      continue
    tr = trend(recent)
    scale = float(np.mean([abs(v) for _, v in recent])) or 1.0
    if tr.change >= s.reward_rise * scale and tr.t >= s.trend_t:
      return (f"reward-success divergence: mean {key} rose {tr.start:.2f} -> {tr.end:.2f} over "
              f"steps {tr.first_step}-{tr.last_step} while {' and '.join(falls)}; the reward "
              "may be hacked")
  return ""


def repetition(points: Points, s: Settings) -> str:
  """Evidence when the repetitive-turn fraction is above `repetition_max`, else ""."""
  value = above(points, s.repetition_max, s.smooth)
  if value is None:
    return ""
  return (f"repetition: {_pct(value)} of model turns repeat their own n-grams (above "
          f"{_pct(s.repetition_max)}); the policy may be looping")


def invalid_actions(points: Points, s: Settings) -> str:
  """Evidence when the invalid-turn fraction rose by `invalid_rise` or is above `invalid_max`,
  else ""."""
  value = above(points, s.invalid_max, s.smooth)
  if value is not None:
    return (f"invalid actions: the env rejected {_pct(value)} of the turns (above "
            f"{_pct(s.invalid_max)}); the policy is leaving the action format")
  recent = points[-s.invalid_window:]
  if len(recent) < s.invalid_window:
    return ""
  tr = trend(recent)
  if tr.change >= s.invalid_rise and tr.t >= s.trend_t:
    return (f"invalid actions rising: the env rejected {_pct(tr.start)} -> {_pct(tr.end)} of "
            f"the turns over steps {tr.first_step}-{tr.last_step}; the policy is leaving the "
            "action format")
  return ""


class Monitor:
  """The alarms of one run: keeps the recent points of the metrics they read."""

  def __init__(self, settings: Settings | None = None, run_dir: str = "RUN_DIR"):
    self.settings = settings or Settings()
    self.run_dir = run_dir
    s = self.settings
    keep = max(s.entropy_window, s.length_window + s.smooth, s.divergence_window,
               s.invalid_window, s.smooth)
    self._points: dict[str, collections.deque] = collections.defaultdict(
        lambda: collections.deque(maxlen=keep))
    self.fired: dict[str, int] = {}   # alarm -> the step it first fired

  def _add(self, step: int, record: Mapping[str, object]) -> None:
    for key, value in record.items():
      if (key in _WATCHED or key in REWARD_KEYS) and _number(value):
        self._points[key].append((step, float(value)))

  def _get(self, key: str) -> list[tuple[int, float]]:
    return list(self._points.get(key, ()))

  def _evidence(self, record: Mapping[str, object]) -> dict[str, str]:
    """{alarm: evidence or ""} for the alarms whose inputs the record has."""
    s, has = self.settings, lambda key: _number(record.get(key))
    out = {}
    success, held_out = self._get(SUCCESS), self._get(HELD_OUT)
    if has(ENTROPY) and has(SUCCESS):
      out["entropy_collapse"] = entropy_collapse(self._get(ENTROPY), success, held_out, s)
    if has(LENGTH) or has(TURN_CUT):
      out["length_explosion"] = length_explosion(self._get(LENGTH) if has(LENGTH) else [],
                                                 self._get(TURN_CUT) if has(TURN_CUT) else [], s)
    rewards = {k: self._get(k) for k in REWARD_KEYS if has(k)}
    if rewards and (has(SUCCESS) or has(HELD_OUT)):
      out["reward_divergence"] = reward_divergence(rewards, success, held_out, s)
    if has(REPETITION):
      out["repetition"] = repetition(self._get(REPETITION), s)
    if has(INVALID):
      out["invalid_actions"] = invalid_actions(self._get(INVALID), s)
    return out

  def observe(self, step: int, record: Mapping[str, object]) -> tuple[dict[str, float],
                                                                       list[str]]:
    """({alarm/<name>: 1.0 or 0.0} for the alarms whose inputs `record` has, the warning lines
    of the alarms that fired for the first time in this run)."""
    self._add(step, record)
    metrics, lines = {}, []
    for name, evidence in self._evidence(record).items():
      metrics[f"alarm/{name}"] = 1.0 if evidence else 0.0
      if evidence and name not in self.fired:
        self.fired[name] = step
        lines.append(f"step {step}: {evidence}: read the trajectories of step {step} "
                     f"({VIEWER} {self.run_dir})")
    return metrics, lines

  def replay(self, records: Iterable[Mapping[str, object]], until: int | None = None) -> None:
    """Observes a run's earlier records (those up to step `until`, if given) with the warnings
    discarded: a resumed run neither warns again nor forgets what it saw."""
    for record in records:
      step = record.get("step")
      if isinstance(step, int) and (until is None or step <= until):
        self.observe(step, record)


_WATCHED = frozenset((SUCCESS, HELD_OUT, ENTROPY, LENGTH, TURN_CUT, REPETITION,
                      INVALID))


def _number(value: object) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))
