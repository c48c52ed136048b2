"""Tests of tokenizer loading (sentencepiece, tokenizer.json, GGUF) and chat templates.

The SmolLM2 GGUF vocabulary is compared with transformers' ids in tests/parity_test.py.
"""
import json
import os
import tempfile

from absl.testing import absltest
import jinja2

from agentrl.models import gguf_file
from agentrl.models import tokenizer

_WORDS = ("the cat sat on a mat while seven dogs ran past the old red barn and "
          "everyone counted 12 + 30 = 42 twice").split()
LINES = [" ".join(_WORDS[(i * 7 + j) % len(_WORDS)] for j in range(12)) for i in range(300)]


def _hf_tokenizer_dir(config):
  """A small byte-level BPE tokenizer.json (+ tokenizer_config.json) trained in-process."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>",
                                                                "<start_of_turn>",
                                                                "<end_of_turn>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(LINES, trainer)
  path = tempfile.mkdtemp()
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump(config, f)
  return path


GEMMA_STYLE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('Only user and assistant roles') }}{% endif %}"
    "{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


class SentencePieceTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.path = os.path.join(tempfile.mkdtemp(), "tok.model")
    cls.tok = tokenizer.train_sentencepiece(LINES, 400, path=cls.path)

  def test_round_trip_and_ids(self):
    tok = self.tok
    self.assertEqual((tok.pad_id, tok.bos_id, tok.eos_id), (0, 2, 3))
    self.assertLessEqual(tok.vocab_size, 400)
    text = "the cat  counted 1234 dogs,\tünïcödé and 🙂 "
    ids = tok.encode(text)
    self.assertEqual(tok.decode(ids), text)  # byte fallback covers unseen characters
    self.assertEqual(tok.encode(text, add_bos=True), [2] + ids)
    self.assertEqual(tokenizer.load(self.path).encode(text), ids)

  def test_save_load_round_trip(self):
    directory = tempfile.mkdtemp()
    self.assertEqual(tokenizer.save(self.tok, directory),
                     os.path.join(directory, "tokenizer.model"))
    back = tokenizer.load(directory)
    text = "the cat counted 1234 dogs"
    self.assertEqual(back.encode(text), self.tok.encode(text))
    self.assertEqual((back.bos_id, back.eos_id, back.pad_id, back.end_of_turn_ids),
                     (self.tok.bos_id, self.tok.eos_id, self.tok.pad_id,
                      self.tok.end_of_turn_ids))

  def test_chatml_fallback_and_special_tokens(self):
    tok = self.tok
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    self.assertEqual((start, end), (4, 5))
    self.assertEqual(tok.end_of_turn_ids, (end, tok.eos_id))
    self.assertTrue({start, end, tok.bos_id, tok.eos_id} <= tok.special_ids)
    text = tok.apply_chat_template([{"role": "user", "content": "the cat"}])
    self.assertEqual(text, "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text)
    self.assertEqual(ids[0], start)
    self.assertEqual(ids.count(end), 1)
    self.assertEqual(tok.decode(ids), text)
    self.assertNotIn("<|im_end|>", tok.decode(ids, skip_special=True))
    self.assertEqual(tok.decode([2, 4]), "<s><|im_start|>")  # control tokens stay visible


class HfJsonTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = _hf_tokenizer_dir({"bos_token": "<s>", "eos_token": {"content": "</s>"},
                                 "pad_token": None, "chat_template": GEMMA_STYLE})
    cls.tok = tokenizer.load(cls.dir)

  def test_special_ids_and_round_trip(self):
    tok = self.tok
    self.assertEqual((tok.bos_id, tok.eos_id, tok.pad_id), (1, 2, 2))  # pad falls back to eos
    self.assertEqual(tok.special_ids, frozenset(range(5)))
    self.assertEqual(tok.end_of_turn_ids, (4, 2))
    text = "the old red barn\tand 🙂"
    self.assertEqual(tok.decode(tok.encode(text)), text)
    self.assertEqual(tokenizer.load(os.path.join(self.dir, "tokenizer.json")).encode(text),
                     tok.encode(text))

  def test_save_load_round_trip(self):
    directory = tempfile.mkdtemp()
    tokenizer.save(self.tok, directory)
    back = tokenizer.load(directory)
    text = "the old red barn\tand 🙂"
    self.assertEqual(back.encode(text), self.tok.encode(text))
    self.assertEqual((back.bos_id, back.eos_id, back.pad_id, back.special_ids),
                     (self.tok.bos_id, self.tok.eos_id, self.tok.pad_id, self.tok.special_ids))
    messages = [{"role": "user", "content": "hi"}]
    self.assertEqual(back.apply_chat_template(messages), self.tok.apply_chat_template(messages))

  def test_shipped_template_renders_in_a_sandbox(self):
    tok = self.tok
    text = tok.apply_chat_template([{"role": "user", "content": " hi "}])
    self.assertEqual(text, "<s><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n")
    self.assertEqual(tok.encode(text)[:2], [1, 3])
    with self.assertRaisesRegex(jinja2.exceptions.TemplateError, "Only user and assistant"):
      tok.apply_chat_template([{"role": "system", "content": "x"}])
    with self.assertRaisesRegex(ValueError, r"messages\[1\] must be a dict"):
      tok.apply_chat_template([{"role": "user", "content": "x"}, "oops"])
    hostile = tokenizer.Tokenizer(**{**tok.__dict__, "chat_template":
                                     "{{ ''.__class__.__mro__[1].__subclasses__() }}"})
    with self.assertRaises(jinja2.exceptions.SecurityError):
      hostile.apply_chat_template([])


class ErrorTest(absltest.TestCase):

  def test_bad_paths(self):
    with self.assertRaisesRegex(FileNotFoundError, "No tokenizer at '/nonexistent.model'"):
      tokenizer.load("/nonexistent.model")
    empty = tempfile.mkdtemp()
    with self.assertRaisesRegex(FileNotFoundError, "neither tokenizer.json nor tokenizer.model"):
      tokenizer.load(empty)
    other = os.path.join(empty, "vocab.txt")
    with open(other, "w") as f:
      f.write("x")
    with self.assertRaisesRegex(ValueError, "Unrecognized tokenizer file"):
      tokenizer.load(other)

  def test_unsupported_gguf_vocabulary(self):
    import gguf  # pylint: disable=g-import-not-at-top
    path = os.path.join(tempfile.mkdtemp(), "spm.gguf")
    w = gguf.GGUFWriter(path, "gemma")
    w.add_tokenizer_model("llama")
    w.add_token_list(["<pad>", "<s>", "a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with self.assertRaisesRegex(ValueError, "GGUF tokenizer model 'llama' is not supported"):
      tokenizer.load(path)


  def test_damaged_gguf_names_the_file(self):
    import gguf  # pylint: disable=g-import-not-at-top
    path = os.path.join(tempfile.mkdtemp(), "bpe.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(100)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
      data = f.read()
    cases = ((0, "empty file"),
             (len(data) // 2, r"truncated or corrupt: metadata entry \d+ of \d+ \('tokenizer"))
    for size, pattern in cases:
      with open(path, "wb") as f:
        f.write(data[:size])
      with self.assertRaisesRegex(gguf_file.ModelFileError, f"^{path}: {pattern}.*re-download"):
        tokenizer.load(path)

  def _tokenizer_json(self, edit=None, config=None):
    """A copy of a small tokenizer directory with tokenizer.json edited (a dict -> dict)."""
    path = _hf_tokenizer_dir(config or {"bos_token": "<s>", "eos_token": "</s>"})
    json_path = os.path.join(path, "tokenizer.json")
    if edit is not None:
      with open(json_path) as f:
        data = edit(json.load(f))
      with open(json_path, "w") as f:
        json.dump(data, f)
    return path, json_path

  def _assert_one_line(self, path, pattern):
    with self.assertRaises(gguf_file.ModelFileError) as e:
      tokenizer.load(path)
    self.assertRegex(str(e.exception), pattern)
    self.assertNotIn("\n", str(e.exception))

  def test_damaged_tokenizer_files_name_the_file_and_the_fault(self):
    def drop(key):
      return lambda d: {**d, "model": {k: v for k, v in d["model"].items() if k != key}}
    empty = lambda d: {**d, "model": {**d["model"], "vocab": {}, "merges": []}}
    for edit, fault in ((drop("merges"), r"model\.merges is missing \(a BPE model needs vocab "
                                         "and merges"),
                        (drop("vocab"), r"model\.vocab is missing"),
                        (empty, r"the vocabulary \(model\.vocab\) is empty"),
                        (lambda d: {**d, "model": None}, "no 'model' object")):
      path, json_path = self._tokenizer_json(edit)
      self._assert_one_line(path, f"^{json_path}: {fault}.*re-export the tokenizer")
    path, json_path = self._tokenizer_json()
    for name, pattern in (("tokenizer_config.json", "corrupt tokenizer_config.json .not valid "
                           "JSON"), ("tokenizer.json", "corrupt tokenizer.json .not valid JSON")):
      file_path = os.path.join(path, name)
      with open(file_path) as f:
        text = f.read()
      with open(file_path, "w") as f:
        f.write(text[:len(text) // 2])
      self._assert_one_line(path, f"^{file_path}: {pattern}")
    missing = os.path.join(tempfile.mkdtemp(), "x.model")
    with self.assertRaises(gguf_file.MissingFileError):
      tokenizer.load(missing)

  def test_gguf_vocabulary_without_tokens_or_merges_is_refused(self):
    import gguf  # pylint: disable=g-import-not-at-top
    for tokens, fault in (([], "tokenizer.ggml.tokens is missing or empty"),
                          (["<|endoftext|>", "a", "b", "ab"],
                           "tokenizer.ggml.merges is missing")):
      path = os.path.join(tempfile.mkdtemp(), "bpe.gguf")
      w = gguf.GGUFWriter(path, "llama")
      w.add_tokenizer_model("gpt2")
      if tokens:
        w.add_token_list(tokens)
        w.add_token_types([3] + [1] * (len(tokens) - 1))
      w.write_header_to_file()
      w.write_kv_data_to_file()
      w.write_tensors_to_file()
      w.close()
      self._assert_one_line(path, f"^{path}: GGUF metadata key {fault}")


if __name__ == "__main__":
  absltest.main()
