"""A crash-proof money ledger for one training run: wall-clock time by phase, priced in rubles.

The ledger is an append-only JSONL file (``ledger/ledger.jsonl``). Each process that opens it is a
*session*; it appends an ``open`` record (price row, chips, dated USD->RUB rate), then ``time``
records that cover every second until ``close``. Phase changes and tokens are only counted in
memory (a training step costs no I/O); every ``cost.flush_seconds`` a background thread appends
one ``time`` record (the interval and its seconds by phase) and one ``tokens`` record (the steps
and tokens since the last one, with when they finished), flushes and fsyncs; so does a checkpoint
mark and the start of every checkpoint save (``checkpoint_record``). After a SIGKILL the file holds
all but the last few seconds of the session, always every step up to any checkpoint the next
session can restore, and a half-written last line is dropped on reopen.

Pricing: rubles = wall-clock hours x chips x USD per chip-hour (+ infrastructure rows) x the
session's USD->RUB rate. Every second is paid once. When a session trained steps past the step the
next session resumed from (``mark_resume``), or, without a later session, past its last durable
checkpoint and ended without a clean close, its train/eval/idle time after it finished that step
bought nothing that survived: that time moves to the phase ``lost`` (``rub_lost_to_restarts``),
and the tokens of those steps are not counted, since the next session trains them again and pays
for them a second time.

Reconciliation on resume: the checkpoint's ledger item (``checkpoint_record``) names the session
that saved it, when, and the tokens counted up to its step. A resume from it cuts that session's
work exactly at that moment, and credits any steps up to the checkpoint that the file missed (a
checkpoint saved before the save flushed the ledger), so every step up to the restored checkpoint
is counted exactly once whatever the crash pattern.

Decay branches: a run started from another run's checkpoint (``trainer/branch.py``) stands on the
parent's work up to that step. Its first session writes an ``inherit`` record with the parent's
totals when it saved that checkpoint (``summarize_ledger_at``); the branch's totals add them
(rubles, dollars, hours and tokens, phase by phase), so a branch costs what it took to reach it
plus its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cost.catalog import Catalog, PriceRow
from cost.rates import UsdRubRate, resolve_usd_rub
from cost.report import SIG, Column, to_csv, to_markdown
from cost.summary import LOST, PHASE_COLUMNS, CostSummary, price_dict
from experiment.errors import DataError
from experiment.files import atomic_write_text
from experiment.jsonl import read_jsonl
from experiment.stages import PRETRAIN

log = logging.getLogger("cost.ledger")

LEDGER_FILE = "ledger.jsonl"
REPORT_FILE = "cost_report.md"  # rewritten at every close: sessions with their hardware, then goodput/badput
SESSIONS_CSV = "cost_sessions.csv"
SESSION_COLUMNS = (
    Column("session", "session", "{:d}"), Column("devices", "devices"), Column("accelerator", "priced as"),
    Column("pricing", "pricing"), Column("where", "cloud/region"), Column("usd_per_chip_hour", "USD / chip-hour"),
    Column("chips", "chips priced", "{:d}"), Column("resumed_from", "resumed from step"),
    Column("tokens", "tokens", "{:,.0f}"), Column("hours", "hours", SIG), Column("rub", "rubles", SIG),
    Column("usd", "USD", SIG), Column("rate_label", "RUB per USD (date)"),
)
PHASES = ("startup", "compile", "train", "data", "eval", "checkpoint", "idle")  # "data": waiting for a batch
# Phases whose time after the last surviving step is redone after a crash. Start-up and compilation
# are paid again by every session anyway and stay visible under their own names; checkpoint time
# after that step is mostly the save of that very step (which the next session resumed from).
REDONE_PHASES = frozenset({"train", "data", "eval", "idle"})
HOURS_PER_MONTH = 730.0  # the cloud billing convention for GB-month prices


@dataclass
class _Tally:
    """Seconds by phase and tokens of one session (after moving lost work out of its phases)."""

    seconds: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    last_step: int | None = None

    def add(self, phase: str, seconds: float) -> None:
        if seconds > 0:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds


@dataclass
class _Interval:
    t0: float
    t1: float
    seconds: dict[str, float]  # by phase; they add up to t1 - t0


@dataclass
class _TokenBatch:
    first_step: int
    step: int  # the last step the tokens belong to
    tokens: int
    t_start: float  # when the step before ``first_step`` had finished (or the session began)
    t: float  # when ``step`` finished

    def tokens_up_to(self, step: int) -> int:
        """The tokens of steps <= ``step`` (spread evenly over the batch's steps)."""
        return round(self.tokens * self.share_up_to(step))

    def share_up_to(self, step: int) -> float:
        if step >= self.step:
            return 1.0
        if step < self.first_step:
            return 0.0
        return (step - self.first_step + 1) / (self.step - self.first_step + 1)

    def finished_at(self, step: int) -> float:
        """When ``step`` (within or after this batch) finished, interpolating between the batch's ends."""
        return self.t_start + (self.t - self.t_start) * self.share_up_to(step)


@dataclass
class _Resume:
    """A session's restore: the checkpoint step and, from the checkpoint's ledger item, who saved it."""

    step: int
    saved_by: int | None = None  # the session that saved the checkpoint
    saved_at: float | None = None  # when that session started saving it (all work before it survived)
    tokens: int | None = None  # every token counted up to the checkpoint's step, all sessions together

    def record(self, t: float) -> dict[str, Any]:
        saved = {"saved_by": self.saved_by, "saved_at": self.saved_at, "tokens": self.tokens}
        return {"e": "resume", "step": self.step, "t": t, **{k: v for k, v in saved.items() if v is not None}}

    @classmethod
    def from_checkpoint(cls, step: int, item: Any, session: int) -> _Resume:
        """What a checkpoint's ledger item says (the current form, or the plain summary saved before
        there was one); an item that does not fit is ignored with a warning (the file alone is used)."""
        if not item:
            return cls(step)
        try:
            saved_by = int(item["session"]) if "session" in item else int(item["sessions"]) - 1
            saved_step = int(item["step"]) if "step" in item else int(item["last_step"])
            saved_at = float(item["t"]) if "t" in item else None
            tokens = int(item["tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("the ledger item of checkpoint %d is unreadable (%r): counting from the ledger file alone",
                        step, exc)
            return cls(step)
        if saved_step != step or not 0 <= saved_by < session or tokens < 0:
            log.warning("the ledger item of checkpoint %d is for step %s of session %s: counting from the ledger "
                        "file alone", step, saved_step, saved_by)
            return cls(step)
        return cls(step, saved_by, saved_at, tokens)


@dataclass
class _Session:
    meta: dict[str, Any]
    intervals: list[_Interval] = field(default_factory=list)
    tokens: list[_TokenBatch] = field(default_factory=list)
    checkpoints: list[tuple[int, float]] = field(default_factory=list)  # (step, time)
    resume: _Resume | None = None
    clean: bool = False  # a close record saying nothing of this session's work was lost
    closed: bool = False  # a close record, clean or not (none after SIGKILL)

    @property
    def resume_step(self) -> int | None:
        return None if self.resume is None else self.resume.step

    def last_time(self) -> float:
        times = [self.meta["t"], *(i.t1 for i in self.intervals), *(b.t for b in self.tokens),
                 *(t for _, t in self.checkpoints)]
        return max(times)

    def moment_of(self, step: int) -> float:
        """When this session finished training ``step`` (-inf when all of its steps came after it).

        Taken from the token records, not the checkpoint marks: with asynchronous saves a checkpoint
        is only confirmed (and marked) after later steps have run.
        """
        times = [b.finished_at(step) for b in self.tokens if b.first_step <= step]
        return max(times, default=-math.inf)

    def tally(self, survived_step: int | None, saved_at: float | None = None) -> _Tally:
        """Phases and tokens of a finished session; work past ``survived_step`` becomes ``lost``.

        ``saved_at``: when this session started saving the checkpoint of ``survived_step`` (its work
        before that survived); without it, when the token records say that step finished.
        """
        tally = _Tally()
        trained_to = max((b.step for b in self.tokens), default=None)
        if survived_step is None or (trained_to is not None and trained_to <= survived_step):
            cutoff = math.inf  # no step past the surviving one: nothing was redone
        elif saved_at is not None:
            cutoff = saved_at
        else:
            cutoff = self.moment_of(survived_step)
        for interval in self.intervals:
            length = interval.t1 - interval.t0
            kept = 1.0 if interval.t1 <= cutoff else 0.0 if interval.t0 >= cutoff else (cutoff - interval.t0) / length
            for phase, seconds in interval.seconds.items():
                if phase in REDONE_PHASES:
                    tally.add(phase, seconds * kept)
                    tally.add(LOST, seconds * (1.0 - kept))
                else:
                    tally.add(phase, seconds)
        limit = math.inf if survived_step is None else survived_step
        tally.tokens = sum(b.tokens if survived_step is None else b.tokens_up_to(survived_step) for b in self.tokens)
        tally.last_step = max((min(b.step, limit) for b in self.tokens if b.first_step <= limit), default=None)
        return tally


def _tally_finished(sessions: list[_Session], resume_after: _Resume | None) -> list[tuple[dict[str, Any], _Tally]]:
    """Tallies of finished sessions. A later session that resumed from step S (the smallest such S
    after a session) means that session's work past S was redone; without one, a session that did
    not close cleanly kept only the work up to its last marked checkpoint."""
    tallies: list[_Tally] = [_Tally() for _ in sessions]
    judged_by: list[_Resume | None] = [None] * len(sessions)
    later = resume_after
    for index in reversed(range(len(sessions))):
        session = sessions[index]
        if later is not None:
            survived: int | None = later.step
        elif session.clean:
            survived = None
        else:
            survived = max((s for s, _ in session.checkpoints), default=-1)
        saved_at = later.saved_at if later is not None and later.saved_by == index else None
        tallies[index] = session.tally(survived, saved_at)
        judged_by[index] = later
        if session.resume is not None and (later is None or session.resume.step < later.step):
            later = session.resume
    for index, resume in enumerate(judged_by):
        if resume is not None and resume.saved_by == index and resume.tokens is not None:
            # steps up to the checkpoint that the file missed (the save did not flush the ledger first)
            missing = resume.tokens - sum(t.tokens for t in tallies[:index + 1])
            if missing > 0:
                tallies[index].tokens += missing
                tallies[index].last_step = resume.step
    return [(session.meta, tally) for session, tally in zip(sessions, tallies, strict=True)]


def _hourly_usd(meta: dict[str, Any]) -> float:
    """USD per wall-clock hour of a session: chips x chip-hour price + hourly infrastructure."""
    usd = meta["chips"] * meta["price"]["usd"]
    for item in meta.get("infra", []):
        if item["unit"] == "hour":
            usd += item["quantity"] * item["usd"]
        elif item["unit"] == "gb-month":
            usd += item["quantity"] * item["usd"] / HOURS_PER_MONTH
    return usd


def _one_off_usd(meta: dict[str, Any]) -> float:
    return sum(item["quantity"] * item["usd"] for item in meta.get("infra", []) if item["unit"] == "gb")


def _usd_by_phase(meta: dict[str, Any], tally: _Tally, first: bool) -> dict[str, float]:
    """A session's dollars by phase at its own price row (and, for the first session, per-GB charges)."""
    hourly = _hourly_usd(meta)
    usd = {phase: secs / 3600 * hourly for phase, secs in tally.seconds.items()}
    if first and _one_off_usd(meta):
        usd["one_off"] = _one_off_usd(meta)
    return usd


def _device_description() -> str | None:
    """The JAX devices this process sees (``8 x tpu``), when the process uses JAX at all: a resumed
    run may continue on another slice, and the cost report lists each session's hardware."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        return f"{jax.device_count()} x {jax.devices()[0].platform}"
    except RuntimeError:  # no backend could start
        return None


def _read_records(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """All complete records, and whether the file ends with a torn line (a crash mid-write; dropped
    with a warning, and cut off the file by the next session)."""
    contents = read_jsonl(path, torn_tail="warn")
    for line in contents.records:
        if not isinstance(line.value, dict) or "e" not in line.value:
            raise DataError(f"{path} line {line.line}: not a ledger record (no 'e' field)")
    return contents.values, contents.torn_tail is not None


def _end_on_a_newline(path: Path, torn: bool) -> None:
    """Make the next record start on a fresh line: cut a torn last line off, or end a complete last
    record that a kill left without its newline."""
    with path.open("r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if torn:
            handle.seek(0)
            handle.truncate(handle.read().rfind(b"\n") + 1)
        elif size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                handle.write(b"\n")


def _sessions(records: list[dict[str, Any]], path: Path) -> list[_Session]:
    sessions: list[_Session] = []
    for number, record in enumerate(records, start=1):
        try:
            _apply(record, sessions)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise DataError(f"{path} record {number}: malformed '{record.get('e')}' record ({exc})") from exc
    return sessions


def _apply(record: dict[str, Any], sessions: list[_Session]) -> None:
    """Add one ledger record to the sessions read so far (ValueError for anything malformed)."""
    kind = record["e"]
    if kind == "open":
        sessions.append(_Session(meta=record))
        return
    if not sessions:
        raise ValueError(f"'{kind}' before any 'open' record")
    session = sessions[-1]
    if kind == "time":
        session.intervals.append(_Interval(float(record["t0"]), float(record["t1"]),
                                           {k: float(v) for k, v in record["seconds"].items()}))
    elif kind == "tokens":
        session.tokens.append(_TokenBatch(int(record["first_step"]), int(record["step"]), int(record["tokens"]),
                                          float(record["t_start"]), float(record["t"])))
    elif kind == "ckpt":
        session.checkpoints.append((int(record["step"]), float(record["t"])))
    elif kind == "resume":
        saved_by, saved_at, tokens = record.get("saved_by"), record.get("saved_at"), record.get("tokens")
        session.resume = _Resume(int(record["step"]), None if saved_by is None else int(saved_by),
                                 None if saved_at is None else float(saved_at), None if tokens is None else int(tokens))
    elif kind == "inherit":
        session.meta["inherited"] = record  # the latest one counts: a branch that started over from its parent
    elif kind == "close":
        session.closed = True
        session.clean = bool(record.get("clean", True))
    else:
        raise ValueError(f"unknown record kind {kind!r}")


def _summarize(sessions: list[tuple[dict[str, Any], _Tally]], token_budget: int | None) -> CostSummary:
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
        for phase, usd in _usd_by_phase(meta, tally, first=index == 0).items():
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


def _read_sessions(ledger_dir: str | os.PathLike[str], checkpoint_item: dict[str, Any] | None = None,
                   ) -> tuple[list[_Session], list[tuple[dict[str, Any], _Tally]]]:
    """The sessions of a ledger on disk and their tallies (the last one taken as it is: a crash in
    it is only known once a later session resumes); with ``checkpoint_item``, only the records up to
    the session and moment of that checkpoint's ledger item (``checkpoint_record``)."""
    path = Path(ledger_dir) / LEDGER_FILE
    if not path.is_file():
        raise DataError(f"no ledger at {path}: {PRETRAIN.run_first}")
    records, _ = _read_records(path)
    if checkpoint_item is not None:
        records = _records_until(records, checkpoint_item, path)
    sessions = _sessions(records, path)
    if not sessions:
        raise DataError(f"{path} holds no ledger records")
    return sessions, [*_tally_finished(sessions[:-1], sessions[-1].resume), (sessions[-1].meta, sessions[-1].tally(None))]


def _record_time(record: dict[str, Any]) -> float:
    """When a record was written (a time record: the end of its interval; -inf for one without a time)."""
    return float(record.get("t1", record.get("t", -math.inf)))


def _records_until(records: list[dict[str, Any]], checkpoint_item: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    try:
        session, moment = int(checkpoint_item["session"]), float(checkpoint_item["t"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: the checkpoint's ledger item {checkpoint_item!r} does not say when it was saved "
                        f"({exc!r})") from exc
    kept: list[dict[str, Any]] = []
    opened = -1
    for record in records:
        opened += record["e"] == "open"
        if opened > session or (opened == session and _record_time(record) > moment):
            break
        kept.append(record)
    return kept


def summarize_ledger_at(ledger_dir: str | os.PathLike[str], checkpoint_item: dict[str, Any]) -> CostSummary:
    """What a run had cost when it started saving a checkpoint: its ledger cut at the session and
    moment of that checkpoint's ledger item (``checkpoint_record``, which flushed the ledger first),
    for a decay branch that starts from the checkpoint."""
    sessions, tallies = _read_sessions(ledger_dir, checkpoint_item)
    return _summarize(tallies, sessions[-1].meta.get("token_budget"))


def summarize_ledger(ledger_dir: str | os.PathLike[str]) -> CostSummary:
    """The summary of a ledger on disk (e.g. a finished or crashed run), without opening a session."""
    sessions, tallies = _read_sessions(ledger_dir)
    return _summarize(tallies, sessions[-1].meta.get("token_budget"))


def summarize_sessions(ledger_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What each session of a ledger on disk counts for, in order: its seconds by phase (``lost``:
    work a later session redid), the tokens and last step credited to it, the checkpoint step it
    resumed from, and whether it closed (``clean``: None when it has no close record, e.g. SIGKILL);
    and what it ran on and paid: its price row, chips priced and devices seen, its own dated rate,
    its USD and RUB (a run that moved between hardware is priced session by session)."""
    sessions, tallies = _read_sessions(ledger_dir)
    return [session_row(index, session, tally) for index, (session, (_, tally)) in enumerate(zip(sessions, tallies,
                                                                                                    strict=True))]


def session_row(index: int, session: _Session, tally: _Tally) -> dict[str, Any]:
    meta = session.meta
    usd = sum(_usd_by_phase(meta, tally, first=index == 0).values())
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


def write_report(ledger_dir: str | os.PathLike[str]) -> Path:
    """``cost_report.md`` (each session with its hardware, price row and dated rate, then goodput and
    badput by phase in RUB, USD and share) and ``cost_sessions.csv`` beside the ledger, atomically."""
    ledger_dir = Path(ledger_dir)
    sessions = summarize_sessions(ledger_dir)
    summary = summarize_ledger(ledger_dir)
    rates = sorted({row["rate_label"] for row in sessions})
    text = (f"# Cost of run {summary.run_id}\n\n{summary.rub_total:,.2f} RUB = {summary.usd_total:,.2f} USD at "
            f"USD->RUB {', '.join(rates)} (each session at its own rate); {summary.tokens:,} tokens.\n\n"
            f"## Sessions\n\n{to_markdown(sessions, SESSION_COLUMNS)}\n"
            f"## Goodput and badput\n\n{to_markdown(summary.badput_rows(), PHASE_COLUMNS)}")
    path = ledger_dir / REPORT_FILE
    atomic_write_text(path, text)
    atomic_write_text(ledger_dir / SESSIONS_CSV, to_csv(sessions, SESSION_COLUMNS))
    return path


def _process_start_time() -> float | None:
    try:
        import psutil  # installed with orbax-checkpoint
    except ImportError:
        return None
    return psutil.Process().create_time()


class Ledger:
    """The live ledger of this process's session; see the module docstring for the accounting."""

    def __init__(self, path: Path, meta: dict[str, Any], past: list[_Session], clock: Callable[[], float],
                 flush_seconds: float, background: bool) -> None:
        self.path = path
        self.meta = meta
        self._past = past
        self._clock = clock
        self._flush_seconds = flush_seconds
        self._lock = threading.RLock()
        self._handle = path.open("a", encoding="utf-8")
        self._current = _Tally()  # everything this session counted so far, written or not
        self._resume: _Resume | None = None
        self._durable_step: int | None = None  # the latest step known to survive (marked checkpoint or resume)
        self._past_tallies = self._tally_past()
        self._stack: list[str] = []
        self._outer = "startup"  # the phase between explicit phases: start-up until the first one, then idle
        self._phase_start = meta["t"]  # when the phase in progress began (or was last counted)
        self._pending = _Interval(meta["t"], meta["t"], {})  # counted since the last time record
        self._pending_tokens: _TokenBatch | None = None
        self._last_step_done = meta["opened"]  # when the latest step finished (or this session opened)
        self._last_sync = clock()
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._heartbeat, name="cost-ledger", daemon=True)
            self._thread.start()

    # ----------------------------------------------------------------------------------- opening
    @classmethod
    def open(cls, ledger_dir: str | os.PathLike[str], cost_cfg: Any, run_id: str, *,
             catalog: Catalog | None = None, rate: UsdRubRate | None = None,
             clock: Callable[[], float] = time.time, started_at: float | None = None,
             background: bool = True, chips_in_use: int | None = None) -> Ledger:
        """Open (or continue) ``ledger_dir/ledger.jsonl`` and start a session priced by ``cost_cfg``.

        ``chips_in_use``: the chips training this session (``cost.chips.reconcile_chips``), recorded
        beside the priced ``cost.chips``.

        ``started_at`` (default: this process's start time) prices the start-up before this call;
        ``clock`` and ``background=False`` exist for tests with a fake clock.
        """
        ledger_dir = Path(ledger_dir)
        ledger_dir.mkdir(parents=True, exist_ok=True)
        path = ledger_dir / LEDGER_FILE
        catalog = catalog or Catalog.from_config(cost_cfg)
        price = catalog.lookup(cost_cfg.accelerator, cost_cfg.pricing, cost_cfg.cloud, cost_cfg.region)
        infra = [cls._infra_row(catalog, item, i) for i, item in enumerate(cost_cfg.infrastructure)]
        rate = rate or resolve_usd_rub(cost_cfg)
        past: list[_Session] = []
        if path.is_file():
            records, torn = _read_records(path)
            _end_on_a_newline(path, torn)
            past = _sessions(records, path)
        now = clock()
        started = _process_start_time() if started_at is None else started_at
        if started is not None and past:  # never price a second twice (process start times are coarse)
            started = max(started, past[-1].last_time())
        begin = min(started, now) if started is not None else now
        meta = {
            "e": "open", "session": len(past), "run_id": run_id, "t": begin, "opened": now, "pid": os.getpid(),
            "chips": cost_cfg.chips, "chips_in_use": chips_in_use, "devices": _device_description(),
            "price": price_dict(price), "infra": infra,
            **rate.as_dict(), "token_budget": cost_cfg.token_budget,
        }
        ledger = cls(path, meta, past, clock, cost_cfg.flush_seconds, background)
        with ledger._lock:
            ledger._write(meta)
            ledger._flush()  # the start-up before this call, as the first time record
        action = f"continuing a ledger with {len(past)} earlier session(s)" if past else "new ledger"
        log.info("cost ledger %s (%s): %d x %s at %.4g USD/chip-hour, USD->RUB %.4f of %s",
                 path, action, cost_cfg.chips, price.describe(), price.usd, rate.rate, rate.date)
        return ledger

    @staticmethod
    def _infra_row(catalog: Catalog, item: Any, index: int) -> dict[str, Any]:
        key = f"cost.infrastructure[{index}].name"
        row = catalog.lookup(item.name, "on-demand", item.cloud, item.region, kind="infra", key=key)
        return {**price_dict(row), "quantity": item.quantity}

    def _tally_past(self) -> list[tuple[dict[str, Any], _Tally]]:
        return _tally_finished(self._past, self._resume)

    # ----------------------------------------------------------------------------------- counting
    def _phase_now(self) -> str:
        return self._stack[-1] if self._stack else self._outer

    def _count_time(self) -> float:
        """Count the phase in progress up to now (in memory) and return now."""
        now = max(self._clock(), self._phase_start)  # a wall clock stepping back never makes negative time
        seconds = now - self._phase_start
        if seconds > 0:
            phase = self._phase_now()
            self._pending.seconds[phase] = self._pending.seconds.get(phase, 0.0) + seconds
            self._current.add(phase, seconds)
        self._phase_start = now
        return now

    def _write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    def _flush(self) -> float:
        """Write what was counted since the last flush (one time record, one tokens record) and fsync."""
        now = self._count_time()
        if now > self._pending.t0:
            self._write({"e": "time", "t0": self._pending.t0, "t1": now, "seconds": self._pending.seconds})
        self._pending = _Interval(now, now, {})
        if self._pending_tokens is not None:
            batch = self._pending_tokens
            self._write({"e": "tokens", "first_step": batch.first_step, "step": batch.step, "tokens": batch.tokens,
                         "t_start": batch.t_start, "t": batch.t})
            self._pending_tokens = None
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._last_sync = now
        return now

    def _heartbeat(self) -> None:
        while not self._stop.wait(self._flush_seconds):
            with self._lock:
                if self._closed:
                    return
                self._flush()

    def _maybe_flush(self) -> None:
        """Without the background thread (tests, fake clocks), flush when a call finds the time is due."""
        if self._thread is None and self._clock() - self._last_sync >= self._flush_seconds:
            self._flush()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"ledger {self.path} is closed")

    # ----------------------------------------------------------------------------------- recording
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time spent inside is booked to ``name``; phases nest (eval inside train books eval)."""
        if name not in PHASES:
            raise ValueError(f"unknown ledger phase {name!r}; use one of {PHASES}")
        with self._lock:
            self._check_open()
            self._count_time()
            self._stack.append(name)
        try:
            yield
        finally:
            with self._lock:
                if not self._closed:
                    self._count_time()
                self._stack.pop()
                self._outer = "idle"
                if not self._closed:
                    self._maybe_flush()

    def add_tokens(self, step: int, tokens: int) -> None:
        """Tokens trained by the steps after the previous call up to ``step`` (call per step or per log)."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        with self._lock:
            self._check_open()
            now = self._clock()
            batch = self._pending_tokens
            if batch is None:
                first = (self._current.last_step + 1) if self._current.last_step is not None else int(step)
                self._pending_tokens = _TokenBatch(min(first, int(step)), int(step), int(tokens),
                                                   self._last_step_done, now)
            else:
                batch.step, batch.tokens, batch.t = int(step), batch.tokens + int(tokens), now
            self._current.tokens += int(tokens)
            self._current.last_step = int(step)
            self._last_step_done = now
            self._maybe_flush()

    def checkpoint_record(self, step: int) -> dict[str, Any]:
        """The ledger item to save in the checkpoint of ``step``, taken when its save starts.

        Flushes first, so the file holds every step up to ``step`` before the checkpoint can exist
        (a crash within ``flush_seconds`` after a save never loses them); the session, moment and
        token count let a resume from this checkpoint reconcile the file (``mark_resume``). That is
        all a resume reads: the costs themselves are in the file, so the item carries no summary
        (checkpoints saved with one beside these keys restore as before).
        """
        with self._lock:
            self._check_open()
            now = self._flush()
            tokens = sum(tally.tokens for _, tally in self._past_tallies) + self._current.tokens
            return {"step": int(step), "session": self.meta["session"], "t": now, "tokens": tokens}

    def mark_checkpoint(self, step: int) -> None:
        """Call once the checkpoint of ``step`` is durable: work up to here survives a crash."""
        with self._lock:
            self._check_open()
            now = self._flush()
            self._write({"e": "ckpt", "step": int(step), "t": now})
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._durable_step = int(step) if self._durable_step is None else max(self._durable_step, int(step))

    def mark_resume(self, step: int, checkpoint_item: dict[str, Any] | None = None) -> None:
        """Say which checkpoint step this session restored (the earlier sessions' later work was
        lost), with that checkpoint's ledger item (``checkpoint_record``) to count its steps exactly."""
        with self._lock:
            self._check_open()
            self._resume = _Resume.from_checkpoint(int(step), checkpoint_item, self.meta["session"])
            self._write(self._resume.record(self._clock()))
            self._durable_step = int(step)
            self._current.last_step = int(step)  # the next add_tokens starts at step + 1
            self._last_step_done = self._clock()
            self._past_tallies = self._tally_past()
            self._flush()

    def inherit(self, parent: CostSummary, folder: str, step: int) -> None:
        """This run is a branch of the run in ``folder`` at checkpoint ``step``: count ``parent``, that
        run's totals when it saved the checkpoint (``summarize_ledger_at``), as this run's start."""
        with self._lock:
            self._check_open()
            record = {"e": "inherit", "parent": folder, "run_id": parent.run_id, "step": int(step),
                      "usd_total": parent.usd_total, "rub_total": parent.rub_total, "chip_hours": parent.chip_hours,
                      "tokens": parent.tokens, "seconds_by_phase": dict(parent.seconds_by_phase),
                      "rub_by_phase": dict(parent.rub_by_phase)}
            self._write(record)
            self.meta["inherited"] = record
            self._flush()

    # ----------------------------------------------------------------------------------- reading
    def summary(self) -> CostSummary:
        """Totals so far, including the phase in progress."""
        with self._lock:
            current = _Tally(dict(self._current.seconds), self._current.tokens, self._current.last_step)
            if not self._closed:
                current.add(self._phase_now(), self._clock() - self._phase_start)
            return _summarize([*self._past_tallies, (self.meta, current)], self.meta.get("token_budget"))

    @property
    def price_row(self) -> dict[str, Any]:
        return dict(self.meta["price"])

    # ----------------------------------------------------------------------------------- closing
    def close(self, clean: bool = True) -> None:
        """End the session; ``clean=False`` (an exception) makes its unsaved work count as lost on resume.

        A session whose every step is in a durable checkpoint (a SIGTERM save, a crash right after a
        save) lost nothing: its close is clean whatever ended it.
        """
        with self._lock:
            if self._closed:
                return
            last = self._current.last_step
            clean = clean or last is None or (self._durable_step is not None and last <= self._durable_step)
            now = self._flush()
            self._write({"e": "close", "clean": clean, "t": now})
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._closed = True
            self._handle.close()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:  # a report that cannot be written never keeps a run from ending: the ledger itself is on disk
            write_report(self.path.parent)
        except (OSError, DataError, KeyError, ValueError) as exc:
            log.warning("could not write the cost report beside %s: %s", self.path, exc)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(clean=exc_type is None)

