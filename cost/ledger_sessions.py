"""Session reconciliation: which of a ledger's seconds and tokens survived, session by session.

Every second is paid once. When a session trained steps past the step the next session resumed
from (its ``resume`` record), or, without a later session, past its last durable checkpoint and
ended without a clean close, its train/eval/idle time after it finished that step bought nothing
that survived: that time moves to the phase ``lost``, and the tokens of those steps are not
counted, since the next session trains them again and pays for them a second time.

Reconciliation on resume: the checkpoint's ledger item (``Ledger.checkpoint_record``) names the
session that saved it, when, and the tokens counted up to its step. A resume from it cuts that
session's work exactly at that moment, and credits any steps up to the checkpoint that the file
missed (a checkpoint saved before the save flushed the ledger), so every step up to the restored
checkpoint is counted exactly once whatever the crash pattern.

Object storage (``cost.storage``) is not reconciled: the bytes a run folder held were held, and requests were
paid, whether the work that made them survived or not. A session's storage is the integral of its ``stored``
levels over its wall time, from its start (at the level the earlier sessions left) to its last record.

The wait after an interruption: when a session was killed or exited on a preemption or a hang (``Session.interrupted``),
the time from its last record to the start of the session that followed it is booked to it as ``idle`` when its
open record says the slice stayed held and billing (``wait_billed``: ``cost.between_sessions``), and only counted
(``Tally.waited``, shown in the report, no rubles) when it was released. A session that finished and was started
again later (a run extended) books no wait: nobody was waiting for it.

The result is a ``Tally`` per session (seconds by phase, tokens, last step, storage use), which
``cost.ledger_pricing`` prices.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from cost.ledger_format import Interval, Resume, Session
from cost.storage import StorageUse
from cost.summary import HANG, LOST

log = logging.getLogger("cost.ledger")

# Phases whose time after the last surviving step is redone after a crash. Start-up and compilation
# are paid again by every session anyway and stay visible under their own names; checkpoint time
# after that step is mostly the save of that very step (which the next session resumed from).
REDONE_PHASES = frozenset({"train", "data", "eval", "idle"})


@dataclass
class Tally:
    """Seconds by phase and tokens of one session (after moving lost work out of its phases)."""

    seconds: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    last_step: int | None = None
    storage: StorageUse = field(default_factory=StorageUse)  # what the run folder held and was asked, this session
    waited: float = 0.0  # seconds from this session's interruption to the next session's start (billed or not)
    tokens_by_set: dict[str, float] = field(default_factory=dict)  # a mixture's tokens by shard set (surviving ones)

    def add(self, phase: str, seconds: float) -> None:
        if seconds > 0:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds


def resume_from_checkpoint(step: int, item: Any, session: int) -> Resume:
    """What a checkpoint's ledger item says (the current form, or the plain summary saved before
    there was one); an item that does not fit is ignored with a warning (the file alone is used)."""
    if not item:
        return Resume(step)
    try:
        saved_by = int(item["session"]) if "session" in item else int(item["sessions"]) - 1
        saved_step = int(item["step"]) if "step" in item else int(item["last_step"])
        saved_at = float(item["t"]) if "t" in item else None
        tokens = int(item["tokens"])
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("the ledger item of checkpoint %d is unreadable (%r): counting from the ledger file alone",
                    step, exc)
        return Resume(step)
    if saved_step != step or not 0 <= saved_by < session or tokens < 0:
        log.warning("the ledger item of checkpoint %d is for step %s of session %s: counting from the ledger "
                    "file alone", step, saved_step, saved_by)
        return Resume(step)
    return Resume(step, saved_by, saved_at, tokens)


def moment_of(session: Session, step: int) -> float:
    """When ``session`` finished training ``step`` (-inf when all of its steps came after it).

    Taken from the token records, not the checkpoint marks: with asynchronous saves a checkpoint
    is only confirmed (and marked) after later steps have run.
    """
    times = [b.finished_at(step) for b in session.tokens if b.first_step <= step]
    return max(times, default=-math.inf)


def tally_session(session: Session, survived_step: int | None, saved_at: float | None = None) -> Tally:
    """Phases and tokens of a finished session; work past ``survived_step`` becomes ``lost``.

    ``saved_at``: when this session started saving the checkpoint of ``survived_step`` (its work
    before that survived); without it, when the token records say that step finished.
    """
    tally = Tally()
    trained_to = max((b.step for b in session.tokens), default=None)
    if survived_step is None or (trained_to is not None and trained_to <= survived_step):
        cutoff = math.inf  # no step past the surviving one: nothing was redone
    elif saved_at is not None:
        cutoff = saved_at
    else:
        cutoff = moment_of(session, survived_step)
    for interval in session.intervals:
        length = interval.t1 - interval.t0
        kept = 1.0 if interval.t1 <= cutoff else 0.0 if interval.t0 >= cutoff else (cutoff - interval.t0) / length
        hung = hung_share(interval, session.hangs)
        for phase, seconds in interval.seconds.items():
            tally.add(HANG, seconds * hung)  # a hang's time is its own badput, whatever phase it hung in
            seconds *= 1.0 - hung
            if phase in REDONE_PHASES:
                tally.add(phase, seconds * kept)
                tally.add(LOST, seconds * (1.0 - kept))
            else:
                tally.add(phase, seconds)
    limit = math.inf if survived_step is None else survived_step
    tally.tokens = sum(b.tokens if survived_step is None else b.tokens_up_to(survived_step) for b in session.tokens)
    for batch in session.tokens:  # a mixture's sets: cut at the same step as the tokens
        for name, tokens in batch.by_set_up_to(limit).items():
            tally.tokens_by_set[name] = tally.tokens_by_set.get(name, 0.0) + tokens
    tally.last_step = max((min(b.step, limit) for b in session.tokens if b.first_step <= limit), default=None)
    return tally


def hung_share(interval: Interval, hangs: list[tuple[float, float]]) -> float:
    """The share of ``interval`` that a hang (a ``hang`` record's span) covers."""
    length = interval.t1 - interval.t0
    if length <= 0 or not hangs:
        return 0.0
    covered = sum(max(0.0, min(interval.t1, end) - max(interval.t0, start)) for start, end in hangs)
    return min(1.0, covered / length)


def stored_level(sessions: list[Session]) -> int | None:
    """The bytes the run folder held when the last of ``sessions`` ended (None: never measured nor set)."""
    for session in reversed(sessions):
        if session.stored:
            return max(session.stored, key=lambda level: level[0])[1]
    return None


def add_storage(tally: Tally, session: Session, carried: int | None) -> int | None:
    """Count ``session``'s storage into ``tally``: its levels over its wall time, starting at the level the earlier
    sessions left (``carried``), and its requests. Returns the level it leaves."""
    start, end = float(session.meta["t"]), session.last_time()
    level, since = carried or 0, start
    for t, stored in sorted(session.stored, key=lambda level: level[0]):
        t = min(max(t, start), end)
        tally.storage.byte_seconds += level * (t - since)
        level, since = stored, t
    tally.storage.byte_seconds += level * (end - since)
    tally.storage.last_bytes = level if session.stored or carried is not None else None
    for _, writes, reads, egress in session.requests:
        tally.storage.writes += writes
        tally.storage.reads += reads
        tally.storage.egress_bytes += egress
    return level if session.stored else carried


def book_wait(tally: Tally, session: Session, next_start: float) -> None:
    """The time from an interrupted ``session``'s last record to ``next_start`` (when the next session's process
    started): ``idle`` at the session's own hourly rate where its slice stayed held, else only counted."""
    if not session.interrupted:
        return
    # the session's times follow its monotonic clock; the next one's start is the wall clock's: a jump the session
    # saw (its clock records) is where the wall clock went meanwhile, not time anyone waited
    ended = session.last_time() + sum(jump for _, jump in session.clock_jumps)
    tally.waited = max(0.0, next_start - ended)
    if session.meta.get("wait_billed"):
        tally.add("idle", tally.waited)


def tally_finished(sessions: list[Session], resume_after: Resume | None,
                   next_start: float | None = None) -> list[tuple[dict[str, Any], Tally]]:
    """Tallies of finished sessions. A later session that resumed from step S (the smallest such S
    after a session) means that session's work past S was redone; without one, a session that did
    not close cleanly kept only the work up to its last marked checkpoint. ``next_start``: when the session after
    the last of these started (its wait is booked to the last one)."""
    tallies: list[Tally] = [Tally() for _ in sessions]
    judged_by: list[Resume | None] = [None] * len(sessions)
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
        tallies[index] = tally_session(session, survived, saved_at)
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
    carried: int | None = None
    for session, tally in zip(sessions, tallies, strict=True):
        carried = add_storage(tally, session, carried)
    starts = [float(s.meta["t"]) for s in sessions[1:]] + ([] if next_start is None else [next_start])
    for session, tally, start in zip(sessions, tallies, starts, strict=False):
        book_wait(tally, session, start)
    return [(session.meta, tally) for session, tally in zip(sessions, tallies, strict=True)]


def tally_on_disk(sessions: list[Session]) -> list[tuple[dict[str, Any], Tally]]:
    """The tallies of a ledger read from disk: the last session is taken as it is (a crash in it is
    only known once a later session resumes)."""
    last = sessions[-1]
    tally = tally_session(last, None)
    add_storage(tally, last, stored_level(sessions[:-1]))
    return [*tally_finished(sessions[:-1], last.resume, float(last.meta["t"])), (last.meta, tally)]
