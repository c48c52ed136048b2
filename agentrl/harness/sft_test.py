"""Tests for agentrl.harness.sft: demonstration transcripts and the stopping rule of the warm
start."""
import random

from absl.testing import absltest
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.envs import arithmetic
from agentrl.envs import hidden_rule
from agentrl.harness import recipe
from agentrl.harness import sft
from agentrl.models import transformer
from agentrl import sharding

MAX_LEN = 64
TASK = mlc.ConfigDict(dict(name="hidden_rule", family="guess", max_turns=7, style="compact"))


def _guess_env():
  return hidden_rule.HiddenRuleEnv("guess", max_turns=7, style="compact")


def _seed_of_secret(secret: int) -> int:
  env = _guess_env()
  return next(s for s in range(2000) if env.reset(s) and env.answer == str(secret))


class DemonstrationBatchTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tok = recipe.task_tokenizer(TASK)

  def test_golden_transcript_of_a_binary_search(self):
    # Secret 37: the expert guesses 50 (lower), 25 (higher), 37 (correct).
    batch = sft.demonstration_batch(self.tok, _guess_env, [_seed_of_secret(37)],
                                    max_len=MAX_LEN, chat_template=False, noise=0.0)
    tokens, mask = batch["tokens_BT"][0], batch["loss_mask_BT"][0]
    real = batch["input_mask_BT"][0]
    self.assertEqual(self.tok.decode(tokens[real].tolist()),
                     "<s>number 1-100? guess X: higher/lower (7 turns)"
                     "guess 50</s>lowerguess 25</s>higherguess 37</s>")
    eos = self.tok.eos_id
    policy = tokens[mask > 0].tolist()
    self.assertEqual(policy, (self.tok.encode("guess 50") + [eos] + self.tok.encode("guess 25")
                              + [eos] + self.tok.encode("guess 37") + [eos]))
    # Everything else is context: the prompt (with BOS), the replies and the padding.
    self.assertEqual(tokens[0], self.tok.bos_id)
    context = tokens[(mask == 0) & real].tolist()
    self.assertEqual(self.tok.decode(context), "<s>number 1-100? guess X: higher/lower (7 turns)"
                     "lowerhigher")
    np.testing.assert_array_equal(mask[~real], 0.0)
    np.testing.assert_array_equal(batch["positions_BT"][0][real], np.arange(real.sum()))

  def test_batches_are_fixed_shape_and_reproducible(self):
    seeds = range(sft.SFT_SEED_BASE, sft.SFT_SEED_BASE + 16)
    a = sft.demonstration_batch(self.tok, _guess_env, seeds, max_len=MAX_LEN,
                                chat_template=False, noise=0.5)
    b = sft.demonstration_batch(self.tok, _guess_env, seeds, max_len=MAX_LEN,
                                chat_template=False, noise=0.5)
    for name in ("tokens_BT", "positions_BT", "input_mask_BT", "loss_mask_BT"):
      self.assertEqual(a[name].shape, (16, MAX_LEN))
      np.testing.assert_array_equal(a[name], b[name])
    # The policy tokens of every row decode to the actions the env's expert chose.
    env = _guess_env()
    for row, seed in enumerate(seeds):
      actions = env.demonstration(seed, random.Random(seed), noise=0.5)
      ids = a["tokens_BT"][row][a["loss_mask_BT"][row] > 0].tolist()
      self.assertEqual(ids.count(self.tok.eos_id), len(actions))
      self.assertEqual(self.tok.decode(ids, skip_special=True), "".join(actions))

  def test_data_walks_the_sft_seeds(self):
    data = sft.demonstration_data(self.tok, _guess_env, batch_size=4, max_len=MAX_LEN,
                                  chat_template=False, noise=0.0, success=lambda p: 0.5)
    second = sft.demonstration_batch(self.tok, _guess_env,
                                     range(sft.SFT_SEED_BASE + 4, sft.SFT_SEED_BASE + 8),
                                     max_len=MAX_LEN, chat_template=False, noise=0.0)
    np.testing.assert_array_equal(data.batch(1)["tokens_BT"], second["tokens_BT"])
    self.assertEqual(data.success(None), 0.5)


class WarmStartTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tok = arithmetic.build_tokenizer(2)
    cls.mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1))
    cfg = transformer.Config.named("tiny", vocab=cls.tok.vocab_size)
    cls.graphdef, cls.params = nnx.split(transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
    cls.kwargs = dict(mesh=cls.mesh, rules=list(sharding.DEFAULT_RULES), logprob_impl="xla",
                      batch_size=8, lr=1e-3, b2=0.99, clip_norm=1.0, eval_problems=8,
                      log=lambda _: None)

  def _data(self, successes):
    """Arithmetic batches with a scripted success measure: successes[k] at its k-th call."""
    real = sft.arithmetic_data(self.graphdef, self.tok, digits=2, batch_size=8,
                               eval_problems=8, mesh=self.mesh)
    calls = iter(successes)
    return sft.Data(batch=real.batch, success=lambda params: next(calls))

  def test_stops_at_the_first_validation_that_reaches_the_target(self):
    params = jax.tree.map(jax.numpy.copy, self.params)
    _, info = sft.warm_start(self.graphdef, params, self.tok, steps_max=50,
                             target_success=0.3, eval_every=2,
                             data=self._data([0.0, 0.1, 0.35, 0.9]), **self.kwargs)
    self.assertEqual((info["steps"], info["success"], info["stopped"]), (4, 0.35, "target"))
    self.assertEqual([h["step"] for h in info["history"]], [2, 4])

  def test_steps_max_ends_it_below_the_target(self):
    params = jax.tree.map(jax.numpy.copy, self.params)
    _, info = sft.warm_start(self.graphdef, params, self.tok, steps_max=3,
                             target_success=0.3, eval_every=2,
                             data=self._data([0.0, 0.1, 0.2]), **self.kwargs)
    self.assertEqual((info["steps"], info["success"], info["stopped"]), (3, 0.2, "steps_max"))

  def test_needs_digits_or_data(self):
    with self.assertRaisesRegex(ValueError, "digits"):
      sft.warm_start(self.graphdef, self.params, self.tok, steps_max=1, target_success=1.0,
                     eval_every=1, **self.kwargs)


if __name__ == "__main__":
  absltest.main()
