"""What a training process reports, and where: process 0 books the ledger, writes ``train_log.jsonl``
and logs to W&B for the whole slice; every other process gets objects that keep nothing.

The choice is made once, at start-up, by ``trainer.distributed.is_primary`` (the W&B run by the
harness's ``reports`` hook, the ledger and the log here), so the loop never asks which process it is on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from typing import TYPE_CHECKING, Any, TypeAlias

import jax

from cost.summary import CostSummary
from cost.target import TRAIN_LOG
from experiment import appendlog
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from tracking.metrics import RUB_SPENT, log_step
from tracking.wandb_run import warn_if_folder_gone
from trainer.distributed import is_primary
from trainer.throughput import chips_in_use, devices_per_chip

if TYPE_CHECKING:
    from cost.ledger import Ledger

log = logging.getLogger("trainer")


class OtherHostLedger:
    """Hosts other than process 0 book nothing: process 0's ledger prices the whole slice (cost.chips)."""

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def add_tokens(self, step: int, tokens: int, by_set: dict[str, int] | None = None) -> None: ...

    def book_as_lost(self) -> None: ...

    def record_hang(self, what: str, seconds: float, lock_timeout: float = 10.0) -> bool:
        return True

    def checkpoint_record(self, step: int) -> dict[str, Any]:
        return {}

    def mark_checkpoint(self, step: int) -> None: ...

    def mark_resume(self, step: int, checkpoint_item: dict[str, Any] | None = None) -> None: ...

    def inherit(self, parent: Any, folder: str, step: int) -> None: ...

    def summary(self) -> None:
        return None

    def __enter__(self) -> OtherHostLedger:
        return self

    def __exit__(self, *exc: Any) -> None: ...


# the ledger a training process books: process 0's ``cost.ledger.Ledger``, an ``OtherHostLedger`` elsewhere
TrainLedger: TypeAlias = "Ledger | OtherHostLedger"


def open_ledger(cfg: ExperimentConfig, run_folder: RunFolder, run_id: str) -> TrainLedger:
    """This process's ledger of the session: process 0 books the run's ``cost.ledger.Ledger`` (its chip count
    reconciled with ``cost.chips``), the other processes an ``OtherHostLedger`` that keeps nothing."""
    from cost.chips import reconcile_chips
    from cost.ledger import Ledger

    in_use = reconcile_chips(cfg.cost.chips, chips_in_use(devices_per_chip(cfg)), jax.devices()[0].platform)
    if not is_primary():
        return OtherHostLedger()
    return Ledger.open(run_folder.ledger, cfg.cost, run_id, chips_in_use=in_use)


def open_train_log(run_folder: RunFolder) -> appendlog.LogWriter | None:
    """``train_log.jsonl`` for appending on process 0 (``experiment.appendlog``: a file on a disk, immutable
    segments in a bucket); None elsewhere."""
    return appendlog.LogWriter(run_folder.root / TRAIN_LOG) if is_primary() else None


SAMPLES_DIR = "samples"  # in the run folder: step_NNNNNNN.jsonl, the completions of each eval during training
SAMPLES_TABLE = "samples/completions"  # the W&B table of them, one per eval step
SAMPLE_COLUMNS = ("step", "rub_spent", "prompt", "completion")


def log_samples(wandb_run: Any, run_folder: RunFolder, step: int, records: list[dict[str, Any]],
                ledger_summary: CostSummary | None) -> None:
    """The completions of the fixed prompts at ``step`` (process 0): a W&B table (step, rubles spent so far, prompt,
    completion) logged at the step, and ``samples/step_NNNNNNN.jsonl`` written whole and atomically (a resumed run
    that evaluates the step again replaces it, as it retraces the same weights)."""
    if not is_primary():
        return
    from experiment.files import atomic_write_text

    rub = ledger_summary.step_metrics().get(RUB_SPENT) if ledger_summary is not None else None
    rows = [{"step": step, "rub_spent": rub, "prompt": r["prompt"], "completion": r["completion"],
             "token_ids": r.get("token_ids"), "new_tokens": r.get("new_tokens")} for r in records]
    atomic_write_text(run_folder.root / SAMPLES_DIR / f"step_{step:07d}.jsonl",
                      "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    if wandb_run is None:
        return
    import wandb

    table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[row[c] for c in SAMPLE_COLUMNS] for row in rows])
    wandb_run.log({SAMPLES_TABLE: table}, step=step)


def log_metrics(wandb_run: Any, train_log: appendlog.LogWriter | None, step: int, record: dict[str, Any],
                ledger_summary: CostSummary | None) -> None:
    """To W&B at an explicit step (a resumed run, a new local folder offline, continues the axis),
    with the rubles spent so far; and one JSON line per log step to ``train_log.jsonl``."""
    payload = log_step(wandb_run, step, record, ledger_summary.step_metrics() if ledger_summary is not None else {})
    warn_if_folder_gone(wandb_run)
    if train_log is not None:
        train_log.write(json.dumps(payload) + "\n")
        train_log.flush()
    if "train/loss" in record:
        log.info("step %d: loss %.4f, grad norm %.3f, lr %.2e, %.0f tokens/s, %.2f RUB", step, record["train/loss"],
                 record["train/grad_norm"], record["train/lr"], record["train/tokens_per_s"],
                 payload.get("cost/rub_spent", math.nan))
