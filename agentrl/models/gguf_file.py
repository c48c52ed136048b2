"""A fast reader of GGUF files (metadata + memory-mapped tensors), dequantizing with `gguf`.

`gguf.GGUFReader` builds its fields through per-element memmap slices, which takes several
seconds for a 49k-token vocabulary; this parses the same header with `struct` (milliseconds)
and leaves dequantization to `gguf.quants`. Format: github.com/ggml-org/ggml docs/gguf.md.
"""
import dataclasses
import os
import struct

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


@dataclasses.dataclass
class Tensor:
  name: str
  shape: tuple[int, ...]    # numpy order (GGUF stores dims fastest-first)
  ggml_type: int
  raw: np.ndarray           # the bytes as `gguf.GGUFReader` would give them (`.data`)

  def to_numpy(self) -> np.ndarray:
    """Float32 values, dequantized."""
    from gguf import quants  # pylint: disable=g-import-not-at-top
    return quants.dequantize(self.raw, self.ggml_type).astype(np.float32).reshape(self.shape)


class ModelFileError(ValueError):
  """A model file is empty, truncated or corrupt; the message names the file and the fix."""


_REFETCH = "re-download or re-export the model"


class GgufFile:
  """`fields` (metadata dict) and `tensors` (name -> Tensor) of a GGUF v2/v3 file.

  An empty, truncated or corrupt file raises ModelFileError naming the file: the header and
  metadata are parsed defensively, and every tensor's extent is checked against the file size
  before it is read.
  """

  def __init__(self, path: str):
    self.path = os.fspath(path)
    self.size = os.path.getsize(self.path)
    if self.size < 24:
      raise ModelFileError(f"{self.path}: {'empty file' if not self.size else 'truncated'} "
                           f"({self.size} bytes; a GGUF header alone is 24); {_REFETCH}.")
    self._buf = np.memmap(self.path, dtype=np.uint8, mode="r")
    self._mv = memoryview(self._buf)
    if bytes(self._mv[:4]) != b"GGUF":
      raise ModelFileError(f"{self.path} is not a GGUF file (bad magic "
                           f"{bytes(self._mv[:4])!r}); {_REFETCH}.")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", self._mv, 4)
    if version not in (2, 3):
      raise ModelFileError(f"{self.path}: GGUF version {version} is not supported (2 or 3).")
    try:
      self._parse(n_tensors, n_kv)
    except (struct.error, ValueError, IndexError, KeyError, OverflowError) as e:
      if isinstance(e, ModelFileError):
        raise
      raise ModelFileError(f"{self.path}: truncated or corrupt GGUF header/metadata (at byte "
                           f"{self._pos} of {self.size}: {e}); {_REFETCH}.") from None

  def _parse(self, n_tensors: int, n_kv: int) -> None:
    self._pos = 24
    self.fields = {}
    for _ in range(n_kv):
      key = self._string()
      self.fields[key] = self._value(self._u32())
    infos = []
    for _ in range(n_tensors):
      name = self._string()
      dims = struct.unpack_from(f"<{self._u32()}Q", self._mv, self._pos)
      self._pos += 8 * len(dims)
      ggml_type = self._u32()
      offset = struct.unpack_from("<Q", self._mv, self._pos)[0]
      self._pos += 8
      infos.append((name, tuple(int(d) for d in reversed(dims)), ggml_type, offset))
    alignment = int(self.fields.get("general.alignment", 32))
    start = -(-self._pos // alignment) * alignment
    self.tensors = {name: Tensor(name, shape, t, self._raw(name, start + offset, shape, t))
                    for name, shape, t, offset in infos}

  def _u32(self):
    self._pos += 4
    return struct.unpack_from("<I", self._mv, self._pos - 4)[0]

  def _string(self):
    (n,) = struct.unpack_from("<Q", self._mv, self._pos)
    self._pos += 8 + n
    return bytes(self._mv[self._pos - n:self._pos]).decode("utf-8", errors="replace")

  def _value(self, kind):
    if kind == _STRING:
      return self._string()
    if kind == _ARRAY:
      elem = self._u32()
      (count,) = struct.unpack_from("<Q", self._mv, self._pos)
      self._pos += 8
      if elem in _NUMPY:
        arr = np.frombuffer(self._mv, _NUMPY[elem], count, self._pos)
        self._pos += arr.nbytes
        return arr.tolist()
      return [self._value(elem) for _ in range(count)]
    fmt = _SCALARS[kind]
    self._pos += struct.calcsize(fmt)
    return struct.unpack_from(fmt, self._mv, self._pos - struct.calcsize(fmt))[0]

  def _raw(self, name, offset, shape, ggml_type):
    from gguf import constants, quants  # pylint: disable=g-import-not-at-top
    qtype = constants.GGMLQuantizationType(ggml_type)
    plain = {constants.GGMLQuantizationType.F32: np.float32,
             constants.GGMLQuantizationType.F16: np.float16}
    if qtype in plain:
      dtype, byte_shape = plain[qtype], tuple(shape)
    else:
      dtype, byte_shape = np.uint8, tuple(quants.quant_shape_to_byte_shape(shape, qtype))
    end = offset + int(np.prod(byte_shape)) * np.dtype(dtype).itemsize
    if end > self.size:
      raise ModelFileError(f"{self.path}: truncated: tensor {name} ends at byte {end} but the "
                           f"file has {self.size} bytes; {_REFETCH}.")
    return np.frombuffer(self._buf, dtype, int(np.prod(byte_shape)), offset).reshape(byte_shape)
