"""Tests for agentrl.data.generators: seeded sources, held-out split, env prompts."""
import functools

from absl.testing import absltest

from agentrl.data import generators
from agentrl.data import stream
from agentrl.envs import arithmetic
from agentrl.envs import hidden_rule


class GeneratorSourceTest(absltest.TestCase):

  def test_entries_are_the_generator_at_each_seed(self):
    fn = functools.partial(arithmetic.make_problem, digits=2)
    source = generators.GeneratorSource(fn, start=100, stop=110)
    self.assertLen(source, 10)
    self.assertEqual(source[3], {**fn(103), "seed": 103})
    with self.assertRaises(IndexError):
      source[10]  # pylint: disable=pointless-statement

  def test_split_by_seed_is_disjoint_and_deterministic(self):
    train, heldout = generators.split_by_seed(arithmetic.make_problem, heldout_size=50)
    self.assertEqual(len(heldout), 50)
    self.assertEqual(heldout[0]["seed"], generators.HELDOUT_START)
    self.assertLess(train[len(train) - 1]["seed"], heldout[0]["seed"])
    train2, heldout2 = generators.split_by_seed(arithmetic.make_problem, heldout_size=50)
    self.assertEqual([heldout[i] for i in range(50)], [heldout2[i] for i in range(50)])
    self.assertEqual(train[12345], train2[12345])
    with self.assertRaisesRegex(ValueError, "heldout_size"):
      generators.split_by_seed(arithmetic.make_problem, heldout_size=0)

  def test_stream_over_a_generator_resumes(self):
    train, _ = generators.split_by_seed(arithmetic.make_problem, heldout_size=1)
    s = stream.PromptStream(train, shuffle=False)
    head = s.take(5)
    resumed = stream.PromptStream(train, shuffle=False)
    resumed.restore(s.state())
    self.assertEqual([e["seed"] for e in head + resumed.take(3)], list(range(8)))

  def test_env_prompts(self):
    env = hidden_rule.HiddenRuleEnv("cipher")
    source = generators.GeneratorSource(generators.env_prompts(env), 0, 5)
    entry = source[2]
    self.assertEqual(entry["prompt"], hidden_rule.HiddenRuleEnv("cipher").reset(2))
    self.assertEqual(entry["system_prompt"], env.system_prompt)
    self.assertEqual(entry["seed"], 2)

  def test_bad_generators(self):
    with self.assertRaisesRegex(TypeError, "callable"):
      generators.GeneratorSource(42)
    with self.assertRaisesRegex(ValueError, "start < stop"):
      generators.GeneratorSource(arithmetic.make_problem, 5, 5)
    with self.assertRaisesRegex(TypeError, "'prompt'"):
      generators.GeneratorSource(lambda seed: seed, 0, 1)[0]


if __name__ == "__main__":
  absltest.main()
