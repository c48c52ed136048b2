"""The exported tokenizer tokenizes exactly as ours, BOS included; transformers round trip.

The transformers check runs when `transformers` is importable here, or in the interpreter named
by AGENTRL_HF_PYTHON (a venv with torch + transformers, as scripts/bench_sampler.py's
--hf_python), so neither becomes a dependency; otherwise it is skipped with the reason.
"""
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
import jax
import ml_collections as mlc
from flax import nnx

from agentrl import recipe
from agentrl import sharding
from agentrl.envs import arithmetic
from agentrl.envs import hidden_rule
from agentrl.models import hf
from agentrl.models import hf_tokenizer
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.rollout import sampler as sampler_lib


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _texts(extra):
  rng = random.Random(0)
  fixed = ["", "123+456=", "9750", "1-2", " lead", "trail  ", "a  b\n\tc", "héllo ✓ 𝔘",
           "<|im_start|>user\nhi<|im_end|>\n"]
  noise = ["".join(rng.choice("ab cd12+=-\n✓") for _ in range(rng.randint(0, 24)))
           for _ in range(100)]
  return fixed + list(extra) + noise


def _tokenizers():
  env = hidden_rule.HiddenRuleEnv("mixed", max_turns=4)
  return {
      "arithmetic (sentencepiece char)": (
          arithmetic.build_tokenizer(3),
          [arithmetic.make_problem(s, digits=3)["prompt"] for s in range(30)]),
      "hidden_rule (sentencepiece BPE)": (
          recipe.task_tokenizer(mlc.ConfigDict(dict(name="hidden_rule", family="mixed",
                                                    max_turns=4))),
          [env.reset(s) for s in range(300, 330)]),
  }


class ExportTest(absltest.TestCase):

  def test_same_ids_and_bos_as_ours(self):
    for name, (tok, extra) in _tokenizers().items():
      exported = hf_tokenizer.to_hf(tok)
      for text in _texts(extra):
        ours = tok.encode(text)
        self.assertEqual(exported.encode(text, add_special_tokens=False).ids, ours,
                         f"{name}: {text!r}")
        # transformers' default (add_special_tokens=True) = our plain-text prompt: BOS first.
        self.assertEqual(exported.encode(text).ids, tok.encode(text, add_bos=True),
                         f"{name}: {text!r}")

  def test_saved_directory_reads_back_identically(self):
    for tok, extra in _tokenizers().values():
      directory = _tmpdir(self)
      written = hf_tokenizer.save(tok, directory)
      self.assertIn(os.path.join(directory, "tokenizer.json"), written)
      with open(os.path.join(directory, "tokenizer_config.json")) as f:
        config = json.load(f)
      self.assertTrue(config["add_bos_token"])
      back = tokenizer_lib.load(directory)
      self.assertEqual((back.bos_id, back.eos_id, back.pad_id),
                       (tok.bos_id, tok.eos_id, tok.pad_id))
      for text in _texts(extra):
        self.assertEqual(back.encode(text), tok.encode(text), text)


_HF_SCRIPT = r"""
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
d, prompts = sys.argv[1], json.loads(sys.argv[2])
tok, model = AutoTokenizer.from_pretrained(d), AutoModelForCausalLM.from_pretrained(d)
out = []
for p in prompts:
  ids = tok(p, return_tensors="pt").input_ids
  gen = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id)
  out.append({"ids": ids[0].tolist(), "new": gen[0, ids.shape[1]:].tolist()})
print(json.dumps(out))
"""


def _hf_python() -> str | None:
  if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
    return sys.executable
  return os.environ.get("AGENTRL_HF_PYTHON") or None


class TransformersRoundTripTest(absltest.TestCase):

  def test_exported_model_generates_what_our_sampler_generates(self):
    python = _hf_python()
    if python is None:
      self.skipTest("transformers/torch not importable and AGENTRL_HF_PYTHON unset")
    config = recipe.rl_config("cpu", smoke=True)
    mesh = sharding.make_mesh(config.mesh)
    tok, graphdef, params = recipe.build_policy(config, mesh)
    directory = _tmpdir(self)
    hf.save(nnx.merge(graphdef, params).cfg, params, directory)
    hf_tokenizer.save(tok, directory)
    prompts = [arithmetic.make_problem(s, digits=3)["prompt"] for s in range(3)]
    proc = subprocess.run([python, "-c", _HF_SCRIPT, directory, json.dumps(prompts)],
                          capture_output=True, text=True, timeout=600, check=True)
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    sampler = sampler_lib.Sampler(graphdef, pad_id=tok.pad_id)
    for prompt, hf_out in zip(prompts, theirs):
      ids = tok.encode(prompt, add_bos=True)
      self.assertEqual(hf_out["ids"], ids)
      out = sampler.generate(params, [ids], rng=jax.random.key(0), max_new_tokens=6,
                             greedy=True, stop_ids=[tok.eos_id])
      ours = [int(t) for t in out.tokens_BN[0, :int(out.lengths_B[0])]]
      self.assertEqual(hf_out["new"][:len(ours)], ours, prompt)


if __name__ == "__main__":
  absltest.main()
