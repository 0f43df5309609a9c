"""The cost report beside a ledger: ``cost_report.md`` and ``cost_sessions.csv``, rewritten at every close.

Each session with its hardware, price row and dated rate (a run that moved between hardware is
priced session by session), then goodput and badput by phase in RUB, USD and share; for a run whose folder
is priced as object storage (``cost.storage``), its storage line session by session: GB-months held,
requests, egress, their rubles, and the price rows with their sources; for a run on a mixture of shard sets
(``train.mixture``), its rubles by data set (``data_set_rows``).
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from cost.ledger_format import Session, read_sessions
from cost.ledger_pricing import STORAGE, chip_hour, cost_by_phase, summarize
from cost.ledger_sessions import Tally, tally_on_disk
from cost.report import SIG, Column, significant, to_csv, to_markdown
from cost.storage import GIB, cost_by_unit, figure_of
from cost.summary import PHASE_COLUMNS, SHARE_STEP, apportion
from experiment.files import atomic_write_text
from experiment.storage import RunPath, location

REPORT_FILE = "cost_report.md"  # rewritten at every close: sessions with their hardware, then goodput/badput
SESSIONS_CSV = "cost_sessions.csv"
SESSION_COLUMNS = (
    Column("session", "session", "{:d}"), Column("devices", "devices"), Column("accelerator", "priced as"),
    Column("pricing", "pricing"), Column("where", "cloud/region"), Column("chip_hour_price", "chip-hour as billed"),
    Column("chips", "chips priced", "{:d}"), Column("resumed_from", "resumed from step"),
    Column("tokens", "tokens", "{:,.0f}"), Column("hours", "hours", SIG), Column("rub", "rubles", SIG),
    Column("usd", "USD", SIG), Column("rate_label", "RUB per USD (date)"),
)
STORAGE_COLUMN = Column("storage_rub", "of which storage RUB", SIG)  # only in a ledger that prices storage
# only in a ledger with an interrupted session: the wait until the next session, and whether it billed
WAIT_COLUMNS = (Column("waited_hours", "waited for the next session (h)", SIG), Column("wait", "the slice meanwhile"))
STORAGE_COLUMNS = (
    Column("session", "session", "{:d}"), Column("storage", "storage class"), Column("stored_where", "run folder"),
    Column("gb_months", "GB-months", "{:.4g}"), Column("stored_gb", "GB held at the end", "{:,.3f}"),
    Column("writes", "write requests", "{:,d}"), Column("reads", "read requests", "{:,d}"),
    Column("egress_gb", "egress GB", "{:,.3f}"), Column("storage_rub", "rubles", SIG),
)
DATA_SET_COLUMNS = (
    Column("data_set", "data set"), Column("tokens", "tokens trained", "{:,.0f}"), Column("rub", "rubles", SIG),
    Column("share", "share of rubles", "{:.1%}"),
)
INHERITED = "the parent run, up to the branch step"  # a branch's inherited rubles: not split by this run's sets


def session_row(index: int, session: Session, tally: Tally) -> dict[str, Any]:
    meta = session.meta
    by_phase = cost_by_phase(meta, tally, first=index == 0)
    usd = sum(usd for usd, _ in by_phase.values())
    figure, currency = chip_hour(meta)
    price = meta["price"]
    storage = meta.get("storage")
    use = tally.storage
    stored = {"storage": storage["name"], "stored_where": storage.get("where", ""), "gb_months": use.gb_months,
              "stored_gb": None if use.last_bytes is None else use.last_bytes / GIB, "writes": use.writes,
              "reads": use.reads, "egress_gb": use.egress_bytes / GIB,
              "storage_rub": by_phase[STORAGE][1],
              "storage_rub_by_unit": {unit: v * meta["usd_rub_rate"]
                                      for unit, v in cost_by_unit(storage["rows"], use, meta["usd_rub_rate"]).items()}
              } if storage else {"storage": None, "storage_rub": None}
    wait = ("" if not tally.waited else "held: idle at this session's rate" if meta.get("wait_billed")
            else "released: not billed")
    return {**stored, "session": index, "seconds_by_phase": dict(tally.seconds), "tokens": tally.tokens,
            "waited_hours": tally.waited / 3600, "wait": wait,
            "last_step": tally.last_step, "resumed_from": session.resume_step, "closed": session.closed,
            "clean": session.clean if session.closed else None,
            "accelerator": price["name"], "pricing": price["pricing"],
            "where": "/".join(p for p in (price.get("cloud", ""), price.get("region", "")) if p),
            "usd_per_chip_hour": price["usd"], "chip_hour_price": f"{figure:g} {currency}",
            "chips": meta["chips"], "chips_in_use": meta.get("chips_in_use"),
            "devices": meta.get("devices"), "hours": sum(tally.seconds.values()) / 3600, "usd": usd,
            "usd_rub_rate": meta["usd_rub_rate"], "rate_date": meta["rate_date"],
            "rub": sum(rub for _, rub in by_phase.values()),
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


def write_report(ledger_dir: str | os.PathLike[str] | RunPath) -> RunPath:
    """``cost_report.md`` (each session with its hardware, price row and dated rate, then goodput and
    badput by phase in RUB, USD and share) and ``cost_sessions.csv`` beside the ledger, atomically."""
    ledger_dir = location(ledger_dir)
    sessions = read_sessions(ledger_dir)  # read once: the report and the table describe the same records
    tallies = tally_on_disk(sessions)
    rows = _rows(sessions, tallies)
    summary = summarize(tallies, sessions[-1].meta.get("token_budget"))
    rates = sorted({row["rate_label"] for row in rows})
    priced_storage = [(session, row) for session, row in zip(sessions, rows, strict=True) if row["storage"]]
    columns = (*SESSION_COLUMNS, STORAGE_COLUMN) if priced_storage else SESSION_COLUMNS
    if any(row["waited_hours"] for row in rows):
        columns = (*columns, *WAIT_COLUMNS)
    # significant digits, not two decimals: a short run's 0.004 USD is not "0.00 USD"
    text = (f"# Cost of run {summary.run_id}\n\n{significant(summary.rub_total)} RUB = "
            f"{significant(summary.usd_total)} USD at "
            f"USD->RUB {', '.join(rates)} (each session at its own rate); {summary.tokens:,} tokens.\n\n"
            f"## Sessions\n\n{to_markdown(rows, columns)}\n"
            f"## Goodput and badput\n\n{to_markdown(summary.badput_rows(), PHASE_COLUMNS)}")
    jumps = [(index, t, jump) for index, session in enumerate(sessions) for t, jump in session.clock_jumps]
    if jumps:
        text += "\n" + clock_section(jumps)
    if priced_storage:
        text += "\n" + storage_section(priced_storage)
    by_set = data_set_rows(rows, tallies, summary.rub_total)
    if by_set:
        text += ("\n## Rubles by data set\n\nEach session's rubles (every phase, badput included) split by the tokens "
                 "each shard set of train.mixture gave to the steps that survived in it (cost/ledger_report.py); "
                 f"they add up to the run's rubles.\n\n{to_markdown(by_set, DATA_SET_COLUMNS)}")
    path = ledger_dir / REPORT_FILE
    atomic_write_text(path, text)
    atomic_write_text(ledger_dir / SESSIONS_CSV, to_csv(rows, columns))
    return path


def data_set_rows(rows: list[dict[str, Any]], tallies: list[tuple[dict[str, Any], Tally]],
                  rub_total: float) -> list[dict[str, Any]]:
    """The run's rubles by data set (``DATA_SET_COLUMNS``; none for a run on one shard set): each session's rubles
    split by its tokens of each set (``tokens`` records' ``by_set``), a session that trained no token by the run's
    split; a branch's inherited rubles stay a row of their own, and a last row the total."""
    run_tokens: dict[str, float] = {}
    for _, tally in tallies:
        for name, tokens in tally.tokens_by_set.items():
            run_tokens[name] = run_tokens.get(name, 0.0) + tokens
    if not sum(run_tokens.values()):
        return []
    rub = dict.fromkeys(run_tokens, 0.0)
    for row, (_, tally) in zip(rows, tallies, strict=True):
        tokens = tally.tokens_by_set if sum(tally.tokens_by_set.values()) else run_tokens
        counted = sum(tokens.values())
        for name, count in tokens.items():
            rub[name] += row["rub"] * count / counted
    table = [{"data_set": name, "tokens": run_tokens[name], "rub": rub[name]} for name in run_tokens]
    inherited = rub_total - sum(rub.values())
    if abs(inherited) > 1e-9 * max(abs(rub_total), 1.0):  # a branch: its parent's rubles up to the branch step
        table.append({"data_set": INHERITED, "tokens": None, "rub": inherited})
    if rub_total:  # the shares as printed (0.1%) add up to 100.0%
        for entry, share in zip(table, apportion([t["rub"] / rub_total for t in table], SHARE_STEP), strict=True):
            entry["share"] = share
    table.append({"data_set": "total", "tokens": sum(run_tokens.values()), "rub": rub_total,
                  "share": 1.0 if rub_total else None})
    return table


def clock_section(jumps: list[tuple[int, float, float]]) -> str:
    """The wall-clock jumps the sessions saw: not billed (a session's durations follow the monotonic clock)."""
    lines = "".join(f"- session {index}: {jump:+,.0f} s around "
                    f"{dt.datetime.fromtimestamp(t, dt.UTC):%Y-%m-%d %H:%M:%S} UTC\n" for index, t, jump in jumps)
    return ("## Wall-clock jumps\n\nThe host's wall clock moved against elapsed time; the ledger measures a session's "
            "time with the monotonic clock, so these seconds are in no phase and cost nothing "
            f"(cost/ledger_clock.py).\n\n{lines}")


def storage_section(priced: list[tuple[Session, dict[str, Any]]]) -> str:
    """The report's storage line, session by session, and the price rows it was priced at with their sources."""
    text = ("## Storage\n\nThe run folder priced as object storage (cost.storage): GB-months held over each "
            "session's wall time (measured at its start and at every durable checkpoint), requests and egress "
            "counted, at the storage class's rows; the time between sessions is not in the ledger "
            "(cost/storage.py).\n\n"
            f"{to_markdown([row for _, row in priced], STORAGE_COLUMNS)}\n")
    seen = set()
    for session, _ in priced:
        storage = session.meta["storage"]
        for unit, row in storage["rows"].items():
            key = (storage["name"], unit, row.get("source"), row.get("date"))
            if key in seen:
                continue
            seen.add(key)
            figure, currency = figure_of(row)
            text += (f"- {storage['name']} {unit}: {figure:g} {currency} ({row.get('source_kind', '')}; "
                     f"{row.get('source', '')}; {row.get('date', '')})\n")
    return text
