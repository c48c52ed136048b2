"""Tests for agentrl.data.jsonl: every bad line is reported with file and line number."""
import os
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.data import jsonl


class JsonlTest(parameterized.TestCase):

  def _write(self, text: str) -> str:
    # tempfile, not absltest's create_tempfile: that needs absl flags, which pytest skips.
    tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, tmp)
    path = os.path.join(tmp, "data.jsonl")
    with open(path, "w") as f:
      f.write(text)
    return path

  def test_reads_valid_file_and_skips_blank_lines(self):
    path = self._write('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", "meta": [1]}\n')
    source = jsonl.JsonlSource(path)
    self.assertLen(source, 2)
    self.assertEqual(source[1], {"prompt": "2+2=", "meta": [1]})
    source[0]["prompt"] = "changed"  # entries are copies
    self.assertEqual(source[0]["prompt"], "1+1=")

  @parameterized.parameters(
      ('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c",}\n', ":3: invalid JSON"),
      ('{"prompt": "a"}\n["prompt"]\n', ":2: expected a JSON object, got list"),
      ('{"prompt": "a"}\n{"answer": "b"}\n', ":2: missing key"),
      ('{"prompt": ""}\n', ":1: 'prompt' must be a non-empty string"),
      ('{"prompt": 3}\n', ":1: 'prompt' must be a non-empty string"),
      ("\n\n", "no entries"),
  )
  def test_bad_lines_name_file_and_line(self, text, message):
    path = self._write(text)
    with self.assertRaisesRegex(ValueError, rf"{path}{message}" if message[0] == ":" else message):
      jsonl.read_jsonl(path)

  def test_bom_bad_utf8_and_deep_nesting(self):
    path = self._write("")
    with open(path, "wb") as f:
      f.write(b'\xef\xbb\xbf{"prompt": "with a BOM"}\n')
    self.assertEqual(jsonl.read_jsonl(path), [{"prompt": "with a BOM"}])
    with open(path, "wb") as f:
      f.write(b'{"prompt": "ok"}\n{"prompt": "\xff"}\n')
    with self.assertRaisesRegex(ValueError, rf"^{path}:2: invalid UTF-8 at byte 12"):
      jsonl.read_jsonl(path)
    with open(path, "w") as f:
      f.write("[" * 100_000 + "\n")
    with self.assertRaisesRegex(ValueError, rf"^{path}:1: JSON nested too deeply"):
      jsonl.read_jsonl(path)

  def test_required_keys(self):
    path = self._write('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n')
    with self.assertRaisesRegex(ValueError, r":2: missing key\(s\) \['answer'\]"):
      jsonl.read_jsonl(path, required=("prompt", "answer"))

  def test_missing_file(self):
    with self.assertRaisesRegex(FileNotFoundError, "nope.jsonl"):
      jsonl.JsonlSource("/nope.jsonl")

  def test_write_then_read_round_trip(self):
    path = self._write("")
    entries = [{"prompt": f"q{i}", "answer": i} for i in range(3)]
    jsonl.write_jsonl(path, entries)
    self.assertEqual(jsonl.read_jsonl(path), entries)


if __name__ == "__main__":
  absltest.main()
