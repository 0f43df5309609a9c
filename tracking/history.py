"""Continue a W&B run's offline history across an interrupted session.

wandb writes offline history in blocks, so a SIGKILLed session can leave nothing of what it logged
in its local folder. Synced in order, W&B keeps the first value of each step; the resumed session
re-logs, from the stage's own JSON-lines log, the steps after the last one any earlier folder kept,
so the synced history has no gap. (Steps after the checkpoint are retraced by training itself.)
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from experiment import appendlog
from experiment.errors import RecipeError
from experiment.jsonl import read_jsonl
from experiment.storage import RunPath
from tracking.readback import find_offline_runs, read_offline_run

log = logging.getLogger("tracking.history")


def last_kept_step(wandb_run: Any) -> int:
    """The highest ``_step`` any other local folder of this W&B run kept (0: none)."""
    this_folder = Path(wandb_run.dir).parent.resolve()
    kept = 0
    for folder in find_offline_runs(this_folder.parent):
        if folder.resolve() != this_folder and folder.name.endswith(f"-{wandb_run.id}"):
            with contextlib.suppress(RecipeError):
                kept = max([kept, *(int(row["_step"]) for row in read_offline_run(folder).history if "_step" in row)])
    return kept


def backfill_offline_history(wandb_run: Any, log_path: RunPath, resumed_step: int,
                             step_key: str = "train/step") -> None:
    """Re-log the records of ``log_path`` (one JSON object a line, its step under ``step_key``) after
    the last step earlier local folders of this run kept, up to ``resumed_step``."""
    kept = last_kept_step(wandb_run)
    if kept >= resumed_step or not appendlog.exists(log_path):
        return
    records: dict[int, dict[str, Any]] = {}
    # the trainer trimmed the log to the restored step before this runs: a torn tail would be a writer's
    for record in read_jsonl(log_path, torn_tail="ignore").values:
        step = record.get(step_key) if isinstance(record, dict) else None
        if isinstance(step, int) and kept < step <= resumed_step:  # e.g. no step: not a metrics line
            records[step] = {**records.get(step, {}), **record}
    for step in sorted(records):
        wandb_run.log(records[step], step=step)
    log.info("W&B: re-logged %d step(s) up to %d that the interrupted session's local files lost",
             len(records), resumed_step)
