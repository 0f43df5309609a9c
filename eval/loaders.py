"""Reading task records from local files (CSV, JSON Lines, JSON) or the Hugging Face hub.

Every record comes back with where it came from (``file``, 1-based ``row``), so an item that
fails later can be named exactly. Nested hub records (MERA keeps fields under ``inputs``) are
flattened: ``{"inputs": {"question": ...}}`` also gives ``question``.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiment.errors import DataError
from experiment.jsonl import iter_jsonl
from experiment.jsontext import parse_json
from experiment.storage import RunPath, location

log = logging.getLogger("eval.loaders")


@dataclass(frozen=True)
class Record:
    where: str  # the file (or hub id) it came from
    row: int  # 1-based data row (CSV: not counting the header; JSONL: the line number)
    fields: dict[str, Any]

    def at(self) -> str:
        return f"{self.where}: row {self.row}"



class SourceUnavailable(DataError):
    """A task's data cannot be had here: no local file, or its hub dataset is unreachable."""

def flatten(fields: dict[str, Any]) -> dict[str, Any]:
    """Lift the keys of nested mappings to the top level where they do not collide."""
    flat = dict(fields)
    for value in fields.values():
        if isinstance(value, dict):
            for sub, sub_value in value.items():
                flat.setdefault(sub, sub_value)
    return flat


def _read_csv(path: Path) -> Iterator[Record]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        for row, fields in enumerate(reader, start=1):
            if None in fields:  # more cells than header columns
                raise DataError(f"{path}: row {row}: has {len(reader.fieldnames or []) + len(fields[None])} cells, "
                                f"the header has {len(reader.fieldnames or [])}")
            yield Record(str(path), row, dict(fields))


def _read_jsonl(path: Path) -> Iterator[Record]:
    with path.open(encoding="utf-8") as handle:
        # a downloaded or prepared dataset: a torn last line is a damaged file
        for line in iter_jsonl(handle, str(path), torn_tail="error"):
            fields, row = line.value, line.line
            if not isinstance(fields, dict):
                raise DataError(f"{path}: row {row}: expected a JSON object, got {type(fields).__name__}")
            yield Record(str(path), row, flatten(fields))


def _read_json(path: Path) -> Iterator[Record]:
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if isinstance(data, dict) and "data" in data:  # {"data": {split: [...]}} or {"data": [...]}
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of records (or {{'data': [...]}})")
    for row, fields in enumerate(data, start=1):
        if not isinstance(fields, dict):
            raise DataError(f"{path}: row {row}: expected a JSON object, got {type(fields).__name__}")
        yield Record(str(path), row, flatten(fields))


READERS = {".csv": _read_csv, ".jsonl": _read_jsonl, ".json": _read_json}


def read_file(path: str | RunPath) -> list[Record]:
    """All records of a task file (local or in a bucket); an empty file is an error (an empty split scores nothing)."""
    path = location(path)
    if not path.is_file():
        raise DataError(f"task file {path} does not exist")
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(f"task file {path}: unknown format '{path.suffix}' (use {', '.join(READERS)})")
    try:
        records = list(reader(path))
    except UnicodeDecodeError as exc:
        raise DataError(f"task file {path} is not UTF-8 (byte {exc.start})") from exc
    if not records:
        raise DataError(f"task file {path}: no rows (empty split)")
    return records


def read_hub(path: str, config: str | None, split: str) -> list[Record]:
    """Records of a hub dataset split; offline or unreachable hubs give a one-line error."""
    where = f"hub:{path}" + (f"/{config}" if config else "") + f"[{split}]"
    try:
        import datasets

        dataset = datasets.load_dataset(path, config, split=split)
    except Exception as exc:  # datasets raises many types (ConnectionError, OfflineModeIsEnabled, ...)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SourceUnavailable(f"{where} could not be loaded ({first}); put a local copy in eval.task_files") from exc
    records = [Record(where, row, flatten(dict(fields))) for row, fields in enumerate(dataset, start=1)]
    if not records:
        raise DataError(f"{where}: no rows (empty split)")
    return records
