"""The shards folder's layout, shared by the local writer (``build``) and the Beam pipeline (``beam``).

Split names and routing, shard file names, the feature schema and each shard's manifest entry: both
writers take them from here, so their folders are the same byte for byte.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from data_prep.shards.tfrecord import TFRecordWriter
from experiment.split import is_validation

SPLITS = ("train", "validation")
# <run folder>/verified/<shard folder key>/<shard file>.json: a training run's record that its loader hashed that
# shard in full against the manifest (sha256) as the storage had it then (its generation); the run's later loaders
# trust the record while the generation holds. In the reading run's own folder: another run's shards stay untouched
VERIFIED_DIR = "verified"
FEATURE_FORMAT = "tfrecord/tf.train.Example"


def shard_file_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.tfrecord"


def feature_schema(seq_len: int, packing: str) -> dict[str, Any]:
    """The documented feature schema of every record (also stored in the manifest)."""
    names = ["input_ids"] + (["segment_ids", "positions"] if packing == "document" else [])
    return {
        "format": FEATURE_FORMAT,
        "features": {name: {"dtype": "int64", "shape": [seq_len + 1]} for name in names},
    }


def shard_summary(writer: TFRecordWriter, tokens: int) -> dict[str, Any]:
    """A closed shard's manifest entry."""
    return {"file": writer.path.name, "records": writer.records, "tokens": tokens, "bytes": writer.bytes_written,
            "sha256": writer.sha256}


def row_tokens(rows: dict[str, np.ndarray], pad_mask_key: str | None) -> list[int]:
    """Document tokens in each row (padding, marked by segment 0, does not count)."""
    if pad_mask_key:
        return np.count_nonzero(rows[pad_mask_key], axis=1).tolist()
    return [rows["input_ids"].shape[1]] * rows["input_ids"].shape[0]


def split_of(doc_id: Any, validation_percent: float) -> str:
    return "validation" if is_validation(str(doc_id), validation_percent) else "train"
