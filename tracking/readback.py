"""Read W&B runs back: local offline runs with wandb's own log reader, or the W&B API when online.

wandb 0.31 offline writes no ``wandb-summary.json``; the run lives in a ``run-<id>.wandb``
transaction log. ``wandb leet inspect --json <run dir>`` prints its records, one JSON object a
line: ``run`` (name, group, job type, config), ``history`` rows, ``summary`` updates, ``exit``.
We fold those into a ``RunRecord``: the same shape the API path gives, so callers do not care
where a run came from.

That CLI command is a Python wrapper that resolves the log file and runs wandb's bundled ``wandb-core``
binary with ``leet inspect``; we run the binary with the same arguments ourselves (``inspect_command``):
the wrapper's interpreter start and ``import wandb`` cost ~1.2 s of CPU per run read (~30x the read
itself), paid for every run a comparison reads. tests/test_tracking.py checks that both print the same.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment.errors import DataError
from experiment.jsonl import parse_jsonl

log = logging.getLogger("tracking.readback")


@dataclass
class RunRecord:
    run_id: str
    name: str
    group: str
    job_type: str
    state: str  # finished, failed, running/crashed (no exit record)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    start_time: str = ""
    source: str = ""  # the run directory, or "wandb-api"


def find_offline_runs(wandb_dir: str | Path) -> list[Path]:
    """Offline run directories under a run folder's ``wandb/`` (wandb nests them in ``wandb/wandb/``)."""
    wandb_dir = Path(wandb_dir)
    found = {p.parent for p in wandb_dir.glob("offline-run-*/run-*.wandb")}
    found |= {p.parent for p in wandb_dir.glob("wandb/offline-run-*/run-*.wandb")}
    return sorted(found)


def inspect_command(run_dir: Path, summary: bool = False) -> list[str]:
    """What ``wandb leet inspect --json [--summary] <run_dir>`` runs: wandb-core's reader of the run's one
    ``run-*.wandb`` log (the wrapper's own path resolution, without observability uploads: the run is offline).
    ``summary``: print the run's final summary as one object, nested values (a logged table's fields) as
    nested objects; the record stream spells them as dotted keys (``eval/results._type``)."""
    from wandb.util import get_core_path  # imports wandb, as every caller has (to log)

    logs = sorted(run_dir.glob("run-*.wandb"))
    if len(logs) != 1:
        raise DataError(f"{run_dir}: expected one run-*.wandb log, found {len(logs)}")
    return [get_core_path(), "leet", "inspect", "--no-observability", "--json", *(["--summary"] if summary else []),
            "--run-file", str(logs[0]), str(run_dir.parent)]


def _fold(records: Iterable[dict[str, Any]], source: str) -> RunRecord:
    run = RunRecord(run_id="", name="", group="", job_type="", state="running or crashed", source=source)
    for record in records:
        kind = record.get("type")
        if kind == "run":
            body = record["run"]
            run.run_id = body.get("run_id", "")
            run.name = body.get("display_name", "")
            run.group = body.get("run_group", "")
            run.job_type = body.get("job_type", "")
            run.start_time = body.get("start_time", "")
            run.config.update(_config_values(body.get("config", {}).get("update", {})))
        elif kind == "config":
            run.config.update(_config_values(record["config"].get("update", {})))
        elif kind == "history":
            run.history.append(record["history"]["item"])
        elif kind == "summary":
            run.summary.update(record["summary"].get("update", {}))
            for key in record["summary"].get("remove", []) or []:
                run.summary.pop(key, None)
        elif kind == "exit":
            run.state = "finished" if record["exit"].get("exit_code", 0) == 0 else "failed"
    run.summary = {k: v for k, v in run.summary.items() if not k.startswith("_wandb")}
    run.config.pop("_wandb", None)
    return run


def _config_values(update: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in update.items() if k != "_wandb"}


def read_offline_run(run_dir: str | Path, timeout_s: float = 120.0) -> RunRecord:
    """One offline run, read with ``wandb leet inspect --json``."""
    run_dir = Path(run_dir).resolve()
    try:
        proc = subprocess.run(inspect_command(run_dir), capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise DataError(f"{run_dir}: 'wandb leet inspect' did not answer within {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise DataError(f"{run_dir}: 'wandb leet inspect' failed: {detail[-1] if detail else proc.returncode}")
    # the reader reads past what it cannot (a damaged block, a log cut by a kill) and says so on stderr: the
    # run is what it could read, and whoever compares runs is told that it is not all of it
    if reported := proc.stderr.strip().splitlines():
        log.warning("%s: read only what wandb's reader could: %s", run_dir, reported[-1])
    # the command has exited: its whole output is here, a torn last line is a fault
    records = parse_jsonl(proc.stdout, f"{run_dir}: 'wandb leet inspect' output", torn_tail="error").values
    return _fold(records, str(run_dir))


def run_id_of(run_dir: Path) -> str:
    """The id at the end of ``offline-run-<date>_<time>-<id>``."""
    return run_dir.name.rsplit("-", 1)[-1]


def read_offline_runs(wandb_dir: str | Path, group: str | None = None, workers: int = 2,
                      exclude_ids: tuple[str, ...] = ()) -> list[RunRecord]:
    """Every readable offline run under ``wandb_dir`` (in ``group`` if given); unreadable ones are skipped
    with a warning, since a run killed mid-write must not hide the others."""
    run_dirs = [d for d in find_offline_runs(wandb_dir) if run_id_of(d) not in exclude_ids]
    if not run_dirs:
        return []
    log.info("reading %d offline W&B run(s) under %s with 'wandb leet inspect'", len(run_dirs), wandb_dir)

    def read(run_dir: Path) -> RunRecord | None:
        try:
            return read_offline_run(run_dir)
        except DataError as exc:
            log.warning("skipping a W&B run: %s", exc)
            return None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        runs = [run for run in pool.map(read, run_dirs) if run is not None]
    return [run for run in runs if group is None or run.group == group]


def read_online_runs(project: str, entity: str, group: str,
                     history_keys: list[str] | list[list[str]]) -> list[RunRecord]:
    """The group's runs through the W&B API (needs an API key and network). ``history_keys``: one list of
    keys, or several (W&B returns only rows holding every key of a scan: one scan per list, rows merged by step)."""
    import wandb

    api = wandb.Api(timeout=20)
    path = f"{entity}/{project}" if entity else project
    scans = [list(k) for k in history_keys] if history_keys and isinstance(history_keys[0], list) else [history_keys]
    runs = []
    for run in api.runs(path, filters={"group": group}):
        rows: dict[Any, dict[str, Any]] = {}
        for keys in (k for k in scans if k):
            for row in run.scan_history(keys=keys):
                rows.setdefault(row.get("_step", len(rows)), {}).update(row)
        history = [rows[step] for step in sorted(rows, key=lambda s: (not isinstance(s, (int, float)), s))]
        runs.append(RunRecord(run_id=run.id, name=run.name, group=run.group or "", job_type=run.job_type or "",
                              state=run.state, config=dict(run.config), summary=dict(run.summary_metrics),
                              history=history, start_time=str(run.created_at), source="wandb-api"))
    return runs
