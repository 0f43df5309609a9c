from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class ShardsConfig:
    seq_len: int = 1024
    packing: Literal["concat", "document"] = "concat"
    validation_percent: float = 1.0  # documents go to validation by a hash of their id
    records_per_shard: int = 8192
