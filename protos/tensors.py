"""Tensors on the wire: raw little-endian arrays with dtype and shape, addressed by sha256. Never pickles."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np

MAGIC = b"LTXT1"
CHUNK_BYTES = 1 << 20  # ~1 MiB stream chunks

_ALLOWED = {"float32", "float16", "uint8", "int32", "int64", "uint32", "bool", "float64", "int16"}


class TensorFormatError(ValueError):
    """Bytes that are not a tensor blob this contract understands."""


def encode_tensor(array: np.ndarray) -> bytes:
    """Header (magic, JSON dtype+shape) followed by the C-order little-endian data."""
    array = np.ascontiguousarray(array)
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    if dtype.name not in _ALLOWED:
        raise TensorFormatError(f"dtype {dtype.name} is not allowed on the wire")
    header = json.dumps({"dtype": dtype.name, "shape": list(array.shape)}).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + array.astype(dtype.newbyteorder("<"), copy=False).tobytes()


def decode_tensor(data: bytes | memoryview) -> np.ndarray:
    """Inverse of encode_tensor; checks that the payload length matches dtype and shape."""
    data = memoryview(data)
    if bytes(data[: len(MAGIC)]) != MAGIC:
        raise TensorFormatError("not a tensor blob (bad magic)")
    (hlen,) = struct.unpack("<I", data[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4
    header = json.loads(bytes(data[start : start + hlen]))
    dtype = np.dtype(header["dtype"]).newbyteorder("<")
    shape = tuple(header["shape"])
    payload = data[start + hlen :]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(payload) != expected:
        raise TensorFormatError(f"payload is {len(payload)} bytes, {header} needs {expected}")
    return np.frombuffer(payload, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=False)


def tensor_header(data: bytes | memoryview) -> tuple[str, tuple[int, ...]]:
    """dtype name and shape of a blob without decoding its payload."""
    data = memoryview(data)
    (hlen,) = struct.unpack("<I", data[len(MAGIC) : len(MAGIC) + 4])
    header = json.loads(bytes(data[len(MAGIC) + 4 : len(MAGIC) + 4 + hlen]))
    return header["dtype"], tuple(header["shape"])


def prompt_bytes(text: str) -> np.ndarray:
    """A prompt as a tensor (its UTF-8 bytes, uint8): how an enhanced prompt travels between tasks."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def prompt_text(array: np.ndarray) -> str:
    """The prompt a `prompt_bytes` tensor holds."""
    return np.asarray(array, dtype=np.uint8).tobytes().decode("utf-8")


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()
