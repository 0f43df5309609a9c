"""The order the suite's modules start in: the longest first, by the times their tests took in earlier sessions.

pytest-xdist's ``loadscope`` gives each worker a whole module at a time, in the order it receives them
(``--no-loadscope-reorder`` in pyproject: its own reorder puts the modules with the most tests first, not the
slowest). Started last, one long module (a kill-and-resume torture run) kept one worker busy for over a minute
after the other had run out of work; started first, the short modules fill in beside it (longest processing
time first, the classic greedy schedule).

The times live beside the tests' compilation cache (``~/.cache/ru-pretrain/test-durations.json``: node id ->
seconds of setup, call and teardown), written by the controlling process at the end of each session, merged
with what it did not run. The controlling process reads them once and hands them to its workers, so every
worker sorts the same collection the same way even while another session rewrites the file (xdist aborts a
run whose workers collected different orders). With no record (a fresh machine) the order is the collection's.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from experiment.files import atomic_write_json
from tests.recipe_runner import suite_cache_home

DURATIONS_VAR = "RU_TEST_DURATIONS"  # another file (or "" for none): e.g. to measure a run in collection order


def durations_file() -> Path | None:
    if DURATIONS_VAR in os.environ:
        return Path(os.environ[DURATIONS_VAR]) if os.environ[DURATIONS_VAR] else None
    return suite_cache_home() / "test-durations.json"


def read_durations(path: Path | None) -> dict[str, float]:
    """The recorded seconds per test node id; nothing when the file is missing or not such a mapping (an
    ordering hint only: a damaged file costs the order, never the run)."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(k, str) and isinstance(v, int | float)}


def write_durations(path: Path | None, measured: dict[str, float]) -> None:
    """Merge this session's times into the file (atomically: a concurrent session reads the old or the new
    file, never half of one); a file that cannot be written is left as it is."""
    if path is None or not measured:
        return
    merged = {**read_durations(path), **{k: round(v, 3) for k, v in measured.items()}}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, dict(sorted(merged.items())))


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_modules_first(items: list[Any], durations: dict[str, float]) -> list[Any]:
    """``items`` (anything with a ``nodeid``) regrouped by module, the modules by their recorded total time,
    longest first; a module's tests keep their order, and modules of equal time (none recorded) theirs."""
    by_module: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        by_module[module_of(item.nodeid)].append(item)
    seconds = {module: sum(durations.get(item.nodeid, 0.0) for item in group) for module, group in by_module.items()}
    order = sorted(by_module, key=lambda module: -seconds[module])  # stable: ties keep the collection's order
    return [item for module in order for item in by_module[module]]
