"""Stage manifests: the file that says a stage finished, written last and atomically.

A stage removes its old manifest before it writes anything, so a crash mid-run leaves a folder
without a manifest, and the next stage refuses it instead of trusting half the output.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from experiment.errors import DataError, MissingStageError
from experiment.files import atomic_write_json

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1


def manifest_path(stage_dir: Path) -> Path:
    return Path(stage_dir) / MANIFEST_NAME


def invalidate(stage_dir: Path) -> None:
    """Mark a stage folder as unfinished before rewriting it."""
    stage_dir = Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    manifest_path(stage_dir).unlink(missing_ok=True)


def write_manifest(stage_dir: Path, stage: str, payload: dict[str, Any]) -> Path:
    body = {
        "stage": stage,
        "schema_version": SCHEMA_VERSION,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **payload,
    }
    path = manifest_path(stage_dir)
    atomic_write_json(path, body)
    return path


def read_manifest(stage_dir: Path, stage: str, recipe: str) -> dict[str, Any]:
    """Read a finished stage's manifest or say which recipe to run first."""
    path = manifest_path(stage_dir)
    if not path.is_file():
        raise MissingStageError(f"{stage} output not found ({path} is missing): run {recipe} first")
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is not a readable manifest ({exc}): run {recipe} again") from exc
    if body.get("stage") != stage:
        raise DataError(f"{path} belongs to stage '{body.get('stage')}', expected '{stage}'")
    if body.get("schema_version") != SCHEMA_VERSION:
        raise MissingStageError(
            f"{path} has schema version {body.get('schema_version')}, this code needs {SCHEMA_VERSION}: run {recipe} again"
        )
    return body
