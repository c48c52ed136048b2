"""Safetensors checkpoints of a Hugging Face model directory, checked before they are mapped.

A cut-off, empty or corrupt file (or index, or config.json) raises ModelFileError naming the
file and the damaged part, instead of a low-level error from the safetensors package.
"""
import json
import os
import struct

from agentrl.models import gguf_file

ModelFileError = gguf_file.ModelFileError


def bad_file(path: str, what: str) -> ModelFileError:
  return ModelFileError(f"{path}: {what}; re-download or re-export the model.")


def read_json(path: str, what: str):
  try:
    with open(path, "rb") as f:
      return json.load(f)
  except (ValueError, RecursionError) as e:  # bad JSON, bad UTF-8, over-deep nesting
    raise bad_file(path, f"corrupt {what} (not valid JSON: {e})") from None


def check_safetensors(path: str) -> None:
  """Raises ModelFileError if the file is empty, cut short or has a corrupt header.

  Reads only the header (8-byte length + JSON, parsed with `json`, never pickle), so a cut-off
  file is reported with the first tensor it cuts before safetensors maps it.
  """
  size = os.path.getsize(path)
  if size < 8:
    raise bad_file(path, f"{'empty file' if not size else 'truncated'} ({size} bytes; a "
                    "safetensors file starts with an 8-byte header length)")
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    if n > min(size - 8, 100_000_000):  # 100 MB: safetensors' own limit
      raise bad_file(path, f"truncated or corrupt: the header length says {n} bytes but the "
                      f"file has {size}")
    raw = f.read(n)
  try:
    header = json.loads(raw)
  except (ValueError, RecursionError) as e:
    raise bad_file(path, f"corrupt safetensors header (not valid JSON: {e})") from None
  if not isinstance(header, dict):
    raise bad_file(path, f"corrupt safetensors header (a JSON {type(header).__name__}, not an "
                    "object)")
  ends = sorted((8 + n + v["data_offsets"][-1], k) for k, v in header.items()
                if isinstance(v, dict) and isinstance(v.get("data_offsets"), list)
                and v["data_offsets"] and isinstance(v["data_offsets"][-1], int))
  cut = [(end, k) for end, k in ends if end > size]
  if cut:  # other inconsistencies are left to safetensors' own checks
    raise bad_file(path, f"truncated: header says tensor {cut[0][1]} ends at byte {cut[0][0]} "
                    f"but the file has {size} bytes (a complete file has {ends[-1][0]})")


class SafetensorsDir:
  """Tensors of an HF directory: model.safetensors or a sharded index."""

  def __init__(self, directory: str):
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    self.where = directory
    index = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    if os.path.isfile(index):
      weight_map = read_json(index, "safetensors index")
      if not (isinstance(weight_map, dict) and isinstance(weight_map.get("weight_map"), dict)):
        raise bad_file(index, 'corrupt safetensors index (no "weight_map" object)')
      files = sorted(set(weight_map["weight_map"].values()))
    elif os.path.isfile(single):
      files = ["model.safetensors"]
    else:
      present = sorted(os.listdir(directory))
      raise FileNotFoundError(
          f"{directory} has neither model.safetensors nor model.safetensors.index.json "
          f"(found {present}). Only safetensors checkpoints are loaded; convert .bin/.pt "
          "pickles with transformers' save_pretrained(safe_serialization=True).")
    self.files, self.paths = {}, {}  # tensor name -> open handle, -> its file
    for name in files:
      path = os.path.join(directory, name)
      if not os.path.isfile(path):
        raise FileNotFoundError(f"Shard {path} listed in the safetensors index is missing.")
      check_safetensors(path)
      try:
        handle = safe_open(path, framework="numpy")
      except Exception as e:  # pylint: disable=broad-except  (safetensors' own error types)
        raise bad_file(path, f"corrupt safetensors ({e})") from None
      self.files.update({key: handle for key in handle.keys()})
      self.paths.update({key: path for key in handle.keys()})

  def names(self):
    return set(self.files)

  def display(self, name):
    return name

  def shape(self, name):
    return tuple(self.files[name].get_slice(name).get_shape())

  def get(self, name):
    try:
      return self.files[name].get_tensor(name)
    except Exception as e:  # pylint: disable=broad-except  (safetensors' own error types)
      raise bad_file(self.paths[name], f"tensor {name} cannot be read ({e})") from None
