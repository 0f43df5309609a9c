"""Pricing a ledger's tallies: rubles = wall-clock hours x chips x USD per chip-hour (+ infrastructure
rows) x the session's USD->RUB rate, each session at its own price row and dated rate; a chip-hour priced in
rubles (a Russian provider's row or a RUB contract rate, with ``cost.vat_rate`` added to a price before VAT) is
rubles x hours x chips, never converted through the rate (its USD column is derived from the rubles); plus,
for a session whose run folder is priced as object storage (``cost.storage``), its GB-months and requests at its storage
class's rows (``cost.storage``: a line of its own, ``storage``, beside the phases).

Decay branches: a run started from another run's checkpoint (``trainer/branch.py``) stands on the
parent's work up to that step. Its first session writes an ``inherit`` record with the parent's
totals when it saved that checkpoint (``summarize_ledger_at``); the branch's totals add them
(rubles, dollars, hours and tokens, phase by phase), so a branch costs what it took to reach it
plus its own.
"""

from __future__ import annotations

import math
import os
from typing import Any

from cost.catalog import PriceRow
from cost.ledger_format import read_sessions
from cost.ledger_sessions import Tally, tally_on_disk
from cost.storage import HOURS_PER_MONTH, storage_usd
from cost.summary import CostSummary
from experiment.errors import ConfigError, DataError

STORAGE = "storage"  # the line of object storage in a ledger's rubles (not a phase: bytes x time, and requests)


def chip_hour(meta: dict[str, Any]) -> tuple[float, str]:
    """A session's chip-hour as billed (VAT added to a figure before VAT, at the session's ``vat_rate``) and its
    currency; a ledger written before rubles and VAT were recorded reads as USD as billed."""
    row = PriceRow.stored(meta["price"])
    billed = row.billed(meta.get("vat_rate", 0.0))
    if billed is None:
        raise DataError(f"a ledger session priced by {row.describe()} has no figure for it")
    return billed, row.currency


def hourly_cost(meta: dict[str, Any]) -> tuple[float, float]:
    """(USD, RUB) per wall-clock hour of a session: chips x chip-hour price + hourly infrastructure, each figure
    counted in its own currency and the other derived at the session's rate (rubles stay rubles)."""
    rate = meta["usd_rub_rate"]
    infra_usd = hourly_usd_items(meta)
    chip_hour(meta)  # a row without a figure: the DataError naming it
    chips_usd, chips_rub = PriceRow.stored(meta["price"]).cost_of(meta["chips"], meta.get("vat_rate", 0.0), rate)
    return infra_usd + chips_usd, infra_usd * rate + chips_rub


def check_finite(meta: dict[str, Any]) -> None:
    """A price, chip count and rate whose hour is not a finite number of rubles (1e308 USD x 100 RUB) is refused
    before anything is booked: one line naming the figure."""
    usd, rub = hourly_cost(meta)
    if not (math.isfinite(usd) and math.isfinite(rub)):
        row = PriceRow.stored(meta["price"])
        raise ConfigError(f"config key '{row.price_key}': {meta['chips']} chips x {row.describe_figure()} at USD->RUB "
                          f"{meta['usd_rub_rate']:g} is not a finite number of rubles per hour; check the figure")


def hourly_usd_items(meta: dict[str, Any]) -> float:
    """USD per wall-clock hour of a session's infrastructure rows (priced in USD)."""
    usd = 0.0
    for item in meta.get("infra", []):
        if item["unit"] == "hour":
            usd += item["quantity"] * item["usd"]
        elif item["unit"] == "gb-month":
            usd += item["quantity"] * item["usd"] / HOURS_PER_MONTH
    return usd


def one_off_usd(meta: dict[str, Any]) -> float:
    return sum(item["quantity"] * item["usd"] for item in meta.get("infra", []) if item["unit"] == "gb")


def cost_by_phase(meta: dict[str, Any], tally: Tally, first: bool) -> dict[str, tuple[float, float]]:
    """A session's (USD, RUB) by phase at its own price row (and, for the first session, per-GB charges; for a
    session that prices its run folder's object storage, ``storage``)."""
    rate = meta["usd_rub_rate"]
    usd_hour, rub_hour = hourly_cost(meta)
    cost = {phase: (secs / 3600 * usd_hour, secs / 3600 * rub_hour) for phase, secs in tally.seconds.items()}
    if first and one_off_usd(meta):
        cost["one_off"] = (one_off_usd(meta), one_off_usd(meta) * rate)
    if meta.get("storage"):
        usd = storage_usd(meta["storage"], tally.storage, rate)
        cost[STORAGE] = (usd, usd * rate)
    return cost


def summarize(sessions: list[tuple[dict[str, Any], Tally]], token_budget: int | None) -> CostSummary:
    """Price each session's tally with its own price row and rate, and add them up."""
    if not sessions:
        raise DataError("an empty ledger has nothing to summarize")
    seconds: dict[str, float] = {}
    rub_by_phase: dict[str, float] = {}
    usd_total = rub_total = wall_seconds = chip_seconds = 0.0
    tokens = 0
    last_step = None
    inherited = [meta["inherited"] for meta, _ in sessions if "inherited" in meta]
    if inherited:  # a branch: the parent's totals up to the branch step, priced as the parent paid them
        parent = inherited[-1]
        seconds.update(parent["seconds_by_phase"])
        rub_by_phase.update(parent["rub_by_phase"])
        usd_total, rub_total = parent["usd_total"], parent["rub_total"]
        wall_seconds = sum(parent["seconds_by_phase"].values())
        chip_seconds = parent["chip_hours"] * 3600
        tokens, last_step = parent["tokens"], parent["step"]
    for index, (meta, tally) in enumerate(sessions):
        for phase, (usd, rub) in cost_by_phase(meta, tally, first=index == 0).items():
            rub_by_phase[phase] = rub_by_phase.get(phase, 0.0) + rub
            usd_total += usd
            rub_total += rub
        for phase, secs in tally.seconds.items():
            seconds[phase] = seconds.get(phase, 0.0) + secs
            wall_seconds += secs
            chip_seconds += secs * meta["chips"]
        tokens += tally.tokens
        if tally.last_step is not None:
            last_step = tally.last_step if last_step is None else max(last_step, tally.last_step)
    meta = sessions[-1][0]
    return CostSummary(
        run_id=meta.get("run_id"), sessions=len(sessions), price=PriceRow.stored(meta["price"]), chips=meta["chips"],
        chips_in_use=meta.get("chips_in_use"), usd_rub_rate=meta["usd_rub_rate"], rate_date=meta["rate_date"],
        rate_source=meta.get("rate_source", ""), hours=wall_seconds / 3600,
        chip_hours=chip_seconds / 3600,  # added and divided alike: on one chip the two are the same float
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
