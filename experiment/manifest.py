"""Stage manifests: the file that says a stage finished, written last and atomically.

A stage removes its old manifest before it writes anything, so a crash mid-run leaves a folder
without a manifest, and the next stage refuses it instead of trusting half the output. It never
does so through a link into another run (experiment/links.py): that data is read-only here.

The files a manifest lists (``file`` and ``model_file`` entries, at any depth) are names inside its
folder: an absolute path or one leaving the folder is refused when the manifest is read.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from experiment.errors import DataError, MissingStageError
from experiment.files import atomic_write_json, remove_file
from experiment.jsontext import parse_json
from experiment.runfolder import link_target, linked_run
from experiment.storage import RunPath, location

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1
FILE_KEYS = frozenset({"file", "model_file"})  # manifest entries that name a file of the stage's folder


def manifest_path(stage_dir: RunPath | str) -> RunPath:
    return location(stage_dir) / MANIFEST_NAME


def invalidate(stage_dir: RunPath | str) -> None:
    """Mark a stage folder as unfinished before rewriting it."""
    stage_dir = location(stage_dir)
    owner = linked_run(stage_dir)
    if owner is not None:
        raise DataError(f"{stage_dir} is a link to {link_target(stage_dir)} (the data of run {owner}): its data is "
                        "read-only here; remove the link to build this run's own")
    remove_file(manifest_path(stage_dir))  # first: refused through a link before anything is made there
    stage_dir.mkdir(parents=True, exist_ok=True)


def write_manifest(stage_dir: RunPath | str, stage: str, payload: dict[str, Any]) -> RunPath:
    body = {
        "stage": stage,
        "schema_version": SCHEMA_VERSION,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **payload,
    }
    path = manifest_path(stage_dir)
    atomic_write_json(path, body)
    return path


def read_manifest(stage_dir: RunPath | str, stage: str, recipe: str) -> dict[str, Any]:
    """Read a finished stage's manifest or say which recipe to run first."""
    path = manifest_path(stage_dir)
    if not path.is_file():
        raise MissingStageError(f"{stage} output not found ({path} is missing): run {recipe} first")
    try:
        body = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is not a readable manifest ({exc}): run {recipe} again") from exc
    if body.get("stage") != stage:
        raise DataError(f"{path} belongs to stage '{body.get('stage')}', expected '{stage}'")
    if body.get("schema_version") != SCHEMA_VERSION:
        raise MissingStageError(
            f"{path} has schema version {body.get('schema_version')}, this code needs {SCHEMA_VERSION}: "
            f"run {recipe} again"
        )
    _check_entries(body, path, "")
    return body


def _check_entries(node: Any, path: RunPath, where: str) -> None:
    """Every file a manifest names is a relative path inside its folder (not absolute, no ``..``)."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            _check_entries(item, path, f"{where}[{index}]")
    elif isinstance(node, dict):
        for key, value in node.items():
            entry = f"{where}.{key}" if where else str(key)
            if key in FILE_KEYS and isinstance(value, str):
                parts = Path(value).parts
                if not value or Path(value).is_absolute() or ".." in parts or "://" in value:
                    raise DataError(f"{path}: entry '{entry}' is {value!r}, not a file name inside {path.parent}: "
                                    "a manifest lists only files of its own folder")
            else:
                _check_entries(value, path, entry)
