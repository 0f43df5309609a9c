from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from experiment.errors import ConfigError
from experiment.storage.urls import check_any_url


@dataclass
class ShardsConfig:
    # rows hold model.max_seq_len + 1 tokens: the one sequence length, recorded in the shards' manifest
    packing: Literal["concat", "document"] = "concat"
    validation_percent: float = 1.0  # documents go to validation by a hash of their id
    records_per_shard: int = 8192
    encode_batch_documents: int = 512  # documents handed to SentencePiece per batched encode call
    num_threads: int = 0  # SentencePiece encoding threads; 0 = every core of this machine
    # a corrupt record stops the loader, or is logged, counted and trains nothing
    on_corrupt: Literal["error", "skip"] = "error"
    runner: Literal["local", "beam"] = "local"  # "beam" needs the optional `beam` extra; same bytes as local
    beam_options: list[str] = field(default_factory=list)  # Beam flags, e.g. ["--runner=DirectRunner"]
    # where Beam workers write the TFRecord shards and indexes (gs://..., s3://...); "" = the run's shards/
    # folder, which the loader reads (a bucket needs a mount or a copy there); the manifest names it as data_uri
    output_uri: str = ""

    def validate(self, key: str) -> None:
        prefix = f"{key}." if key else ""
        check_any_url(self.output_uri, f"{prefix}output_uri")
        if not 0.0 <= self.validation_percent < 100.0:
            raise ConfigError(
                f"config key '{prefix}validation_percent': must be in [0, 100), got {self.validation_percent}"
            )
        if self.records_per_shard < 1:
            raise ConfigError(f"config key '{prefix}records_per_shard': must be at least 1, "
                              f"got {self.records_per_shard}")
        if self.encode_batch_documents < 1:
            raise ConfigError(
                f"config key '{prefix}encode_batch_documents': must be at least 1, got {self.encode_batch_documents}"
            )
        if self.num_threads < 0:
            raise ConfigError(f"config key '{prefix}num_threads': must be 0 (all cores) or more, "
                              f"got {self.num_threads}")
        if self.output_uri and self.runner != "beam":
            raise ConfigError(f"config key '{prefix}output_uri': is written by Beam workers: set shards.runner=beam, "
                              "or leave it empty")
