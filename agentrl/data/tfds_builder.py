"""tensorflow-datasets builder that turns a JSONL prompt file into array_record shards.

The builder must live in a module of a package: tfds resolves a builder's resources from its
module, and a builder defined in `__main__` fails with NotADirectoryError (docs/offline.md
§5). Each example stores one validated JSONL entry as a JSON string under "record", so any
entry schema round-trips. Use through `agentrl.data.tfds_source`, which needs no TensorFlow.
"""
import json

import tensorflow_datasets as tfds

from agentrl.data import jsonl


class JsonlPrompts(tfds.core.GeneratorBasedBuilder):
  """Prompts from a local JSONL file; one "train" split."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "JSONL entries stored as JSON strings."}

  def __init__(self, *, jsonl_path: str | None = None, **kwargs):
    self._jsonl_path = jsonl_path
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({"record": tfds.features.Text()}),
        description="agentrl prompt entries (JSON objects) from a JSONL file.")

  def _split_generators(self, dl_manager):
    del dl_manager
    if self._jsonl_path is None:
      raise ValueError("JsonlPrompts needs jsonl_path=... to prepare the dataset.")
    return {"train": self._generate_examples(self._jsonl_path)}

  def _generate_examples(self, path: str):
    for i, entry in enumerate(jsonl.read_jsonl(path)):
      yield i, {"record": json.dumps(entry, sort_keys=True)}
