"""The cost ledger's file format: ``ledger/ledger.jsonl``, its records, reading them back and appending them.

The ledger is an append-only JSONL file, one record a line, each with its kind under ``e``:

- ``open``: a session starts (a process opened the ledger): its number, run id, start ``t`` and the
  moment it ``opened``, pid, chips priced and in use, the devices seen, its price row and
  infrastructure rows, its dated USD->RUB rate, the token budget;
- ``time``: an interval ``t0``..``t1`` and its ``seconds`` by phase (they add up to ``t1 - t0``);
- ``tokens``: the steps ``first_step``..``step`` trained since the last one, their ``tokens``, and
  when the step before the first (``t_start``) and the last step (``t``) finished; for a run on a mixture of
  shard sets (``train.mixture``), ``by_set``: those tokens by set name;
- ``ckpt``: the checkpoint of ``step`` is durable at ``t``;
- ``resume``: this session restored the checkpoint of ``step``, with what that checkpoint's ledger
  item says (``saved_by`` session, ``saved_at`` moment, ``tokens`` up to the step);
- ``inherit``: a decay branch starts from its parent's totals at ``step``;
- ``stored``: from ``t`` on the run folder holds ``bytes`` (in ``objects`` objects when measured), for a session
  whose open record prices object storage (``storage``; ``cost.storage``);
- ``requests``: the ``writes``, ``reads`` and ``egress_bytes`` counted against the bucket up to ``t`` since the
  last such record;
- ``hang``: ``what`` (a step, a checkpoint save) had run since ``t0`` when the trainer's watchdog gave up on it
  at ``t`` and ended the process (trainer/watchdog.py); that span is booked as the phase ``hang``;
- ``clock``: around ``t`` the wall clock jumped by ``jump_s`` seconds against elapsed time (``cost.ledger_clock``:
  the session's times follow the monotonic clock, so the jump is in no interval);
- ``close``: the session ended at ``t``; ``clean`` says whether its unsaved work survived; ``ended_by`` (when an
  exception or an exit code ended it, e.g. ``exit 143`` after a preemption) what did.

A kill mid-write leaves a torn last line: readers drop it with a warning (``experiment.jsonl``), and
the next session cuts it off before appending (``end_on_a_newline``). What the records *mean* for
the cost is ``cost.ledger_sessions`` (reconciliation) and ``cost.ledger_pricing``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from experiment import appendlog
from experiment.errors import DataError
from experiment.jsonl import read_jsonl
from experiment.stages import PRETRAIN
from experiment.storage import BucketPath, RunPath, location

LEDGER_FILE = "ledger.jsonl"
PHASES = ("startup", "compile", "train", "data", "eval", "checkpoint", "idle")  # "data": waiting for a batch


@dataclass
class Interval:
    t0: float
    t1: float
    seconds: dict[str, float]  # by phase; they add up to t1 - t0


@dataclass
class TokenBatch:
    first_step: int
    step: int  # the last step the tokens belong to
    tokens: int
    t_start: float  # when the step before ``first_step`` had finished (or the session began)
    t: float  # when ``step`` finished
    by_set: dict[str, int] | None = None  # the tokens by shard set of a mixture (train.mixture), None without one

    def by_set_up_to(self, step: int) -> dict[str, float]:
        """Each set's tokens of steps <= ``step`` (spread evenly over the batch's steps, as ``tokens_up_to``)."""
        share = self.share_up_to(step)
        return {name: tokens * share for name, tokens in (self.by_set or {}).items()}

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

    def record(self) -> dict[str, Any]:
        record = {"e": "tokens", "first_step": self.first_step, "step": self.step, "tokens": self.tokens,
                  "t_start": self.t_start, "t": self.t}
        return {**record, "by_set": self.by_set} if self.by_set else record


@dataclass
class Resume:
    """A session's restore: the checkpoint step and, from the checkpoint's ledger item, who saved it."""

    step: int
    saved_by: int | None = None  # the session that saved the checkpoint
    saved_at: float | None = None  # when that session started saving it (all work before it survived)
    tokens: int | None = None  # every token counted up to the checkpoint's step, all sessions together

    def record(self, t: float) -> dict[str, Any]:
        saved = {"saved_by": self.saved_by, "saved_at": self.saved_at, "tokens": self.tokens}
        return {"e": "resume", "step": self.step, "t": t, **{k: v for k, v in saved.items() if v is not None}}


# the close records of exits a relauncher restarts: the trainer's after a preemption's checkpoint
# (trainer.preemption.PREEMPTED_EXIT_CODE) and the hang watchdog's (trainer.watchdog.HUNG_EXIT_CODE, whose
# os._exit usually leaves no close record at all); tests/test_ledger_wait.py checks they are the trainer's.
# Integers: a close record's "exit 143" is compared as the number it names (``exit_status``), so neither a
# spelling of the same code ("exit  143") slips out nor another code that reads alike as text slips in
RELAUNCHED_EXITS = (143, 124)
EXIT_PREFIX = "exit"  # a close record's ``ended_by`` for an exit code: "exit <status>" (cost.ledger.what_ended)


def exit_status(ended_by: object) -> int | None:
    """The exit status a close record's ``ended_by`` names ("exit 143", or the bare number a writer stored), or
    None: an exception's name, or text naming no integer."""
    if isinstance(ended_by, int) and not isinstance(ended_by, bool):
        return ended_by
    if not isinstance(ended_by, str):
        return None
    words = ended_by.split()
    if len(words) != 2 or words[0] != EXIT_PREFIX:
        return None
    try:
        return int(words[1])
    except ValueError:
        return None


@dataclass
class Session:
    """One session's records, as read back."""

    meta: dict[str, Any]  # its open record (plus ``inherited``: the latest inherit record)
    intervals: list[Interval] = field(default_factory=list)
    tokens: list[TokenBatch] = field(default_factory=list)
    checkpoints: list[tuple[int, float]] = field(default_factory=list)  # (step, time)
    resume: Resume | None = None
    clean: bool = False  # a close record saying nothing of this session's work was lost
    closed: bool = False  # a close record, clean or not (none after SIGKILL)
    ended_by: str | None = None  # the close record's exit code or exception (e.g. "exit 143" after a preemption)
    stored: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes the run folder holds from then on)
    requests: list[tuple[float, int, int, int]] = field(default_factory=list)  # (time, writes, reads, egress bytes)
    hangs: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of what the watchdog found hung
    clock_jumps: list[tuple[float, float]] = field(default_factory=list)  # (time, seconds the wall clock jumped)

    @property
    def interrupted(self) -> bool:
        """Ended by what a relauncher restarts: a kill (no close record: SIGKILL, a lost host, the hang watchdog's
        ``os._exit``) or the exit of a preemption's checkpoint or of a hang (``RELAUNCHED_EXITS``). Not a run that
        finished, nor one stopped by a person (Ctrl-C), a refused config or a divergence: who reruns those later
        was not waiting for a relaunch, and the days between are not the slice's idle time."""
        return not self.closed or exit_status(self.ended_by) in RELAUNCHED_EXITS

    @property
    def resume_step(self) -> int | None:
        return None if self.resume is None else self.resume.step

    def last_time(self) -> float:
        times = [self.meta["t"], *(i.t1 for i in self.intervals), *(b.t for b in self.tokens),
                 *(t for _, t in self.checkpoints), *(t for t, _ in self.stored), *(r[0] for r in self.requests),
                 *(t for _, t in self.hangs)]
        return max(times)


# ---------------------------------------------------------------------------------------------
# Reading


def read_records(path: RunPath) -> tuple[list[dict[str, Any]], bool]:
    """All complete records, and whether the file ends with a torn line (a crash mid-write; dropped
    with a warning, and cut off the file by the next session)."""
    contents = read_jsonl(path, torn_tail="warn")
    for line in contents.records:
        if not isinstance(line.value, dict) or "e" not in line.value:
            raise DataError(f"{path} line {line.line}: not a ledger record (no 'e' field)")
    return contents.values, contents.torn_tail is not None


def sessions_of(records: list[dict[str, Any]], path: RunPath) -> list[Session]:
    sessions: list[Session] = []
    for number, record in enumerate(records, start=1):
        try:
            _apply(record, sessions)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise DataError(f"{path} record {number}: malformed '{record.get('e')}' record ({exc})") from exc
    return sessions


def _apply(record: dict[str, Any], sessions: list[Session]) -> None:
    """Add one ledger record to the sessions read so far (ValueError for anything malformed)."""
    kind = record["e"]
    if kind == "open":
        sessions.append(Session(meta=record))
        return
    if not sessions:
        raise ValueError(f"'{kind}' before any 'open' record")
    session = sessions[-1]
    if kind == "time":
        session.intervals.append(Interval(float(record["t0"]), float(record["t1"]),
                                          {k: float(v) for k, v in record["seconds"].items()}))
    elif kind == "tokens":
        by_set = record.get("by_set")
        session.tokens.append(TokenBatch(int(record["first_step"]), int(record["step"]), int(record["tokens"]),
                                         float(record["t_start"]), float(record["t"]),
                                         None if by_set is None else {str(k): int(v) for k, v in by_set.items()}))
    elif kind == "ckpt":
        session.checkpoints.append((int(record["step"]), float(record["t"])))
    elif kind == "resume":
        saved_by, saved_at, tokens = record.get("saved_by"), record.get("saved_at"), record.get("tokens")
        session.resume = Resume(int(record["step"]), None if saved_by is None else int(saved_by),
                                None if saved_at is None else float(saved_at), None if tokens is None else int(tokens))
    elif kind == "inherit":
        session.meta["inherited"] = record  # the latest one counts: a branch that started over from its parent
    elif kind == "stored":
        session.stored.append((float(record["t"]), int(record["bytes"])))
    elif kind == "requests":
        session.requests.append((float(record["t"]), int(record.get("writes", 0)), int(record.get("reads", 0)),
                                 int(record.get("egress_bytes", 0))))
    elif kind == "hang":
        session.hangs.append((float(record["t0"]), float(record["t"])))
    elif kind == "clock":
        session.clock_jumps.append((float(record["t"]), float(record["jump_s"])))
    elif kind == "close":
        session.closed = True
        session.clean = bool(record.get("clean", True))
        session.ended_by = record.get("ended_by")
    else:
        raise ValueError(f"unknown record kind {kind!r}")


def _record_time(record: dict[str, Any]) -> float:
    """When a record was written (a time record: the end of its interval; -inf for one without a time)."""
    return float(record.get("t1", record.get("t", -math.inf)))


def records_until(records: list[dict[str, Any]], checkpoint_item: dict[str, Any],
                  path: RunPath) -> list[dict[str, Any]]:
    """The records up to the session and moment of a checkpoint's ledger item (``Ledger.checkpoint_record``)."""
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


def read_sessions(ledger_dir: str | os.PathLike[str] | RunPath,
                  checkpoint_item: dict[str, Any] | None = None) -> list[Session]:
    """The sessions of a ledger (on a disk or in a bucket); with ``checkpoint_item``, only the records up to the
    session and moment of that checkpoint's ledger item."""
    path = location(ledger_dir) / LEDGER_FILE
    if not appendlog.exists(path):
        raise DataError(f"no ledger at {path}: {PRETRAIN.run_first}")
    records, _ = read_records(path)
    if checkpoint_item is not None:
        records = records_until(records, checkpoint_item, path)
    sessions = sessions_of(records, path)
    if not sessions:
        raise DataError(f"{path} holds no ledger records")
    return sessions


# ---------------------------------------------------------------------------------------------
# Writing


def end_on_a_newline(path: RunPath, torn: bool) -> None:
    """Make the next record start on a fresh line: cut a torn last line off, or end a complete last
    record that a kill left without its newline (a bucket's segments are never torn: nothing to do)."""
    if isinstance(path, BucketPath):
        return
    with path.open("r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if torn:
            handle.seek(0)
            handle.truncate(handle.read().rfind(b"\n") + 1)
        elif size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                handle.write(b"\n")


class LedgerWriter:
    """Appends records to a ledger; ``sync`` makes what was appended durable (on a disk: flush and fsync; in a
    bucket: one more immutable segment, ``experiment.appendlog``)."""

    def __init__(self, path: RunPath) -> None:
        self.path = path
        self._log = appendlog.LogWriter(path)

    def write(self, record: dict[str, Any]) -> None:
        self._log.write(json.dumps(record, ensure_ascii=False) + "\n")

    def sync(self) -> None:
        self._log.sync()

    def close(self, publish: bool = True) -> None:
        self._log.close(publish)
