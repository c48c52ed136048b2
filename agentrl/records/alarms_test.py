"""Tests for agentrl.records.alarms: each alarm on its signature, quiet on healthy streams."""
import math
import os

from absl.testing import absltest
import numpy as np

from agentrl.records import alarms
from agentrl.records import metrics

TESTDATA = os.path.join(os.path.dirname(__file__), "testdata")
HEALTHY = {"reward": 0.3, "success": 0.3, "entropy": 0.2, "rollout/response_tokens_mean": 30.0,
           "rollout/turn_cut_frac": 0.01, "rollout/repetition": 0.0,
           "rollout/invalid_turns": 0.03}


def _stream(steps: int, **series) -> list[dict]:
  """Records 1..steps: HEALTHY's constant values, overridden by series (a function of the
  step, or None to drop the key)."""
  records = []
  for step in range(1, steps + 1):
    record = {"step": step, **HEALTHY}
    for key, f in series.items():
      record.pop(key, None)
      value = None if f is None else f(step)
      if value is not None:
        record[key] = value
    records.append(record)
  return records


def _run(records, settings=None):
  """(monitor, [(step, warning)], {step: alarm metrics}) after observing every record."""
  monitor, lines, scalars = alarms.Monitor(settings, run_dir="/runs/x"), [], {}
  for record in records:
    out, warned = monitor.observe(record["step"], record)
    scalars[record["step"]] = out
    lines += [(record["step"], line) for line in warned]
  return monitor, lines, scalars


class TrendTest(absltest.TestCase):

  def test_matches_a_least_squares_fit(self):
    rng = np.random.default_rng(0)
    steps = np.arange(3, 13)
    values = 0.02 * steps + rng.normal(0, 0.05, len(steps))
    tr = alarms.trend(list(zip(steps.tolist(), values.tolist())))
    slope, intercept = np.polyfit(steps, values, 1)
    self.assertAlmostEqual(tr.start, intercept + slope * 3)
    self.assertAlmostEqual(tr.end, intercept + slope * 12)
    resid = values - (intercept + slope * steps)
    se = math.sqrt(resid @ resid / 8 / ((steps - steps.mean()) ** 2).sum())
    self.assertAlmostEqual(tr.t, slope / se)
    self.assertEqual((tr.first_step, tr.last_step), (3, 12))

  def test_exact_lines(self):
    self.assertEqual(alarms.trend([(1, 0.1), (2, 0.2), (3, 0.3)]).t, math.inf)
    self.assertEqual(alarms.trend([(1, 0.3), (2, 0.2), (3, 0.1)]).t, -math.inf)
    self.assertEqual(alarms.trend([(1, 0.3), (2, 0.3), (3, 0.3)]).t, 0.0)


class MonitorTest(absltest.TestCase):

  def test_healthy_noisy_improving_stream_fires_nothing(self):
    rng = np.random.default_rng(1)
    noise = {s: rng.normal(0, 1, 8) for s in range(1, 101)}
    success = lambda s: float(np.clip(0.3 + 0.002 * s + 0.07 * noise[s][0], 0, 1))
    records = _stream(
        100, success=success, reward=success,
        entropy=lambda s: 0.2 - 0.0005 * s + 0.02 * noise[s][1],
        **{"rollout/response_tokens_mean": lambda s: 30 + 2 * noise[s][2],
           "rollout/turn_cut_frac": lambda s: abs(0.02 * noise[s][3]),
           "rollout/repetition": lambda s: abs(0.02 * noise[s][4]),
           "rollout/invalid_turns": lambda s: 0.03 + abs(0.01 * noise[s][5]),
           "eval/success": lambda s: 0.35 + 0.002 * s + 0.03 * noise[s][6]
                                     if s % 10 == 0 else None})
    monitor, lines, scalars = _run(records)
    self.assertEqual(lines, [])
    self.assertEqual(monitor.fired, {})
    self.assertEqual(scalars[50], {f"alarm/{name}": 0.0 for name in alarms.ALARMS})

  def test_entropy_collapse_while_success_is_flat(self):
    entropy = lambda s: 0.2 - 0.01 * (s - 1)    # first below 0.05 at step 17
    monitor, lines, scalars = _run(_stream(25, entropy=entropy))
    self.assertEqual(monitor.fired, {"entropy_collapse": 17})
    self.assertEqual([step for step, _ in lines], [17])
    self.assertIn("entropy 0.040 is below 0.05 while success did not rise over steps 1-17",
                  lines[0][1])
    self.assertEqual(scalars[16]["alarm/entropy_collapse"], 0.0)
    self.assertEqual(scalars[25]["alarm/entropy_collapse"], 1.0)   # still holds, no new line
    # The same entropy while success climbs is learning, not a collapse.
    rising = lambda s: 0.2 + 0.02 * s
    self.assertEqual(_run(_stream(25, entropy=entropy, success=rising))[0].fired, {})

  def test_length_explosion_doubling_and_truncation(self):
    length = lambda s: 30.0 if s <= 10 else min(60.0, 30.0 + 6 * (s - 10))   # 60 at step 15
    monitor, lines, _ = _run(_stream(20, **{"rollout/response_tokens_mean": length}))
    # The median of 3 steps reaches twice the window's lowest level one step after the peak.
    self.assertEqual(monitor.fired, {"length_explosion": 16})
    self.assertIn("mean response length rose 30.0 -> 60.0 tokens over steps", lines[0][1])
    cut = lambda s: 0.5 if s >= 20 else 0.01
    self.assertEqual(_run(_stream(25, **{"rollout/turn_cut_frac": cut}))[0].fired,
                     {"length_explosion": 21})
    spike = lambda s: 0.9 if s == 12 else 0.01   # one step is not a trend
    self.assertEqual(_run(_stream(25, **{"rollout/turn_cut_frac": spike}))[0].fired, {})

  def test_reward_divergence_on_sampled_success(self):
    # SIOP's signature: its turn reward climbs while the task's success falls by 0.01 a step
    # under +-0.03 of noise. The first full window, steps 1-10, fits a fall with t = -2.25
    # (short of trend_t = 2.5 for this phase of the noise); steps 2-11 reach t = -3.25.
    noisy = lambda s: 0.3 - 0.01 * s + 0.03 * (-1) ** s
    records = _stream(30, siop_reward_mean=lambda s: 0.1 + 0.01 * s, success=noisy,
                      reward=noisy)
    monitor, lines, _ = _run(records)
    self.assertEqual(monitor.fired, {"reward_divergence": 11})
    step, line = lines[0]
    self.assertEqual(step, 11)
    self.assertStartsWith(line, "step 11: reward-success divergence: mean siop_reward_mean "
                                "rose 0.12 -> 0.21 over steps 2-11 while sampled success fell "
                                "29% -> 18%")
    self.assertEndsWith(line, "the reward may be hacked: read the trajectories of step 11 "
                              "(scripts/view_trajectories.py /runs/x)")

  def test_reward_divergence_on_held_out_success(self):
    held_out = {10: 0.36, 20: 0.16}
    records = _stream(25, reward=lambda s: 0.1 + 0.01 * s,
                      **{"eval/success": held_out.get})
    monitor, lines, _ = _run(records)
    self.assertEqual(monitor.fired, {"reward_divergence": 20})
    self.assertIn("while held-out success fell 36% -> 16% (steps 10 -> 20)", lines[0][1])

  def test_no_divergence_when_success_follows_the_reward(self):
    rising = lambda s: 0.1 + 0.01 * s
    self.assertEqual(_run(_stream(30, reward=rising, success=rising))[0].fired, {})
    # A held-out dip while sampled success rises with the reward is the evaluation's noise.
    dip = {10: 0.47, 20: 0.25}.get
    self.assertEqual(_run(_stream(30, reward=rising, success=rising,
                                  **{"eval/success": dip}))[0].fired, {})
    # A reward that only wobbles is no rise, even while success falls.
    wobble = lambda s: 0.3 + 0.05 * (-1) ** s
    falling = lambda s: 0.3 - 0.01 * s
    self.assertEqual(_run(_stream(30, reward=wobble, success=falling))[0].fired, {})

  def test_repetition(self):
    high = lambda s: 0.6 if s >= 5 else 0.0    # the median of 3 is high from step 6
    monitor, lines, _ = _run(_stream(10, **{"rollout/repetition": high}))
    self.assertEqual(monitor.fired, {"repetition": 6})
    self.assertIn("repetition: 60% of model turns repeat their own n-grams", lines[0][1])
    spike = lambda s: 0.9 if s == 5 else 0.0
    self.assertEqual(_run(_stream(10, **{"rollout/repetition": spike}))[0].fired, {})

  def test_invalid_actions_rising_or_high(self):
    rising = lambda s: 0.02 + 0.01 * s   # +0.09 over the first full window, steps 1-10
    monitor, lines, _ = _run(_stream(15, **{"rollout/invalid_turns": rising}))
    self.assertEqual(monitor.fired, {"invalid_actions": 10})
    self.assertIn("the env rejected 3% -> 12% of the turns over steps 1-10", lines[0][1])
    high = lambda s: 0.8 if s >= 3 else 0.03
    self.assertEqual(_run(_stream(10, **{"rollout/invalid_turns": high}))[0].fired,
                     {"invalid_actions": 4})

  def test_only_alarms_whose_inputs_the_record_has(self):
    monitor = alarms.Monitor()
    self.assertEqual(monitor.observe(0, {"eval/success": 0.3}), ({}, []))
    got, _ = monitor.observe(1, {"reward": 0.2, "success": 0.2, "entropy": 0.3})
    self.assertEqual(got, {"alarm/entropy_collapse": 0.0, "alarm/reward_divergence": 0.0})
    got, _ = monitor.observe(2, {"rollout/turn_cut_frac": 0.0, "rollout/invalid_turns": 0.1,
                                 "rollout/repetition": float("nan")})
    self.assertEqual(got, {"alarm/length_explosion": 0.0, "alarm/invalid_actions": 0.0})

  def test_replay_neither_warns_again_nor_forgets(self):
    records = _stream(30, siop_reward_mean=lambda s: 0.1 + 0.01 * s,
                      success=lambda s: 0.3 - 0.01 * s, entropy=lambda s: 0.2 - 0.01 * s)
    _, lines, scalars = _run(records)
    self.assertEqual([step for step, _ in lines], [10, 16])   # divergence, entropy
    for resume in (5, 12, 20):
      monitor = alarms.Monitor(run_dir="/runs/x")
      monitor.replay(records, until=resume)   # a killed run's later records are not replayed
      after = [(r["step"], *monitor.observe(r["step"], r)) for r in records[resume:]]
      self.assertEqual([(s, line) for s, _, warned in after for line in warned],
                       [(s, line) for s, line in lines if s > resume], resume)
      self.assertEqual({s: out for s, out, _ in after},
                       {s: out for s, out in scalars.items() if s > resume})

  def test_settings_refuse_a_window_too_short_for_a_trend(self):
    with self.assertRaisesRegex(ValueError, "divergence_window=2: a trend needs at least 3"):
      alarms.Settings(divergence_window=2)


class RealRunTest(absltest.TestCase):
  """The monitor over the metrics of real runs (testdata/README.md)."""

  def _fired(self, name: str, drop: str = "") -> tuple[dict[str, int], list[str]]:
    records = metrics.read_jsonl(os.path.join(TESTDATA, name))
    monitor, lines, _ = _run([{k: v for k, v in r.items() if k != drop} for r in records])
    return monitor.fired, [line for _, line in lines]

  def test_siop_fires_the_divergence_alarm(self):
    fired, lines = self._fired("siop_hidden_rule_metrics.jsonl")
    # Its first evaluation after step 0 (36% -> 16%), with its turn reward up from 0.07 to
    # 0.17; its invalid turns then double (4% -> 9% over steps 10-19).
    self.assertEqual(fired, {"reward_divergence": 10, "invalid_actions": 19})
    self.assertStartsWith(lines[0], "step 10: reward-success divergence: mean siop_reward_mean "
                                    "rose 0.07 -> 0.17 over steps 1-10 while held-out success "
                                    "fell 36% -> 16% (steps 0 -> 10)")
    # Without evaluations, sampled success alone (33% -> 10% over steps 4-13) fires it.
    fired, lines = self._fired("siop_hidden_rule_metrics.jsonl", drop="eval/success")
    self.assertEqual(fired["reward_divergence"], 13)
    self.assertIn("while sampled success fell 33% -> 10%", lines[0])

  def test_grpo_runs_stay_quiet(self):
    # TextWorld's held-out success dips 47% -> 25% at step 20 while the reward rises: sampled
    # success rises with it, so that dip is the 64-game evaluation's noise, not hacking.
    for name in ("grpo_hidden_rule_metrics.jsonl", "grpo_textworld_metrics.jsonl"):
      self.assertEqual(self._fired(name), ({}, []), name)


if __name__ == "__main__":
  absltest.main()
