"""A fast reader of GGUF files (metadata + memory-mapped tensors), dequantizing with `gguf`.

`gguf.GGUFReader` builds its fields through per-element memmap slices, which takes several
seconds for a 49k-token vocabulary; this parses the same header with `struct` (milliseconds)
and leaves dequantization to `gguf.quants`. Format:
https://github.com/ggml-org/ggml/blob/master/docs/gguf.md.
"""
import dataclasses
import math
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


class MissingFileError(ModelFileError, FileNotFoundError):
  """A model or tokenizer file that is not there (also a FileNotFoundError)."""


_REFETCH = "re-download or re-export the model"


class GgufFile:
  """`fields` (metadata dict) and `tensors` (name -> Tensor) of a GGUF v2/v3 file.

  An empty, truncated or corrupt file raises ModelFileError naming the file, the part that is
  damaged and the fix: every length in the header and metadata is checked against the file size
  as it is read, and every tensor's extent before any tensor is read.
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
      raise ModelFileError(f"{self.path}: not a GGUF file (bad magic "
                           f"{bytes(self._mv[:4])!r}); {_REFETCH}.")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", self._mv, 4)
    if version not in (2, 3):
      raise ModelFileError(f"{self.path}: GGUF version {version} is not supported (2 or 3).")
    self._pos, self._part = 24, "the header"
    try:
      self._parse(n_tensors, n_kv)
    except (struct.error, ValueError, IndexError, KeyError, OverflowError) as e:
      if isinstance(e, ModelFileError):
        raise
      # A check below missed a corruption; still name the file and the part being read.
      raise ModelFileError(f"{self.path}: corrupt GGUF: {self._part} cannot be read at byte "
                           f"{self._pos} ({type(e).__name__}: {e}); {_REFETCH}.") from None

  def _parse(self, n_tensors: int, n_kv: int) -> None:
    self.fields = {}
    for i in range(n_kv):
      self._part = f"metadata entry {i + 1} of {n_kv}"
      key = self._string()
      self._part += f" ({key[:80]!r})"
      self.fields[key] = self._value(self._u32())
    infos = []
    for i in range(n_tensors):
      self._part = f"tensor info {i + 1} of {n_tensors}"
      name = self._string()
      self._part += f" ({name[:80]!r})"
      n_dims = self._u32()
      dims = struct.unpack_from(f"<{n_dims}Q", self._take(8 * n_dims))
      ggml_type, offset = self._u32(), struct.unpack_from("<Q", self._take(8))[0]
      infos.append((name, tuple(int(d) for d in reversed(dims)), ggml_type, offset))
    alignment = self.fields.get("general.alignment", 32)
    if not (isinstance(alignment, int) and alignment > 0):
      raise self._corrupt(f"general.alignment is {alignment!r}")
    start = -(-self._pos // alignment) * alignment
    extents = [(name, *self._extent(name, shape, t), start + offset)
               for name, shape, t, offset in infos]
    self._check_extents(extents)
    self.tensors = {
        name: Tensor(name, shape, t,
                     np.frombuffer(self._buf, dtype, count, offset).reshape(byte_shape))
        for (name, shape, t, _), (_, dtype, byte_shape, count, offset) in zip(infos, extents)}

  def _take(self, n: int) -> memoryview:
    """The next n bytes; a length that runs past the end of the file is reported as such."""
    if n > self.size - self._pos:
      raise ModelFileError(
          f"{self.path}: truncated or corrupt: {self._part} at byte {self._pos} needs "
          f"{n} more bytes but the file has {self.size} bytes; {_REFETCH}.")
    self._pos += n
    return self._mv[self._pos - n:self._pos]

  def _corrupt(self, what: str) -> ModelFileError:
    return ModelFileError(f"{self.path}: corrupt GGUF: {self._part}: {what}; {_REFETCH}.")

  def _u32(self):
    return struct.unpack_from("<I", self._take(4))[0]

  def _string(self):
    (n,) = struct.unpack_from("<Q", self._take(8))
    return bytes(self._take(n)).decode("utf-8", errors="replace")

  def _value(self, kind):
    if kind == _STRING:
      return self._string()
    if kind == _ARRAY:
      elem = self._u32()
      (count,) = struct.unpack_from("<Q", self._take(8))
      if elem in _NUMPY:
        return np.frombuffer(self._take(count * np.dtype(_NUMPY[elem]).itemsize),
                             _NUMPY[elem]).tolist()
      return [self._value(elem) for _ in range(count)]
    if kind not in _SCALARS:
      raise self._corrupt(f"unknown value type {kind}")
    return struct.unpack_from(_SCALARS[kind], self._take(struct.calcsize(_SCALARS[kind])))[0]

  def _extent(self, name, shape, ggml_type):
    """(numpy dtype, byte shape, element count) of a tensor's bytes."""
    from gguf import constants, quants  # pylint: disable=g-import-not-at-top
    self._part = f"tensor {name}"
    try:
      qtype = constants.GGMLQuantizationType(ggml_type)
    except ValueError:
      raise ModelFileError(f"{self.path}: tensor {name} has unknown ggml type {ggml_type} "
                           f"(corrupt, or newer than the installed gguf package); "
                           f"{_REFETCH}.") from None
    plain = {constants.GGMLQuantizationType.F32: np.float32,
             constants.GGMLQuantizationType.F16: np.float16}
    if qtype in plain:
      dtype, byte_shape = plain[qtype], tuple(shape)
    else:
      dtype, byte_shape = np.uint8, tuple(quants.quant_shape_to_byte_shape(shape, qtype))
    return dtype, byte_shape, math.prod(byte_shape)  # exact: corrupt dims must not wrap around

  def _check_extents(self, extents) -> None:
    """Every tensor's bytes lie inside the file; else names the first one cut off."""
    ends = [(offset + count * np.dtype(dtype).itemsize, name)
            for name, dtype, _, count, offset in extents]
    cut = sorted((end, name) for end, name in ends if end > self.size)
    if cut:
      raise ModelFileError(
          f"{self.path}: truncated: header says tensor {cut[0][1]} ends at byte {cut[0][0]} "
          f"but the file has {self.size} bytes (a complete file has at least "
          f"{max(ends)[0]}); {_REFETCH}.")
