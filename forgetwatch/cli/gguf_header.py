"""A GGUF file's header checked against the file's size before gguf's reader trusts it: that reader indexes past the
end (an ``IndexError``) or loops over a claimed count it cannot read (a hang), where this says which claim is false."""

from __future__ import annotations

import mmap
import os
import struct

from forgetwatch.common.text import SHOWN

_MAGIC = b"GGUF"
#: the GGUF value types of fixed size, and their bytes (uint8 ... bool, uint64, int64, float64)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DEPTH = 16  # arrays in arrays: real files nest one or two
#: the fewest bytes a key-value entry (empty key, its type, a one-byte value) and a tensor's entry (empty name, no
#: dimensions, type, offset) take: the counts the header claims must fit in the bytes that follow it
_LEAST_KV, _LEAST_TENSOR = 8 + 4 + 1, 8 + 4 + 4 + 8


class _Reader:
    """Reads forward through ``data``, refusing any claim of more bytes than the file has left."""

    def __init__(self, data: mmap.mmap | bytes):
        self.data, self.at, self.order = data, 0, "<"

    def fits(self, n: int, what: str) -> None:
        """Refuse ``what`` when its ``n`` bytes run past the end of the file."""
        left = len(self.data) - self.at
        if n > left:
            raise ValueError(f"{what} claims {n:,} bytes at byte {self.at:,}, and the file has {left:,} left")

    def take(self, n: int, what: str) -> int:
        """Skip ``n`` bytes of ``what``; where they started."""
        self.fits(n, what)
        self.at += n
        return self.at - n

    def number(self, fmt: str, what: str) -> int:
        return struct.unpack_from(self.order + fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        """Skip a string; its first characters, to name it."""
        n = self.number("Q", what)
        start = self.take(n, what)
        return bytes(self.data[start : start + min(n, SHOWN)]).decode("utf-8", "replace")

    def value(self, kind: int, what: str, depth: int = 0) -> None:
        if kind in _FIXED:
            self.take(_FIXED[kind], what)
        elif kind == _STRING:
            self.string(what)
        elif kind == _ARRAY:
            if depth == _MAX_DEPTH:  # gguf's reader recurses once per level
                raise ValueError(f"{what} nests arrays more than {_MAX_DEPTH} deep")
            item, count = self.number("I", what), self.number("Q", what)
            if item in _FIXED:
                self.take(count * _FIXED[item], what)
                return
            self.fits(count * 8, what)  # each string or array takes 8 bytes or more
            for _ in range(count):
                self.value(item, what, depth + 1)
        else:
            raise ValueError(f"{what} has value type {kind}, which GGUF does not define")


def check_gguf_header(path: str | os.PathLike[str]) -> None:
    """Raise a ``ValueError`` saying which count or length of the GGUF file at ``path`` does not fit in the file."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise ValueError(f"it is {size} bytes, shorter than a GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            reader = _Reader(data)
            if data[:4] != _MAGIC:
                raise ValueError("it does not start with the GGUF magic bytes")
            reader.take(4, "the magic")
            if reader.number("I", "the version") & 0xFFFF == 0:  # written on a big-endian machine, as gguf reads it
                reader.order = ">"
            tensors, keys = reader.number("Q", "the tensor count"), reader.number("Q", "the key-value count")
            if keys * _LEAST_KV + tensors * _LEAST_TENSOR > size - reader.at:
                raise ValueError(
                    f"its header claims {tensors:,} tensors and {keys:,} key-value entries in {size:,} bytes"
                )
            for i in range(keys):
                key = f"key {reader.string(f'key-value entry {i}')!r}"
                reader.value(reader.number("I", key), key)
            for i in range(tensors):
                name = f"tensor {reader.string(f'tensor entry {i}')!r}"
                reader.take(8 * reader.number("I", name), f"the shape of {name}")
                reader.take(4 + 8, f"the type and offset of {name}")
