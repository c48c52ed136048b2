"""Tests for agentrl.data.tfds_source (array_record without TensorFlow), and no-jax imports."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest

from agentrl.data import jsonl
from agentrl.data import stream
from agentrl.data import tfds_source

try:
  tfds_source.import_tfds()
  _MISSING = None
except ImportError as e:
  _MISSING = str(e)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRIES = [{"prompt": f"{i}+1=", "answer": str(i + 1), "meta": {"i": i}} for i in range(40)]


@absltest.skipIf(_MISSING is not None, f"{_MISSING}")
class ArrayRecordSourceTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()
    cls.jsonl_path = os.path.join(cls.tmp, "prompts.jsonl")
    jsonl.write_jsonl(cls.jsonl_path, ENTRIES)
    cls.data_dir = tfds_source.prepare_jsonl(cls.jsonl_path, os.path.join(cls.tmp, "tfds"))

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def test_round_trip_and_array_record_files(self):
    source = tfds_source.ArrayRecordSource(data_dir=self.data_dir)
    self.assertLen(source, len(ENTRIES))
    got = sorted((source[i] for i in range(len(source))), key=lambda e: e["meta"]["i"])
    self.assertEqual(got, ENTRIES)
    files = [f for _, _, fs in os.walk(self.data_dir) for f in fs]
    self.assertTrue(any(".array_record-" in f for f in files), files)

  def test_split_slicing_and_field_mapping(self):
    source = tfds_source.ArrayRecordSource(data_dir=self.data_dir, split="train[:10]")
    self.assertLen(source, 10)
    raw = tfds_source._builder(data_dir=self.data_dir).as_data_source(split="train")
    mapped = tfds_source.ArrayRecordSource(data_source=raw, fields={"text": "record"})
    self.assertEqual(json.loads(mapped[0]["text"]), tfds_source.ArrayRecordSource(
        data_dir=self.data_dir)[0])
    with self.assertRaisesRegex(KeyError, "question"):
      tfds_source.ArrayRecordSource(data_source=raw, fields={"prompt": "question"})[0]
    with self.assertRaisesRegex(ValueError, "exactly one"):
      tfds_source.ArrayRecordSource()

  def test_prompt_stream_resumes_over_array_record(self):
    def source():
      return tfds_source.ArrayRecordSource(data_dir=self.data_dir)
    reference = [e["prompt"] for e in stream.PromptStream(source(), seed=4).take(60)]
    first = stream.PromptStream(source(), seed=4)
    head = [e["prompt"] for e in first.take(25)]
    resumed = stream.PromptStream(source(), seed=4)
    resumed.restore(first.state())
    self.assertEqual(head + [e["prompt"] for e in resumed.take(35)], reference)

  def test_bad_jsonl_line_is_reported_before_writing(self):
    bad = os.path.join(self.tmp, "bad.jsonl")
    with open(bad, "w") as f:
      f.write('{"prompt": "a"}\n{"prompt": \n')
    with self.assertRaisesRegex(ValueError, f"{bad}:2: invalid JSON"):
      tfds_source.prepare_jsonl(bad, os.path.join(self.tmp, "bad_tfds"))


class RecordTest(absltest.TestCase):
  """Prepared records are read with the strict JSONL reader (no tfds needed: a fake builder)."""

  def test_unusable_record_names_the_directory_record_and_field(self):
    records = [{"record": b'{"prompt": "a"}'}, {"record": b'{"prompt": "b\\ud800"}'},
               {"record": b'{"prompt": "c", "x": NaN}'}]
    builder = mock.Mock()
    builder.as_data_source.return_value = records
    with mock.patch.object(tfds_source, "_builder", return_value=builder):
      source = tfds_source.ArrayRecordSource(data_dir="/d/tfds")
    self.assertEqual(source[0], {"prompt": "a"})
    with self.assertRaisesRegex(jsonl.JsonlError, r"^/d/tfds record 1: field 'prompt' holds a "
                                r"lone surrogate '\\ud800'"):
      source[1]
    with self.assertRaisesRegex(jsonl.JsonlError, r"^/d/tfds record 2: field 'x' is NaN"):
      source[2]


class NoJaxTest(absltest.TestCase):

  def test_data_package_does_not_import_jax(self):
    code = ("import json, sys\n"
            "from agentrl.data import generators, jsonl, stream, tfds_source\n"
            "tfds_source.import_tfds()\n"
            "from agentrl.data import tfds_builder\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('jax', 'jaxlib', 'tensorflow'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    self.assertEqual(json.loads(out.stdout.strip().splitlines()[-1]), [])


if __name__ == "__main__":
  absltest.main()
