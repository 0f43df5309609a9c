"""Reading a TFRecord file front to back without its index: how tests read what a writer wrote
(our shards, TensorFlow's files) independently of the index the loader trusts."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from data_prep.shards.tfrecord import CorruptRecordError, read_record_at, record_size


def iter_records(path: Path | str, on_corrupt: Literal["error", "skip"] = "error") -> Iterator[tuple[int, bytes]]:
    """``(offset, payload)`` per record. After a corrupt record the framing cannot be trusted, so with
    ``on_corrupt='skip'`` the scan stops there (the caller sees fewer records than the index lists)."""
    path = Path(path)
    if os.path.getsize(path) == 0:
        return
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        offset, record = 0, 0
        while offset < len(buf):
            try:
                payload = read_record_at(buf, offset, path, record)
            except CorruptRecordError:
                if on_corrupt == "skip":
                    return
                raise
            yield offset, payload
            offset += record_size(len(payload))
            record += 1
