"""Pricing a ledger's tallies: rubles = wall-clock hours x chips x USD per chip-hour (+ infrastructure
rows) x the session's USD->RUB rate, each session at its own price row and dated rate; plus, for a session
whose run folder is priced as object storage (``cost.storage``), its GB-months and requests at its storage
class's rows (``cost.storage``: a line of its own, ``storage``, beside the phases).

Decay branches: a run started from another run's checkpoint (``trainer/branch.py``) stands on the
parent's work up to that step. Its first session writes an ``inherit`` record with the parent's
totals when it saved that checkpoint (``summarize_ledger_at``); the branch's totals add them
(rubles, dollars, hours and tokens, phase by phase), so a branch costs what it took to reach it
plus its own.
"""

from __future__ import annotations

import os
from typing import Any

from cost.catalog import PriceRow
from cost.ledger_format import read_sessions
from cost.ledger_sessions import Tally, tally_on_disk
from cost.storage import HOURS_PER_MONTH, storage_usd
from cost.summary import CostSummary
from experiment.errors import DataError

STORAGE = "storage"  # the line of object storage in a ledger's rubles (not a phase: bytes x time, and requests)


def hourly_usd(meta: dict[str, Any]) -> float:
    """USD per wall-clock hour of a session: chips x chip-hour price + hourly infrastructure."""
    usd = meta["chips"] * meta["price"]["usd"]
    for item in meta.get("infra", []):
        if item["unit"] == "hour":
            usd += item["quantity"] * item["usd"]
        elif item["unit"] == "gb-month":
            usd += item["quantity"] * item["usd"] / HOURS_PER_MONTH
    return usd


def one_off_usd(meta: dict[str, Any]) -> float:
    return sum(item["quantity"] * item["usd"] for item in meta.get("infra", []) if item["unit"] == "gb")


def usd_by_phase(meta: dict[str, Any], tally: Tally, first: bool) -> dict[str, float]:
    """A session's dollars by phase at its own price row (and, for the first session, per-GB charges; for a
    session that prices its run folder's object storage, ``storage``)."""
    hourly = hourly_usd(meta)
    usd = {phase: secs / 3600 * hourly for phase, secs in tally.seconds.items()}
    if first and one_off_usd(meta):
        usd["one_off"] = one_off_usd(meta)
    if meta.get("storage"):
        usd[STORAGE] = storage_usd(meta["storage"], tally.storage, meta["usd_rub_rate"])
    return usd


def summarize(sessions: list[tuple[dict[str, Any], Tally]], token_budget: int | None) -> CostSummary:
    """Price each session's tally with its own price row and rate, and add them up."""
    if not sessions:
        raise DataError("an empty ledger has nothing to summarize")
    seconds: dict[str, float] = {}
    rub_by_phase: dict[str, float] = {}
    usd_total = rub_total = chip_hours = 0.0
    tokens = 0
    last_step = None
    inherited = [meta["inherited"] for meta, _ in sessions if "inherited" in meta]
    if inherited:  # a branch: the parent's totals up to the branch step, priced as the parent paid them
        parent = inherited[-1]
        seconds.update(parent["seconds_by_phase"])
        rub_by_phase.update(parent["rub_by_phase"])
        usd_total, rub_total, chip_hours = parent["usd_total"], parent["rub_total"], parent["chip_hours"]
        tokens, last_step = parent["tokens"], parent["step"]
    for index, (meta, tally) in enumerate(sessions):
        rate = meta["usd_rub_rate"]
        for phase, usd in usd_by_phase(meta, tally, first=index == 0).items():
            rub_by_phase[phase] = rub_by_phase.get(phase, 0.0) + usd * rate
            usd_total += usd
            rub_total += usd * rate
        for phase, secs in tally.seconds.items():
            seconds[phase] = seconds.get(phase, 0.0) + secs
            chip_hours += secs / 3600 * meta["chips"]
        tokens += tally.tokens
        if tally.last_step is not None:
            last_step = tally.last_step if last_step is None else max(last_step, tally.last_step)
    meta = sessions[-1][0]
    return CostSummary(
        run_id=meta.get("run_id"), sessions=len(sessions), price=PriceRow(**meta["price"]), chips=meta["chips"],
        chips_in_use=meta.get("chips_in_use"), usd_rub_rate=meta["usd_rub_rate"], rate_date=meta["rate_date"],
        rate_source=meta.get("rate_source", ""), hours=sum(seconds.values()) / 3600, chip_hours=chip_hours,
        usd_total=usd_total, rub_total=rub_total, tokens=tokens, last_step=last_step, token_budget=token_budget,
        projected_rub_to_budget=CostSummary.projection(rub_by_phase, tokens, token_budget),
        seconds_by_phase=seconds, rub_by_phase=rub_by_phase, infra=tuple(meta.get("infra", [])),
        rate_notes=tuple(meta.get("rate_notes", [])),
    )


def summarize_ledger(ledger_dir: str | os.PathLike[str]) -> CostSummary:
    """The summary of a ledger on disk (e.g. a finished or crashed run), without opening a session."""
    sessions = read_sessions(ledger_dir)
    return summarize(tally_on_disk(sessions), sessions[-1].meta.get("token_budget"))


def summarize_ledger_at(ledger_dir: str | os.PathLike[str], checkpoint_item: dict[str, Any]) -> CostSummary:
    """What a run had cost when it started saving a checkpoint: its ledger cut at the session and
    moment of that checkpoint's ledger item (``checkpoint_record``, which flushed the ledger first),
    for a decay branch that starts from the checkpoint."""
    sessions = read_sessions(ledger_dir, checkpoint_item)
    return summarize(tally_on_disk(sessions), sessions[-1].meta.get("token_budget"))
