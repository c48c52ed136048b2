"""Tests for agentrl.harness.rl_config's up-front checks: sizes that cannot fit, keys an init
ignores."""
from unittest import mock

from absl.testing import absltest

from agentrl import configs
from agentrl.harness import rl_config

SCHEMA = {**rl_config.RL_SCHEMA, "loss.eps": configs.Key(float, min=0.0)}


def _config(preset: str = "cpu", smoke: bool = True):
  c = rl_config.rl_config(preset, smoke=smoke)
  c.loss = dict(eps=0.2)
  return c


class SizeTest(absltest.TestCase):

  def test_a_rollout_that_cannot_fit_in_memory_is_refused_up_front(self):
    config = _config()
    config.rollout.max_len = 10**12
    with self.assertRaisesRegex(
        configs.ConfigError,
        r"^config\.rollout\.max_len \(1000000000000\), rollout\.slots \(512\), "
        r"rollout\.prompts_per_step \(2\) and rollout\.group_size \(2\) need ~[\d.]+ [GTP]iB per "
        r"device .* more than the [\d.]+ [GT]iB of (host RAM|.* memory); lower them$"):
      rl_config.validate(config, SCHEMA)

  def test_the_estimate_counts_the_kv_cache_of_the_named_variant(self):
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, float32 keys and values = 46080 bytes a
    # token; 16 slots x 320 tokens = 0.22 GiB, and the packed batch 8 x 320 x 24 bytes.
    config = _config("smollm2", smoke=False)
    gib = 2**30
    with mock.patch.object(rl_config, "device_memory", return_value=(0.2 * gib, "test memory")):
      with self.assertRaisesRegex(configs.ConfigError,
                                  r"need ~0\.22 GiB per device .* than the 0\.20 GiB of test "
                                  r"memory"):
        rl_config.validate(config, SCHEMA)
    with mock.patch.object(rl_config, "device_memory", return_value=(0.3 * gib, "test memory")):
      rl_config.validate(config, SCHEMA)

  def test_more_turns_than_transcript_tokens_is_refused(self):
    config = _config()
    config.task.max_turns = 10**6
    with self.assertRaisesRegex(configs.ConfigError,
                                r"^config\.task\.max_turns \(1000000\) must be <= "
                                r"config\.rollout\.max_len \(24\)"):
      rl_config.validate(config, SCHEMA)


class InitKeysTest(absltest.TestCase):

  def test_a_model_path_with_a_scratch_model_is_refused(self):
    config = _config()
    config.model.path = "/no/such/model"
    with self.assertRaisesRegex(configs.ConfigError,
                                r"^config\.model\.path='/no/such/model' is not read with "
                                r"model\.init='scratch'"):
      rl_config.validate(config, SCHEMA)


if __name__ == "__main__":
  absltest.main()
