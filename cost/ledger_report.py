"""The cost report beside a ledger: ``cost_report.md`` and ``cost_sessions.csv``, rewritten at every close.

Each session with its hardware, price row and dated rate (a run that moved between hardware is
priced session by session), then goodput and badput by phase in RUB, USD and share.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cost.ledger_format import Session, read_sessions
from cost.ledger_pricing import summarize, usd_by_phase
from cost.ledger_sessions import Tally, tally_on_disk
from cost.report import SIG, Column, to_csv, to_markdown
from cost.summary import PHASE_COLUMNS
from experiment.files import atomic_write_text

REPORT_FILE = "cost_report.md"  # rewritten at every close: sessions with their hardware, then goodput/badput
SESSIONS_CSV = "cost_sessions.csv"
SESSION_COLUMNS = (
    Column("session", "session", "{:d}"), Column("devices", "devices"), Column("accelerator", "priced as"),
    Column("pricing", "pricing"), Column("where", "cloud/region"), Column("usd_per_chip_hour", "USD / chip-hour"),
    Column("chips", "chips priced", "{:d}"), Column("resumed_from", "resumed from step"),
    Column("tokens", "tokens", "{:,.0f}"), Column("hours", "hours", SIG), Column("rub", "rubles", SIG),
    Column("usd", "USD", SIG), Column("rate_label", "RUB per USD (date)"),
)


def session_row(index: int, session: Session, tally: Tally) -> dict[str, Any]:
    meta = session.meta
    usd = sum(usd_by_phase(meta, tally, first=index == 0).values())
    price = meta["price"]
    return {"session": index, "seconds_by_phase": dict(tally.seconds), "tokens": tally.tokens,
            "last_step": tally.last_step, "resumed_from": session.resume_step, "closed": session.closed,
            "clean": session.clean if session.closed else None,
            "accelerator": price["name"], "pricing": price["pricing"],
            "where": "/".join(p for p in (price.get("cloud", ""), price.get("region", "")) if p),
            "usd_per_chip_hour": price["usd"], "chips": meta["chips"], "chips_in_use": meta.get("chips_in_use"),
            "devices": meta.get("devices"), "hours": sum(tally.seconds.values()) / 3600, "usd": usd,
            "usd_rub_rate": meta["usd_rub_rate"], "rate_date": meta["rate_date"], "rub": usd * meta["usd_rub_rate"],
            "rate_label": f"{meta['usd_rub_rate']:.4f} ({meta['rate_date']})"}


def summarize_sessions(ledger_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What each session of a ledger on disk counts for, in order: its seconds by phase (``lost``:
    work a later session redid), the tokens and last step credited to it, the checkpoint step it
    resumed from, and whether it closed (``clean``: None when it has no close record, e.g. SIGKILL);
    and what it ran on and paid: its price row, chips priced and devices seen, its own dated rate,
    its USD and RUB (a run that moved between hardware is priced session by session)."""
    sessions = read_sessions(ledger_dir)
    return _rows(sessions, tally_on_disk(sessions))


def _rows(sessions: list[Session], tallies: list[tuple[dict[str, Any], Tally]]) -> list[dict[str, Any]]:
    return [session_row(index, session, tally) for index, (session, (_, tally)) in enumerate(zip(sessions, tallies,
                                                                                                    strict=True))]


def write_report(ledger_dir: str | os.PathLike[str]) -> Path:
    """``cost_report.md`` (each session with its hardware, price row and dated rate, then goodput and
    badput by phase in RUB, USD and share) and ``cost_sessions.csv`` beside the ledger, atomically."""
    ledger_dir = Path(ledger_dir)
    sessions = read_sessions(ledger_dir)  # read once: the report and the table describe the same records
    tallies = tally_on_disk(sessions)
    rows = _rows(sessions, tallies)
    summary = summarize(tallies, sessions[-1].meta.get("token_budget"))
    rates = sorted({row["rate_label"] for row in rows})
    text = (f"# Cost of run {summary.run_id}\n\n{summary.rub_total:,.2f} RUB = {summary.usd_total:,.2f} USD at "
            f"USD->RUB {', '.join(rates)} (each session at its own rate); {summary.tokens:,} tokens.\n\n"
            f"## Sessions\n\n{to_markdown(rows, SESSION_COLUMNS)}\n"
            f"## Goodput and badput\n\n{to_markdown(summary.badput_rows(), PHASE_COLUMNS)}")
    path = ledger_dir / REPORT_FILE
    atomic_write_text(path, text)
    atomic_write_text(ledger_dir / SESSIONS_CSV, to_csv(rows, SESSION_COLUMNS))
    return path
