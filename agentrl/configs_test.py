"""Tests for agentrl.configs: preset parsing and validation error messages."""
from absl.testing import absltest
import ml_collections as mlc

from agentrl import configs


class ParseArgTest(absltest.TestCase):

  def test_typed_values_and_bare_flags(self):
    arg = configs.parse_arg("smoke,size=tiny,steps=7,lr=0.5", smoke=False, size="1b", steps=1,
                            lr=1e-3)
    self.assertIsInstance(arg, mlc.ConfigDict)
    self.assertEqual((arg.smoke, arg.size, arg.steps, arg.lr), (True, "tiny", 7, 0.5))
    self.assertIsInstance(arg.steps, int)

  def test_defaults_when_empty_or_none(self):
    for arg in (None, "", " , "):
      parsed = configs.parse_arg(arg, smoke=False, size="1b")
      self.assertEqual((parsed.smoke, parsed.size), (False, "1b"))

  def test_single_valued_default_takes_a_bare_word(self):
    self.assertEqual(configs.parse_arg("tiny", size="1b", smoke=False).size, "tiny")
    self.assertTrue(configs.parse_arg("smoke", size="1b", smoke=False).smoke)

  def test_bool_false_spelling(self):
    self.assertFalse(configs.parse_arg("smoke=false", smoke=True).smoke)

  def test_unknown_arg_lists_accepted_names(self):
    with self.assertRaisesRegex(configs.ConfigError, r"unknown config arg 'smok'.*size, smoke"):
      configs.parse_arg("smok,size=x", smoke=False, size="a")

  def test_wrong_type_names_the_arg(self):
    with self.assertRaisesRegex(configs.ConfigError, r"'steps' must be int, got 'ten'"):
      configs.parse_arg("steps=ten", steps=1)
    with self.assertRaisesRegex(configs.ConfigError, r"'smoke' must be a boolean"):
      configs.parse_arg("smoke=maybe", smoke=False)


def _config():
  c = mlc.ConfigDict()
  c.total_steps = 10
  c.rollout = dict(group_size=8, temperature=1.0)
  c.loss = dict(agg="token-mean")
  c.mesh = dict(data=-1)
  c.notes = None
  return c


_SCHEMA = {
    "total_steps": configs.Key(int, min=1),
    "rollout.group_size": configs.Key(int, min=2, why="for GRPO"),
    "rollout.temperature": configs.Key(float, min=1e-3),
    "loss.agg": configs.Key(str, choices=("token-mean", "seq-mean-token-mean")),
    "mesh": configs.Key(dict),
    "notes": configs.Key(str, optional=True),
}


class ValidateTest(absltest.TestCase):

  def test_valid_config_passes(self):
    configs.validate(_config(), _SCHEMA)

  def test_out_of_range_message_names_key_and_reason(self):
    c = _config()
    c.rollout.group_size = 1
    with self.assertRaisesRegex(
        configs.ConfigError,
        r"^config\.rollout\.group_size must be >= 2 for GRPO, got 1$"):
      configs.validate(c, _SCHEMA)

  def test_wrong_type(self):
    with self.assertRaisesRegex(configs.ConfigError, r"config\.total_steps must be int, got str"):
      configs.check_key("total_steps", "10", _SCHEMA["total_steps"])
    with self.assertRaisesRegex(configs.ConfigError, r"must be int, got bool"):
      configs.check_key("total_steps", True, _SCHEMA["total_steps"])

  def test_int_is_accepted_where_float_is_expected(self):
    configs.check_key("rollout.temperature", 1, _SCHEMA["rollout.temperature"])
    with self.assertRaisesRegex(configs.ConfigError, "must be finite"):
      configs.check_key("rollout.temperature", float("nan"), _SCHEMA["rollout.temperature"])

  def test_choices(self):
    c = _config()
    c.loss.agg = "mean"
    with self.assertRaisesRegex(configs.ConfigError, r"config\.loss\.agg must be one of"):
      configs.validate(c, _SCHEMA)

  def test_unknown_key_is_rejected_with_hint(self):
    c = _config()
    c.group_size = 4
    with self.assertRaisesRegex(
        configs.ConfigError,
        r"config\.group_size is not a key .*did you mean config\.rollout\.group_size"):
      configs.validate(c, _SCHEMA)

  def test_missing_key(self):
    c = _config()
    del c.rollout["temperature"]
    with self.assertRaisesRegex(configs.ConfigError, r"config\.rollout\.temperature is missing"):
      configs.validate(c, _SCHEMA)

  def test_allow_extra_prefix(self):
    c = _config()
    c.wandb = dict(project="x", tags=["a"])
    with self.assertRaises(configs.ConfigError):
      configs.validate(c, _SCHEMA)
    configs.validate(c, _SCHEMA, allow_extra=("wandb",))

  def test_none_only_when_optional(self):
    with self.assertRaisesRegex(configs.ConfigError, r"config\.total_steps must be set"):
      configs.check_key("total_steps", None, _SCHEMA["total_steps"])
    configs.check_key("notes", None, _SCHEMA["notes"])

  def test_sequence_length_bounds(self):
    key = configs.Key(list, min=1)
    configs.check_key("rules", [("embed", "fsdp")], key)
    with self.assertRaisesRegex(configs.ConfigError, r"config\.rules length must be >= 1"):
      configs.check_key("rules", [], key)

  def test_divides(self):
    configs.divides("update.minibatches", 4, "the batch", 16)
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.update\.minibatches \(3\) must divide the batch \(16\)"):
      configs.divides("update.minibatches", 3, "the batch", 16)


if __name__ == "__main__":
  absltest.main()
