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

  def _write_bytes(self, data: bytes) -> str:
    path = self._write("")
    with open(path, "wb") as f:
      f.write(data)
    return path

  @parameterized.parameters(
      (b'\xef\xbb\xbf{"prompt": "with a BOM"}\n{"prompt": "b"}\n', ["with a BOM", "b"]),
      (b'\xef\xbb\xbf\n{"prompt": "a"}\r\n', ["a"]),                # BOM on a blank line, CRLF
      (b'{"prompt": "a"}\r{"prompt": "b"}\r', ["a", "b"]),          # old Mac line ends
      ('{"prompt": "caf\u00e9 \u2028 \u4e2d"}\n'.encode(), ["caf\u00e9 \u2028 \u4e2d"]),
  )
  def test_valid_encodings_and_line_ends_load(self, data, prompts):
    entries = jsonl.read_jsonl(self._write_bytes(data))
    self.assertEqual([e["prompt"] for e in entries], prompts)

  @parameterized.parameters(
      (b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n',
       r":2: invalid UTF-8 at byte 15 of the line \(byte offset 32 in the file\): b'\\xe9"),
      (b'\xef\xbb\xbf{"prompt": "\xc3\xa9"}\n{"prompt": "\xff"}\n',  # offsets count the BOM
       r":2: invalid UTF-8 at byte 12 of the line \(byte offset 32 in the file\)"),
      ('{"prompt": "a"}\n'.encode("utf-16"), r":1: invalid UTF-8 at byte 0 .*looks like UTF-16"),
      (b"[" * 100_000 + b"\n", ":1: JSON nested too deeply"),
      (b'{"prompt": "a"}\n{"prompt": "b", "x": ' + b"[" * 100_000 + b"\n",
       ":2: JSON nested too deeply"),
      (b'{"prompt": "a"}\n\xef\xbb\xbf{"prompt": "b"}\n', ":2: invalid JSON"),  # BOM mid-file
  )
  def test_undecodable_lines_name_file_line_and_byte(self, data, message):
    path = self._write_bytes(data)
    with self.assertRaisesRegex(ValueError, rf"^{path}{message}"):
      jsonl.read_jsonl(path)

  @parameterized.named_parameters(
      ("lone_surrogate", '{"prompt": "a\\ud800b"}\n',
       r":1: field 'prompt' holds a lone surrogate '\\ud800'"),
      ("nested_surrogate", '{"prompt": "a"}\n{"prompt": "b", "meta": {"x": ["ok", "\\udfff"]}}\n',
       r":2: field 'meta\.x\[1\]' holds a lone surrogate '\\udfff'"),
      ("surrogate_key", '{"prompt": "a", "meta": {"k\\udc00": 1}}\n',
       r":1: a key of field 'meta' holds a lone surrogate '\\udc00'"),
      ("huge_int", '{"prompt": "a", "n": ' + "7" * 5000 + "}\n",
       r":1: field 'n' is an integer of 5000 digits, more than Python reads \(4300\)"),
      ("huge_negative_int", '{"prompt": "a", "n": [-' + "7" * 5000 + "]}\n",
       r":1: field 'n\[0\]' is an integer of 5000 digits"),
      ("nan", '{"prompt": "a", "score": NaN}\n', r":1: field 'score' is NaN"),
      ("infinity", '{"prompt": "a", "score": -Infinity}\n', r":1: field 'score' is -Infinity"),
      ("float_overflow", '{"prompt": "a", "score": 1e999}\n', r":1: field 'score' is 1e999"),
      ("top_level", "NaN\n", r":1: the value is NaN"),
  )
  def test_values_no_consumer_can_use_name_file_line_and_field(self, text, message):
    path = self._write(text)
    with self.assertRaisesRegex(jsonl.JsonlError, rf"^{path}{message}"):
      jsonl.read_jsonl(path)

  def test_surrogate_pairs_and_big_numbers_within_limits_load(self):
    path = self._write('{"prompt": "\\ud83d\\ude00", "n": ' + "9" * 4000 + ', "x": 1e308}\n')
    entry = jsonl.read_jsonl(path)[0]
    self.assertEqual(entry["prompt"], "\U0001F600")
    self.assertEqual(entry["n"], int("9" * 4000))

  def test_parse_json_is_the_shared_strict_reader(self):
    self.assertEqual(jsonl.parse_json('{"a": [1, 2.5, "x"]}', "f:1"), {"a": [1, 2.5, "x"]})
    for text, message in (('{"a": 1,}', "^f:1: invalid JSON"),
                          ('[Infinity]', r"^f:1: field '\[0\]' is Infinity"),
                          ("[" * 100_000, "^f:1: JSON nested too deeply")):
      with self.assertRaisesRegex(jsonl.JsonlError, message):
        jsonl.parse_json(text, "f:1")

  def test_write_refuses_what_read_refuses_and_keeps_the_earlier_file(self):
    path = self._write('{"prompt": "kept"}\n')
    with self.assertRaisesRegex(ValueError, "JSON"):
      jsonl.write_jsonl(path, [{"prompt": "a"}, {"prompt": "b", "x": float("nan")}])
    self.assertEqual(jsonl.read_jsonl(path), [{"prompt": "kept"}])
    self.assertEqual(os.listdir(os.path.dirname(path)), [os.path.basename(path)])

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
