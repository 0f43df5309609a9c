"""The experiment's run folder: where every stage finds its inputs and leaves its outputs.

``experiment.run_root`` is a local folder or a bucket URL (``gs://bucket/prefix``, ``s3://bucket/prefix``,
``experiment.storage``); the run folder is ``<run_root>/<experiment.name>`` either way, with the same layout.

A stage folder may be a *link* to the same stage folder of another run (a branch's tokenizer and shards, a
sweep's shared data, ``experiment.data_from``: ``experiment.links``). Locally a link is a symlink, as before;
in a bucket, which has no links, it is a small file ``<folder>.link`` beside where the folder would be,
naming the folder it stands for (also used locally when the target is in a bucket). ``RunFolder``'s stage
folders resolve either kind, so a stage reads linked data without knowing it is linked.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

from experiment.config import dump_yaml
from experiment.errors import DataError
from experiment.files import RUN_FOLDER_MARKER, atomic_write_text
from experiment.jsontext import parse_json
from experiment.schema import ExperimentConfig
from experiment.storage import BucketPath, RunPath, host_local_root, location
from experiment.storage.retry import create_exclusive_checked

RESOLVED_CONFIG = RUN_FOLDER_MARKER  # every stage writes it first: its presence marks a run folder
LINK_SUFFIX = ".link"  # <folder>.link: a JSON file naming the folder of another run that stands for <folder>


def link_file(folder: RunPath) -> RunPath:
    return folder.with_name(folder.name + LINK_SUFFIX)


def link_target(folder: RunPath) -> RunPath | None:
    """The folder a link at ``folder`` stands for (a symlink's target, or a link file's), or None: no link."""
    if isinstance(folder, Path) and folder.is_symlink():
        return folder.resolve()
    path = link_file(folder)
    if not path.is_file():
        return None
    try:
        return location(str(parse_json(path.read_text(encoding="utf-8"))["target"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path} is not a readable link file ({exc}): remove it and run the recipe again") from exc


def is_linked(folder: RunPath) -> bool:
    return (isinstance(folder, Path) and folder.is_symlink()) or link_file(folder).is_file()


def make_link(folder: RunPath, target: RunPath) -> None:
    """Make ``folder`` a link to ``target`` (a symlink where both are local, a link file elsewhere);
    FileExistsError when another process made it first."""
    if isinstance(folder, Path) and isinstance(target, Path):
        folder.symlink_to(target, target_is_directory=True)
        return
    # the same link made by two processes of one run is the same bytes: either may report it as its own
    create_exclusive_checked(link_file(folder), (json.dumps({"target": str(target)}) + "\n").encode())


def stage_folder(root: RunPath, name: str) -> RunPath:
    """``root/name``, or the folder a link file there stands for (a symlink resolves itself when used)."""
    folder = root / name
    if isinstance(folder, Path) and folder.is_symlink():
        return folder
    target = link_target(folder)
    return folder if target is None else target


def linked_run(folder: RunPath) -> RunPath | None:
    """The run folder whose stage folder ``folder`` links to (None: not a link, or a link of the user's own
    to storage elsewhere: its target is no stage folder of the same name in a run folder)."""
    target = link_target(folder)
    if target is None:
        return None
    owner = target.parent
    return owner if target.name == folder.name and (owner / RESOLVED_CONFIG).is_file() else None


@dataclass(frozen=True)
class RunFolder:
    root: RunPath

    @classmethod
    def for_config(cls, cfg: ExperimentConfig) -> RunFolder:
        return cls(location(cfg.experiment.run_root, "experiment.run_root") / cfg.experiment.name)

    @property
    def in_bucket(self) -> bool:
        return isinstance(self.root, BucketPath)

    @property
    def local(self) -> Path:
        """This run's folder on the host's own disk: the run folder itself when it is local; for a run in a
        bucket, ``host_local_root()/<scheme>/<bucket>/<prefix>/<experiment>``."""
        if isinstance(self.root, Path):
            return self.root
        return host_local_root() / self.root.scheme / self.root.bucket / self.root.key

    @property
    def corpus(self) -> RunPath:
        return stage_folder(self.root, "corpus")

    @property
    def tokenizer(self) -> RunPath:
        return stage_folder(self.root, "tokenizer")

    @property
    def shards(self) -> RunPath:
        return stage_folder(self.root, "shards")

    @property
    def checkpoints(self) -> RunPath:
        return self.root / "checkpoints"

    @property
    def ledger(self) -> RunPath:
        return self.root / "ledger"

    @property
    def eval(self) -> RunPath:
        return self.root / "eval"

    @property
    def export(self) -> RunPath:
        return self.root / "export"

    @property
    def generate(self) -> RunPath:
        return self.root / "generate"

    @property
    def mera(self) -> RunPath:
        return self.root / "mera"

    @property
    def wandb(self) -> Path:
        """W&B's own files stay on this host's disk (``local``): offline runs are synced from there."""
        return self.local / "wandb"

    @property
    def reports(self) -> RunPath:
        return self.root / "reports"

    def save_resolved_config(self, cfg: ExperimentConfig, stage: str) -> RunPath:
        """Keep what actually ran: the latest resolved config plus one per stage invocation."""
        text = dump_yaml(cfg)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        atomic_write_text(self.root / "configs" / f"{stamp}-{stage}.yaml", text)
        atomic_write_text(self.root / RESOLVED_CONFIG, text)
        return self.root / RESOLVED_CONFIG
