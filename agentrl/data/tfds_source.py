"""tensorflow-datasets array_record sources, without TensorFlow.

tfds can write and randomly read `array_record` shards with no TensorFlow installed
(docs/offline.md §5): `prepare_jsonl` converts a JSONL prompt file with the
`tfds_builder.JsonlPrompts` builder (download_and_prepare with file_format="array_record"),
and `ArrayRecordSource` reads any tfds data source by index (`builder.as_data_source` or
`tfds.data_source(name, ...)`), decoding bytes to str and numpy scalars to Python values.
Records are shuffled once at write time by tfds (deterministically); `PromptStream` adds the
per-epoch, per-seed order.

Requires tensorflow-datasets and importlib_resources (the `envs` extra), imported lazily.
"""
from collections.abc import Mapping, Sequence

from agentrl.data import jsonl

INSTALL_HINT = "pip install -e '.[envs]'"


def import_tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    import importlib_resources  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ImportError("array_record sources need tensorflow-datasets and importlib_resources; "
                      f"install them with: {INSTALL_HINT}") from e
  return tfds


def _builder(**kwargs):
  import_tfds()
  from agentrl.data import tfds_builder  # pylint: disable=g-import-not-at-top
  return tfds_builder.JsonlPrompts(file_format="array_record", **kwargs)


def prepare_jsonl(jsonl_path: str, data_dir: str) -> str:
  """Converts a JSONL file to array_record shards under data_dir; returns data_dir.

  Every line is validated first (bad line -> ValueError naming file and line). Already
  prepared data in data_dir is reused.
  """
  _builder(jsonl_path=jsonl_path, data_dir=data_dir).download_and_prepare()
  return data_dir


def _decode(value):
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, Mapping):
    return {k: _decode(v) for k, v in value.items()}
  if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
    return value.item()
  if hasattr(value, "tolist"):
    return value.tolist()
  return value


class ArrayRecordSource(Sequence):
  """Random-access entries from a tfds data source.

  ArrayRecordSource(data_dir=d)                 the JSONL prompts prepared by prepare_jsonl
  ArrayRecordSource(data_source=tfds.data_source(name, data_dir=d, split="train"),
                    fields={"prompt": "question", "answer": "answer"})   any tfds dataset

  `fields` renames features to entry keys (entry key -> feature name); without it every
  feature is kept under its own name. `split` accepts tfds slicing ("train[:90%]").
  """

  def __init__(self, *, data_dir: str | None = None, split: str = "train", data_source=None,
               fields: Mapping[str, str] | None = None):
    if (data_dir is None) == (data_source is None):
      raise ValueError("ArrayRecordSource needs exactly one of data_dir= (prepared JSONL "
                       "prompts) or data_source= (a tfds data source).")
    self._json_records, self._where = data_source is None, data_dir
    if data_source is None:
      data_source = _builder(data_dir=data_dir).as_data_source(split=split)
    self._source, self._fields = data_source, dict(fields or {})

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> dict:
    if not 0 <= index < len(self):
      raise IndexError(f"index {index} outside [0, {len(self)})")
    example = _decode(self._source[index])
    if self._json_records:
      # Records are validated JSONL entries, but a directory may predate a check or be edited.
      example = jsonl.parse_json(example["record"], f"{self._where} record {index}")
    if not self._fields:
      return example
    missing = [f for f in self._fields.values() if f not in example]
    if missing:
      raise KeyError(f"features {missing} not in the tfds example (has {sorted(example)}).")
    return {key: example[feature] for key, feature in self._fields.items()}
