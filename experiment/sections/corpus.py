from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from experiment.errors import ConfigError


@dataclass
class SourceConfig:
    kind: Literal["debian", "files", "hub"]
    name: str = ""  # label in document ids and the manifest; defaults to the kind
    # kind=debian: Debian packages fetched with apt-get download and unpacked with dpkg -x
    packages: list[str] = field(default_factory=lambda: ["fortunes-ru", "manpages-ru", "debian-faq-ru"])
    # kind=files: globs of .txt / .jsonl(.gz|.zst) / .parquet files
    paths: list[str] = field(default_factory=list)
    text_field: str = "text"
    # kind=hub: a Hugging Face dataset id
    dataset: str = ""
    config_name: str = ""
    split: str = "train"
    streaming: bool = True
    max_documents: int | None = None

    def validate(self, key: str) -> None:
        if self.kind == "files" and not self.paths:
            raise ConfigError(f"config key '{key}.paths': a files source needs at least one path or glob")
        if self.kind == "hub" and not self.dataset:
            raise ConfigError(f"config key '{key}.dataset': a hub source needs a dataset id")


@dataclass
class CorpusConfig:
    sources: list[SourceConfig] = field(default_factory=lambda: [SourceConfig(kind="debian")])
    min_chars: int = 200
    max_chars: int = 200_000
    min_cyrillic_share: float = 0.5
    docs_per_shard: int = 50_000

    def validate(self, key: str) -> None:
        if not self.sources:
            raise ConfigError(f"config key '{key}.sources': at least one source is needed")
