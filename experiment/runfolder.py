"""The experiment's run folder: where every stage finds its inputs and leaves its outputs."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiment.config import dump_yaml
from experiment.files import atomic_write_text

RESOLVED_CONFIG = "config.resolved.yaml"  # every stage writes it first: its presence marks a run folder


def linked_run(folder: Path) -> Path | None:
    """The run folder whose stage folder ``folder`` links to (None: not a link, or a link of the user's own
    to storage elsewhere: its target is no stage folder of the same name in a run folder)."""
    folder = Path(folder)
    if not folder.is_symlink():
        return None
    target = folder.resolve()
    owner = target.parent
    return owner if target.name == folder.name and (owner / RESOLVED_CONFIG).is_file() else None


@dataclass(frozen=True)
class RunFolder:
    root: Path

    @classmethod
    def for_config(cls, cfg: Any) -> RunFolder:
        return cls(Path(cfg.experiment.run_root) / cfg.experiment.name)

    @property
    def corpus(self) -> Path:
        return self.root / "corpus"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    @property
    def export(self) -> Path:
        return self.root / "export"

    @property
    def generate(self) -> Path:
        return self.root / "generate"

    @property
    def mera(self) -> Path:
        return self.root / "mera"

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def save_resolved_config(self, cfg: Any, stage: str) -> Path:
        """Keep what actually ran: the latest resolved config plus one per stage invocation."""
        text = dump_yaml(cfg)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        atomic_write_text(self.root / "configs" / f"{stamp}-{stage}.yaml", text)
        atomic_write_text(self.root / RESOLVED_CONFIG, text)
        return self.root / RESOLVED_CONFIG
