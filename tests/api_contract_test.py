"""The public names of docs/architecture.md section 3 exist where the contract puts them."""
import importlib

from absl.testing import absltest
from absl.testing import parameterized

CONTRACT = {
    "agentrl.losses.ratios": "token_log_ratio sequence_log_ratio cumulative_log_ratio "
                             "holder_log_ratio",
    "agentrl.losses.policy": "vanilla_pg ppo_clip gspo gspo_token ctpo holder_po r2vpo "
                             "r2vpo_dual_update gmpo cispo sapo clip_cov kl_cov",
    "agentrl.losses.aggregation": "aggregate normalizer",
    "agentrl.losses.kl": "kl_penalty",
    "agentrl.losses.regularizers": "entropy_bonus ratio_variance",
    "agentrl.losses.value": "clipped_value_loss",
    "agentrl.losses.preference": "bradley_terry dpo",
    "agentrl.losses.schedules": "holder_p",
    "agentrl.types": "Batch TrainState grouped centre",
    "agentrl.advantages.estimators": "grpo rloo reinforce_pp reinforce_pp_baseline remax opo "
                                     "gae turn_group information_gain discounted_turn_returns",
    "agentrl.models.transformer": "Config Transformer",
    "agentrl.models.heads": "ValueHead RewardHead",
    "agentrl.models.hf": "load save",
    "agentrl.models.tokenizer": "load",
    "agentrl.models.policy": "token_logprobs",
    "agentrl.rollout.sampler": "generate",
    "agentrl.rollout.agent_loop": "run",
    "agentrl.envs.base": "Env",
    "kernels.logprob": "token_logprobs",
}


class ContractTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(CONTRACT.items()))
  def test_names_exist(self, module, names):
    mod = importlib.import_module(module)
    missing = [n for n in names.split() if not hasattr(mod, n)]
    self.assertEqual(missing, [], f"{module} lacks contract names")

  def test_logprob_impls(self):
    ops = importlib.import_module("kernels.logprob.ops")
    self.assertContainsSubset({"auto", "xla", "pallas", "reference"}, set(ops.IMPLS))


if __name__ == "__main__":
  absltest.main()
