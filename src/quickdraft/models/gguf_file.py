"""A GGUF file's metadata and tensors, read without decoding its tokenizer.

``gguf.GGUFReader`` builds a numpy view for every item of every metadata array: the demo
target's 150k-token vocabulary and merges took 10-20 s per reader on a 2-core machine. Loading
from blocks needs the scalar metadata, the tensor table and the tensors' bytes: this reader
walks the header once with ``struct`` (arrays of strings are skipped, not decoded) and maps the
tensors' bytes with ``numpy.memmap``. The layout is the GGUF specification's (version 2 and 3):
magic, version, tensor count, metadata count, the metadata key-value pairs, the tensor infos,
then the data, aligned to ``general.alignment`` (32 when absent).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# GGUF metadata value types -> struct format of one value (8: string, 9: array handled apart).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file.

    Attributes:
        name: its GGUF name (``blk.0.attn_q.weight``).
        shape: ggml's order, innermost first: ``(inputs, outputs)`` for a matrix.
        kind: its ggml type.
        offset: where its bytes start in the file.
    """

    name: str
    shape: tuple[int, ...]
    kind: GGMLQuantizationType
    offset: int

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.kind]
        return int(np.prod(self.shape)) // block * size


class GGUFFile:
    """The metadata (scalars and strings; arrays are skipped) and tensor table of a GGUF file.

    Attributes:
        path: the file.
        metadata: scalar and string values by key; an array's key maps to ``None``.
        tensors: the tensors, by name, in the file's order.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as handle:
            reader = _Reader(handle.read(1 << 16), handle)
            if reader.take(4) != b"GGUF":
                raise ValueError(f"{self.path} is not a GGUF file")
            version, tensor_count, kv_count = reader.unpack("<IQQ")
            if version not in (2, 3):
                raise ValueError(f"{self.path}: GGUF version {version} is not supported")
            self.metadata: dict[str, object] = {}
            for _ in range(kv_count):
                key = reader.string()
                (kind,) = reader.unpack("<I")
                self.metadata[key] = reader.value(kind)
            self.tensors: dict[str, TensorInfo] = {}
            for _ in range(tensor_count):
                name = reader.string()
                (dims,) = reader.unpack("<I")
                shape = reader.unpack(f"<{dims}Q")
                kind, offset = reader.unpack("<IQ")
                self.tensors[name] = TensorInfo(name, tuple(shape), GGMLQuantizationType(kind), offset)
            alignment = int(self.metadata.get("general.alignment", 32))
            start = -(-reader.position // alignment) * alignment
        self.tensors = {name: TensorInfo(t.name, t.shape, t.kind, start + t.offset) for name, t in self.tensors.items()}

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def data(self, name: str) -> np.ndarray:
        """Tensor ``name``'s bytes as uint8 ``[outputs, row_bytes]`` (a read-only map of the file)."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[1:])) if len(info.shape) > 1 else 1
        flat = np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))
        return flat.reshape(rows, info.nbytes // rows)


class _Reader:
    """Sequential reads from a file, buffered (the header is read once, front to back)."""

    def __init__(self, head: bytes, handle) -> None:
        self.buffer, self.handle, self.at, self.base = head, handle, 0, 0

    @property
    def position(self) -> int:
        return self.base + self.at

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.buffer):
            self.base += self.at
            self.buffer = self.buffer[self.at :] + self.handle.read(max(size, 1 << 20))
            self.at = 0
        piece = self.buffer[self.at : self.at + size]
        self.at += size
        return piece

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def string(self) -> str:
        (size,) = self.unpack("<Q")
        return self.take(size).decode("utf-8", errors="replace")

    def value(self, kind: int) -> object:
        """One metadata value of type ``kind``; arrays are skipped (``None``)."""
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<IQ")
            if item == _STRING:
                for _ in range(count):
                    (size,) = self.unpack("<Q")
                    self.take(size)
            elif item == _ARRAY:
                for _ in range(count):
                    self.value(_ARRAY)
            else:
                self.take(struct.calcsize(_SCALARS[item]) * count)
            return None
        (value,) = self.unpack("<" + _SCALARS[kind])
        return value
