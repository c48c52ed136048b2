"""Tests for agentrl.envs.fork: every registered env forks exactly, by clone and by replay.

Each env plays a prefix of its episode, is forked in every way it offers, and then the source
and the forks play the same next actions to the end of the episode: their observations,
rewards, done flags and infos must agree. One fork of each way plays before the source and
one after it, so a fork that shared state with its source would diverge. TextWorld and ALFWorld
run as the registry builds them (isolated, replayed in a new worker) on the one game each that
base_test caches in the game pool.
"""
import functools

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.envs import base
from agentrl.envs import budget
from agentrl.envs import fork
from agentrl.envs import hidden_rule
from agentrl.envs import isolated
from agentrl.envs import registry
from agentrl.envs import safe
from agentrl.envs import testing
from agentrl.envs import textworld_env


def _listed(i: int):
  """The i-th admissible command of the last step's info (a TextWorld or ALFWorld game's)."""
  return lambda info: info["admissible_commands"][i]


_CALL = '<tool_call>{{"name": "{}", "arguments": {}}}</tool_call>'
_GAME = dict(kind="custom", world_size=2, nb_objects=2, quest_length=2)   # base_test's game
# name -> (registry.make kwargs, seed, the prefix's actions, the next actions and other next
# actions, both ending the episode; None: the source plays the next actions too). An action
# may be a function of the last step's info.
CASES = {
    "arithmetic": ({}, 3, [], ["0"], [""]),
    "verbose_arithmetic": ({}, 3, [], ["..>0."], [""]),
    # No answer to score: scoring would start a worker process (reasoning_gym_env_test's).
    "reasoning_gym": ({"name": "basic_arithmetic"}, 3, [], [""], None),
    # guess keeps the range its feedback leaves open (the secret is 31), and closeness_reward
    # pays for it at the end: a fork sharing it with its source would end differently.
    "hidden_rule": ({"family": "guess", "max_turns": 5, "closeness_reward": 0.5}, 3,
                    ["guess 50", "guess 25"], ["guess 37", "guess x", "guess 80"],
                    ["guess 30", "guess 28", "guess 27"]),
    "thinker": ({"max_turns": 4}, 3, ["guess 50", "1-49"],
                ["guess 25", "1-24", "guess 12", "?", "guess 6"],
                ["guess 30", "31-49", "guess 40", "x", "guess 35"]),
    "calculator": ({"max_turns": 3}, 3, ["<calc>2*(3+4)</calc>"],
                   ["<calc>1/0</calc>", "<answer>14</answer>"], ["<answer>15</answer>"]),
    "tool_use": ({"max_turns": 3}, 3, [_CALL.format("weekday", '{"date": "2031-05-17"}')],
                 ["no call", _CALL.format("add_days", '{"date": "2031-05-17", "days": 3}')],
                 ["<answer>Monday</answer>"]),
    "search": ({"corpus_size": 20, "max_turns": 3}, 3, ["<search>founded company</search>"],
               ["<search>city</search>", "<answer>nowhere</answer>"], ["<answer>x</answer>"]),
    "textworld": ({**_GAME, "max_turns": 4}, 0, ["look", _listed(1)],
                  [_listed(0), "inventory"], None),
    "alfworld": ({"max_turns": 4}, 0, ["look", _listed(0)], [_listed(1), "inventory"], None),
}
_GAMES = ("textworld", "alfworld")


def _make(name: str):
  kwargs = CASES[name][0]
  if name in _GAMES:
    kwargs = {**kwargs, "pool": textworld_env.pool_dir()}   # the game cached across runs
  return registry.make(name, **kwargs)


def _play(env, actions, info=None):
  """([the step results], [the actions played]): each function action reads the info of the
  step before it."""
  results, played = [], []
  for action in actions:
    played.append(action(info) if callable(action) else action)
    results.append(env.step(played[-1]))
    info = results[-1][3]
  return results, played


class _Plain:
  """An env with neither clone() nor fresh()."""

  system_prompt, max_turns = "", 2

  @base.episode_reset
  def reset(self, seed):
    return f"seed {seed}"

  @base.episode_step
  def step(self, action):
    return action, 0.0, False, base.make_info(reward=0.0)


class _Live(_Plain):
  """An env that could be rebuilt but is not deterministic in (seed, actions)."""

  replayable = False

  def fresh(self):
    return _Live()


class RegisteredEnvsForkTest(parameterized.TestCase):

  def _build(self, name):
    try:
      env = _make(name)
    except ImportError as e:
      self.skipTest(f"{name} needs an optional package: {e}")
    if hasattr(env, "close"):
      self.addCleanup(env.close)
    return env

  def _fork(self, env, **kwargs):
    branch = fork.fork_env(env, **kwargs)
    if hasattr(branch, "close"):
      self.addCleanup(branch.close)
    return branch

  def test_every_registered_env_has_a_case(self):
    self.assertEqual(set(CASES), set(registry.ENVS))

  def _agree(self, envs, actions, info, want=None):
    """(the results every env of `envs` gives for `actions`, which must agree; the actions
    played)."""
    for env in envs:
      got, actions = _play(env, actions, info)
      want = want or got
      self.assertEqual(got, want)
    self.assertTrue(want[-1][2], "the next actions must end the episode")
    return want, actions

  @parameterized.named_parameters((name, name) for name in sorted(CASES))
  def test_forks_continue_as_the_source_does(self, name):
    _, seed, prefix, after, detour = CASES[name]
    env = self._build(name)
    self.assertEqual(fork.mode(env), registry.ENVS[name].fork)
    ways = fork.modes(env)
    self.assertIn(fork.REPLAY, ways)
    env.reset(seed)
    results, prefix = _play(env, prefix)
    self.assertFalse(any(done for _, _, done, _ in results), results)
    info = results[-1][3] if results else None
    # A replayed game is a new process, independent by construction: one fork of it.
    # (reasoning_gym: every other action it could score without a scorer process is alike.)
    roles = ("after",) if detour is None else ("first", "after", "other")
    forks = {role: [self._fork(env, seed=seed, actions=prefix, how=how) for how in ways]
             for role in roles}
    if detour is None:
      self._agree([env, *forks["after"]], after, info)
    else:
      # Forks play first, then the source plays other actions, then the other forks play
      # both: sharing state with the source or each other, they would disagree.
      want, played = self._agree(forks["first"], after, info)
      other, turned = self._agree([env], detour, info)
      self.assertNotEqual(other, want)
      self._agree(forks["after"], played, info, want)
      self._agree(forks["other"], turned, info, other)
    for branch in (env, *(f for fs in forks.values() for f in fs)):   # closed on forks too
      testing.assert_no_episode(self, branch, "look")

  def test_forks_of_an_unstarted_or_finished_env_have_no_episode(self):
    _, seed, prefix, after, _ = CASES["hidden_rule"]
    env = self._build("hidden_rule")
    for how in fork.MODES:
      testing.assert_no_episode(self, fork.fork_env(env, seed=None, how=how), "guess 1")
    env.reset(seed)
    results, played = _play(env, prefix + after)
    self.assertTrue(results[-1][2])
    for how in fork.MODES:
      branch = fork.fork_env(env, seed=seed, actions=played, how=how)
      testing.assert_no_episode(self, branch, "guess 31")
      self.assertEqual(branch.reset(seed), env.reset(seed))   # and can start a new one


class WrappersTest(absltest.TestCase):

  def _stack(self):
    """SafeEnv(BudgetEnv(FewShotEnv(the hidden-rule game))), as a branching run builds it."""
    make_env = registry.factory(registry.task_config(
        "hidden_rule", family="guess", max_turns=5, style="compact", few_shot=1,
        chat_template=True))
    return safe.SafeEnv(budget.BudgetEnv(make_env(), 512))

  def test_forks_see_through_the_wrappers_and_keep_their_state(self):
    env = self._stack()
    self.assertEqual(fork.modes(env), fork.MODES)
    env.step("too early")                          # counted: steps_after_done
    first = env.reset(7)
    self.assertTrue(first.endswith("512 tokens"))   # BudgetEnv's suffix
    prefix = ["guess 50", "", "guess 25"]
    for action in prefix:
      env.step(action)
    forks = [fork.fork_env(env, seed=7, actions=prefix, how=how) for how in fork.MODES]
    # A replay from an earlier point: the wrappers' turn count is that point's.
    early = fork.fork_env(env, seed=7, actions=prefix[:1], how="replay")
    for branch in forks:
      self.assertEqual([type(layer).__name__ for layer in fork.layers(branch)[0]],
                       ["SafeEnv", "BudgetEnv", "FewShotEnv"])
      self.assertEqual(branch.examples, env.examples)
      self.assertIsNot(branch.counters, env.counters)
    self.assertEqual(forks[0].counters, env.counters)    # a clone copies them
    before = [dict(b.counters) for b in forks]
    start = dict(env.counters)
    want = [env.step(a) for a in ("guess 37", "guess 40", "guess 1")]   # the last: after done
    self.assertEqual((want[1][2], env.counters["steps_after_done"]), (True, 2))
    delta = lambda now, then: {k: now[k] - then[k] for k in now}
    for branch, then in zip(forks, before):
      self.assertEqual([branch.step(a) for a in ("guess 37", "guess 40", "guess 1")], want)
      self.assertEqual(delta(branch.counters, then), delta(env.counters, start))
    rest = [env_step for env_step in prefix[1:]] + ["guess 37", "guess 40"]
    self.assertEqual([early.step(a) for a in rest][-2:], want[:2])

  def test_clone_copies_the_game_state_deeply(self):
    env = hidden_rule.HiddenRuleEnv("guess", style="compact")
    env.reset(3)
    env.step("guess 50")
    branch = fork.fork_env(env, seed=3, actions=["guess 50"])
    env.step("guess 25")
    self.assertNotEqual(env.belief, branch.belief)
    self.assertEqual(branch.belief, fork.fork_env(env, seed=3, actions=["guess 50"],
                                                  how="replay").belief)

  def test_replay_raises_when_the_actions_are_not_one_episode(self):
    env = hidden_rule.HiddenRuleEnv("transform")
    env.reset(1)
    with self.assertRaisesRegex(fork.ReplayError,
                                r"HiddenRuleEnv's episode of seed 1: the episode ended at "
                                r"action 0 of 2"):
      fork.fork_env(env, seed=1, actions=["answer 0", "query 1"], how="replay")
    with self.assertRaisesRegex(fork.ReplayError, r"reset raised ValueError: seed=-1"):
      fork.fork_env(env, seed=-1, how="replay")
    with self.assertRaisesRegex(ValueError, r"seed=None .* got 1"):
      fork.fork_env(env, seed=None, actions=["query 1"])


class RefusedTest(absltest.TestCase):

  def test_an_env_that_can_do_neither_is_refused_in_one_line(self):
    for env, message in (
        (safe.SafeEnv(_Plain()), r"^SafeEnv\(_Plain\) cannot be forked for branching: give "
                                 r"_Plain clone\(\) .* or fresh\(\)"),
        (_Live(), r"^_Live cannot be forked for branching: it is not replayable \(replayable = "
                  r"False\) and _Live has no clone\(\)")):
      self.assertFalse(fork.can_fork(env))
      self.assertEqual(fork.mode(env), "")
      for call in (lambda: fork.check(env), lambda: fork.fork_env(env, seed=0)):
        with self.assertRaisesRegex(fork.NotForkable, message) as caught:
          call()
        self.assertNotIn("\n", str(caught.exception))
    self.assertTrue(issubclass(fork.NotForkable, ValueError))

  def test_a_way_the_env_lacks_is_refused(self):
    remote = isolated.IsolatedEnv(functools.partial(testing.ToyEnv, max_turns=3))
    self.addCleanup(remote.close)
    with self.assertRaisesRegex(fork.NotForkable, r"^IsolatedEnv cannot be forked by clone: "
                                                  r"IsolatedEnv has no clone\(\); fork it by "
                                                  r"replay"):
      fork.fork_env(remote, seed=0, how="clone")
    live = isolated.IsolatedEnv(_Live)   # the worker tells whether its env is replayable
    self.addCleanup(live.close)
    with self.assertRaisesRegex(fork.NotForkable, r"^IsolatedEnv cannot be .* not replayable"):
      fork.check(live)

    class Clonable(_Live):
      def clone(self):
        return Clonable()

    self.assertEqual(fork.modes(Clonable()), (fork.CLONE,))
    with self.assertRaisesRegex(fork.NotForkable, r"not replayable .*fork it by clone"):
      fork.check(Clonable(), "replay")
    with self.assertRaisesRegex(ValueError, r"how='copy' must be None or one of"):
      fork.check(Clonable(), "copy")


class InProcessGameTest(absltest.TestCase):

  def test_an_in_process_textworld_env_replays_on_a_fresh_copy(self):
    # The registry's TextWorld runs in a worker process; in-process, fresh() starts the game.
    try:
      path = textworld_env.make_game("custom", 0, pool=textworld_env.pool_dir(),
                                     **{k: v for k, v in _GAME.items() if k != "kind"})
    except ImportError as e:
      self.skipTest(str(e))
    env = textworld_env.TextWorldEnv(game_files=[path], max_turns=5)
    self.addCleanup(env.close)
    self.assertEqual(fork.modes(env), (fork.REPLAY,))
    testing.assert_no_episode(self, fork.fork_env(env, seed=None), "look")
    env.reset(0)
    plan = list(env._state["policy_commands"])
    env.step(plan[0])
    branch = fork.fork_env(env, seed=0, actions=plan[:1])
    self.addCleanup(branch.close)
    self.assertIsNot(branch._game, env._game)
    results = [env.step(a) for a in plan[1:]]
    self.assertTrue(results[-1][2] and results[-1][3]["success"])
    self.assertEqual([branch.step(a) for a in plan[1:]], results)
    finished = fork.fork_env(env, seed=0, actions=plan)
    self.addCleanup(finished.close)
    testing.assert_no_episode(self, finished, "look")


if __name__ == "__main__":
  absltest.main()
