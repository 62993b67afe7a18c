"""Read the history rows of an offline W&B run from its ``run-*.wandb`` file (test helper).

wandb has no offline reader; the file is a record log: a 7-byte header (b":W&B", 0xBEE1, 0),
then 32 KiB blocks of chunks, each with a 7-byte header (CRC-32 of type + data, length,
type: 1 whole, 2 first, 3 middle, 4 last), whose joined payloads are protobuf ``Record``s.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

FILE_HEADER = struct.Struct("<4sHB")
CHUNK_HEADER = struct.Struct("<IHB")
BLOCK = 32 * 1024


def payloads(path: Path):
    data = path.read_bytes()
    assert FILE_HEADER.unpack_from(data) == (b":W&B", 0xBEE1, 0), f"{path} is not a wandb log"
    pos, parts = FILE_HEADER.size, b""
    while pos + CHUNK_HEADER.size <= len(data):
        room = BLOCK - pos % BLOCK
        if room < CHUNK_HEADER.size:  # padding at a block's end
            pos += room
            continue
        crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        if kind == 0:
            pos += room
            continue
        chunk = data[pos + CHUNK_HEADER.size : pos + CHUNK_HEADER.size + length]
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"{path}: bad checksum at {pos}"
        pos += CHUNK_HEADER.size + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            yield parts


def history_rows(wandb_dir: Path) -> list[dict]:
    """Every history row logged by the (single) run under ``wandb_dir``."""
    from wandb.proto import wandb_internal_pb2

    (path,) = Path(wandb_dir).glob("wandb/offline-run-*/run-*.wandb")
    rows = []
    for payload in payloads(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows
