"""A crash-proof money ledger for one training run: wall-clock time by phase, priced in rubles.

The ledger is an append-only JSONL file (``ledger/ledger.jsonl``; its records: ``cost.ledger_format``).
Each process that opens it is a *session*; it appends an ``open`` record (price row, chips, dated
USD->RUB rate), then ``time`` records that cover every second until ``close``. Phase changes and
tokens are only counted in memory (a training step costs no I/O); every ``cost.flush_seconds`` a
background thread appends one ``time`` record (the interval and its seconds by phase) and one
``tokens`` record (the steps and tokens since the last one, with when they finished), flushes and
fsyncs; so does a checkpoint mark and the start of every checkpoint save (``checkpoint_record``).
After a SIGKILL the file holds all but the last few seconds of the session, always every step up to
any checkpoint the next session can restore, and a half-written last line is dropped on reopen.

Object storage: when the run folder is priced as a bucket (``cost.storage``; the model is in
``cost/storage.py``), the session measures what the folder holds when it opens and at every durable
checkpoint (``stored`` records), takes what a caller knows better (``set_stored_bytes``) and the requests it
counted (``add_requests``, written with each flush as a ``requests`` record), and its rubles carry the
GB-months and requests as a line of their own, ``storage``.

This module is the live session the trainer books into (``Ledger``). Reading a ledger back is split
by concern: which seconds and tokens survived restarts (``cost.ledger_sessions``), what they cost
and the totals of a ledger on disk (``cost.ledger_pricing``: ``summarize_ledger``,
``summarize_ledger_at``), and the report written at every close (``cost.ledger_report``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cost.catalog import Catalog
from cost.ledger_clock import SteadyClock
from cost.ledger_format import (
    EXIT_PREFIX,
    LEDGER_FILE,
    PHASES,
    Interval,
    LedgerWriter,
    Resume,
    Session,
    TokenBatch,
    end_on_a_newline,
    read_records,
    sessions_of,
)
from cost.ledger_pricing import check_finite, summarize
from cost.ledger_report import write_report
from cost.ledger_sessions import Tally, resume_from_checkpoint, stored_level, tally_finished
from cost.rates import UsdRubRate, resolve_usd_rub
from cost.storage import AUTO, NONE, StorageChoice, folder_bytes, listing_requests, resolve_storage
from cost.summary import LOST, CostSummary, price_dict
from experiment import appendlog
from experiment.errors import DataError
from experiment.sections.cost import CostConfig
from experiment.storage import RunPath, is_bucket, location
from experiment.storage.backends import storage_failure_reason

log = logging.getLogger("cost.ledger")


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


def _process_start_time() -> float | None:
    try:
        import psutil  # installed with orbax-checkpoint
    except ImportError:
        return None
    return psutil.Process().create_time()


def price_rows(cost_cfg: CostConfig, catalog: Catalog | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """The catalog rows a session is priced by: ``cost.accelerator``/``pricing`` and each infrastructure item.
    A name or pricing the catalog lacks is a ConfigError naming the key; a recipe asks this before it opens
    anything (``check``), so a typo leaves no W&B run or ledger session behind."""
    catalog = catalog or Catalog.from_config(cost_cfg)
    price = catalog.lookup(cost_cfg.accelerator, cost_cfg.pricing, cost_cfg.cloud, cost_cfg.region)
    infra = []
    for index, item in enumerate(cost_cfg.infrastructure):
        key = f"cost.infrastructure[{index}].name"
        row = catalog.lookup(item.name, "on-demand", item.cloud, item.region, kind="infra", key=key)
        infra.append({**price_dict(row), "quantity": item.quantity})
    storage = getattr(cost_cfg, "storage", AUTO) or AUTO
    if storage not in (AUTO, NONE):  # a named storage class: known before anything opens (auto needs the run folder)
        catalog.storage_rows(storage, getattr(cost_cfg, "storage_region", ""), key="cost.storage")
    return price, infra


def storage_choice(cost_cfg: CostConfig, ledger_dir: RunPath, catalog: Catalog | None = None) -> StorageChoice:
    """The storage class the run folder holding ``ledger_dir`` is priced at (``cost.storage``), or none; ``auto``
    that finds no price for a bucket says so once, as a warning."""
    run_folder = ledger_dir.parent
    choice = resolve_storage(cost_cfg, run_folder, catalog or Catalog.from_config(cost_cfg))
    if not choice.priced and is_bucket(run_folder) and (getattr(cost_cfg, "storage", AUTO) or AUTO) == AUTO:
        log.warning("cost.storage: auto prices no object storage for %s: %s", run_folder, choice.why)
    elif choice.priced and choice.unpriced_units():
        log.warning("storage class %s has no price for %s in the catalog: those counts are not priced",
                    choice.name, ", ".join(choice.unpriced_units()))
    return choice


def wait_billed(cost_cfg: CostConfig) -> bool:
    """Whether the slice stays held, and billing, from an interruption of this session to the next one
    (``cost.between_sessions``; auto: a spot slice is taken away, anything else stays until someone deletes it)."""
    held = getattr(cost_cfg, "between_sessions", "auto")
    return cost_cfg.pricing != "spot" if held == "auto" else held == "held"


def what_ended(exc_type: Any, exc: Any) -> str | None:
    """What ended a session, for its close record: an exit code other than 0 (``exit 143`` after a preemption's
    checkpoint) or an exception's type; None for a normal end."""
    if exc_type is None:
        return None
    if isinstance(exc, SystemExit):
        # the status the process exits with, as Python sets it: an int's low 8 bits, 0 for None, and 1 for any
        # other code (printed as a message: sys.exit("143") exits 1, which no relauncher takes for a preemption)
        code = exc.code
        status = code % 256 if isinstance(code, int) else 0 if code is None else 1
        return None if status == 0 else f"{EXIT_PREFIX} {status}"
    return exc_type.__name__


class Ledger:
    """The live ledger of this process's session; see the module docstring for the accounting."""

    def __init__(self, path: RunPath, meta: dict[str, Any], past: list[Session], clock: Callable[[], float],
                 flush_seconds: float, background: bool) -> None:
        self.path = path
        self.meta = meta
        self._past = past
        self._clock = clock
        self._flush_seconds = flush_seconds
        self._lock = threading.RLock()
        self._file = LedgerWriter(path)
        self._current = Tally()  # everything this session counted so far, written or not
        self._resume: Resume | None = None
        self._durable_step: int | None = None  # the latest step known to survive (marked checkpoint or resume)
        self._past_tallies = self._tally_past()
        self._stack: list[str] = []
        self._frame_seconds: list[float] = []  # per phase of the stack: its seconds not yet written to the file
        self._outer = "startup"  # the phase between explicit phases: start-up until the first one, then idle
        self._phase_start = meta["t"]  # when the phase in progress began (or was last counted)
        self._pending = Interval(meta["t"], meta["t"], {})  # counted since the last time record
        self._pending_tokens: TokenBatch | None = None
        self._last_step_done = meta["opened"]  # when the latest step finished (or this session opened)
        self._last_sync = clock()
        # object storage: the level the run folder holds since when (the earlier sessions' last one to start with),
        # requests counted since the last flush, and how to measure the folder (Ledger.open sets it when priced)
        self._storage_level = stored_level(past) or 0
        self._storage_since = meta["t"]
        self._current.storage.last_bytes = stored_level(past)
        self._pending_requests = [0, 0, 0]  # writes, reads, egress bytes
        self._measure: Callable[[], tuple[int, int]] | None = None
        self._listing_path: RunPath | None = None  # the bucket folder a default measurement lists (its LISTs count)
        self._measuring: threading.Thread | None = None
        self._closed = False
        # what made the background flush fail (a full or read-only disk): the next call of the training thread
        # raises it, so a run never goes on unrecorded until its next checkpoint
        self._failed: Exception | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._heartbeat, name="cost-ledger", daemon=True)
            self._thread.start()

    # ----------------------------------------------------------------------------------- opening
    @classmethod
    def open(cls, ledger_dir: str | os.PathLike[str] | RunPath, cost_cfg: CostConfig, run_id: str, *,
             catalog: Catalog | None = None, rate: UsdRubRate | None = None,
             clock: Callable[[], float] = time.time, started_at: float | None = None,
             background: bool = True, chips_in_use: int | None = None,
             monotonic: Callable[[], float] | None = None,
             measure_storage: Callable[[], tuple[int, int]] | None = None) -> Ledger:
        """Open (or continue) ``ledger_dir/ledger.jsonl`` and start a session priced by ``cost_cfg``.

        ``chips_in_use``: the chips training this session (``cost.chips.reconcile_chips``), recorded
        beside the priced ``cost.chips``.

        ``started_at`` (default: this process's start time) prices the start-up before this call;
        ``clock`` and ``background=False`` exist for tests with a fake clock. Durations within the session are
        ``monotonic``'s (``cost.ledger_clock``: a wall-clock jump is recorded, not billed); it defaults to
        ``time.monotonic`` for the real wall clock, and to ``clock`` itself for a fake one.

        ``measure_storage`` (default: every object's size under the run folder, ``ledger_dir``'s parent) gives
        (bytes, objects) the run folder holds, when its object storage is priced (``cost.storage``).
        """
        ledger_dir = location(ledger_dir)
        path = ledger_dir / LEDGER_FILE
        catalog = catalog or Catalog.from_config(cost_cfg)
        price, infra = price_rows(cost_cfg, catalog)
        rate = rate or resolve_usd_rub(cost_cfg)
        # an hour that is not a finite number of rubles (1e308 x the rate) is refused before anything is written
        check_finite({"price": price_dict(price), "infra": infra, "chips": cost_cfg.chips,
                      "vat_rate": cost_cfg.vat_rate, "usd_rub_rate": rate.rate})
        ledger_dir.mkdir(parents=True, exist_ok=True)
        storage = storage_choice(cost_cfg, ledger_dir, catalog)
        past: list[Session] = []
        if appendlog.exists(path):
            records, torn = read_records(path)
            end_on_a_newline(path, torn)
            past = sessions_of(records, path)
        clock = SteadyClock(clock, monotonic or (time.monotonic if clock is time.time else clock))
        now = clock()
        started = _process_start_time() if started_at is None else started_at
        if started is not None and past:  # never price a second twice (process start times are coarse)
            started = max(started, past[-1].last_time())
        begin = min(started, now) if started is not None else now
        meta = {
            "e": "open", "session": len(past), "run_id": run_id, "t": begin, "opened": now, "pid": os.getpid(),
            "chips": cost_cfg.chips, "chips_in_use": chips_in_use, "devices": _device_description(),
            "price": price_dict(price), "infra": infra, "vat_rate": cost_cfg.vat_rate,
            **rate.as_dict(), "token_budget": cost_cfg.token_budget, "wait_billed": wait_billed(cost_cfg),
            **({"storage": storage.meta()} if storage.priced else {}),
        }
        ledger = cls(path, meta, past, clock, cost_cfg.flush_seconds, background)
        with ledger._lock:
            ledger._write(meta)
            ledger._flush()  # the start-up before this call, as the first time record
            if storage.priced:  # what the folder holds now, it held since the process started (nothing wrote yet)
                run_folder = ledger_dir.parent
                ledger._measure = measure_storage or (lambda: folder_bytes(run_folder))
                ledger._listing_path = None if measure_storage else run_folder
                ledger._measure_storage(at=begin)
        action = f"continuing a ledger with {len(past)} earlier session(s)" if past else "new ledger"
        log.info("cost ledger %s (%s): %d x %s at %s, USD->RUB %.4f of %s",
                 path, action, cost_cfg.chips, price.describe(), price.describe_figure(), rate.rate, rate.date)
        return ledger

    def _tally_past(self) -> list[tuple[dict[str, Any], Tally]]:
        return tally_finished(self._past, self._resume, self.meta["t"])

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
            if self._frame_seconds:
                self._frame_seconds[-1] += seconds
        self._phase_start = now
        return now

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(record)

    def _flush(self) -> float:
        """Write what was counted since the last flush (one time record, one tokens record) and fsync."""
        now = self._count_time()
        if now > self._pending.t0:
            self._write({"e": "time", "t0": self._pending.t0, "t1": now, "seconds": self._pending.seconds})
        self._pending = Interval(now, now, {})
        self._frame_seconds = [0.0] * len(self._frame_seconds)
        if isinstance(self._clock, SteadyClock):
            for jump in self._clock.take_jumps():  # booked as what it is: a moved clock, no time of the session
                log.warning("the wall clock jumped by %+.0f s during this session: not billed (cost.ledger_clock)",
                            jump.seconds)
                self._write(jump.record())
        if self._pending_tokens is not None:
            batch = self._pending_tokens
            self._write(batch.record())
            self._pending_tokens = None
        if any(self._pending_requests):
            writes, reads, egress = self._pending_requests
            self._write({"e": "requests", "t": now, "writes": writes, "reads": reads, "egress_bytes": egress})
            self._pending_requests = [0, 0, 0]
        self._file.sync()
        self._last_sync = now
        return now

    def _heartbeat(self) -> None:
        while not self._stop.wait(self._flush_seconds):
            with self._lock:
                if self._closed:
                    return
                try:
                    self._flush()
                except Exception as exc:  # raised in the training thread by its next call (``_check_open``)
                    self._failed = exc
                    return

    def _maybe_flush(self) -> None:
        """Without the background thread (tests, fake clocks), flush when a call finds the time is due."""
        if self._thread is None and self._clock() - self._last_sync >= self._flush_seconds:
            self._flush()

    def _check_open(self) -> None:
        if self._failed is not None:
            raise self._failed
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
            self._frame_seconds.append(0.0)
        try:
            yield
        finally:
            with self._lock:
                if not self._closed:
                    self._count_time()
                self._stack.pop()
                self._frame_seconds.pop()
                self._outer = "idle"
                if not self._closed:
                    self._maybe_flush()

    def book_as_lost(self) -> None:
        """Book the innermost phase in progress, from its start, as ``lost``: a step found, once it ran, to
        have trained nothing (skipped under ``train.nan_policy: skip``). Its nested phases (waiting for data)
        keep their own; what a heartbeat already wrote to the file during the phase stays where it is."""
        with self._lock:
            self._check_open()
            if not self._stack:
                raise RuntimeError("book_as_lost outside a phase")
            self._count_time()
            name, seconds = self._stack[-1], self._frame_seconds[-1]
            if seconds > 0:
                for seconds_by_phase in (self._pending.seconds, self._current.seconds):
                    seconds_by_phase[name] = seconds_by_phase.get(name, 0.0) - seconds
                    seconds_by_phase[LOST] = seconds_by_phase.get(LOST, 0.0) + seconds
            self._stack[-1], self._frame_seconds[-1] = LOST, 0.0

    def record_hang(self, what: str, seconds: float, lock_timeout: float = 10.0) -> bool:
        """Record that ``what`` has hung for the last ``seconds`` (the watchdog, trainer/watchdog.py, from its own
        thread, before it ends the process): a ``hang`` record, then a flush, so the readers book that span as the
        phase ``hang``. The session is left open, as a killed one is. Returns False when the ledger was busy for
        ``lock_timeout`` seconds (the hung thread may hold it, writing to a storage that stopped answering)."""
        if not self._lock.acquire(timeout=lock_timeout):
            return False
        try:
            if self._closed:
                return False
            now = self._clock()
            self._write({"e": "hang", "what": what, "t0": now - seconds, "t": now})
            self._flush()
            return True
        finally:
            self._lock.release()

    def add_tokens(self, step: int, tokens: int, by_set: dict[str, int] | None = None) -> None:
        """Tokens trained by the steps after the previous call up to ``step`` (call per step or per log);
        ``by_set``: those tokens by shard set of a mixture (the report's rubles by data set)."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        with self._lock:
            self._check_open()
            now = self._clock()
            batch = self._pending_tokens
            if batch is None:
                first = (self._current.last_step + 1) if self._current.last_step is not None else int(step)
                self._pending_tokens = TokenBatch(min(first, int(step)), int(step), int(tokens),
                                                   self._last_step_done, now)
            else:
                batch.step, batch.tokens, batch.t = int(step), batch.tokens + int(tokens), now
            if by_set:
                pending = self._pending_tokens
                pending.by_set = pending.by_set or {}
                for name, count in by_set.items():
                    pending.by_set[name] = pending.by_set.get(name, 0) + int(count)
                    self._current.tokens_by_set[name] = self._current.tokens_by_set.get(name, 0.0) + int(count)
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
            self._file.sync()
            self._durable_step = int(step) if self._durable_step is None else max(self._durable_step, int(step))
            if self._measure is not None:  # the folder now holds this checkpoint (and not those it replaced)
                self._measure_later(at=now)

    def mark_resume(self, step: int, checkpoint_item: dict[str, Any] | None = None) -> None:
        """Say which checkpoint step this session restored (the earlier sessions' later work was
        lost), with that checkpoint's ledger item (``checkpoint_record``) to count its steps exactly."""
        with self._lock:
            self._check_open()
            self._resume = resume_from_checkpoint(int(step), checkpoint_item, self.meta["session"])
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

    # ----------------------------------------------------------------------------------- object storage
    def _storage_to(self, now: float) -> float:
        """Count the level held up to ``now`` (in memory) and return the moment counted to."""
        now = max(now, self._storage_since)
        self._current.storage.byte_seconds += self._storage_level * (now - self._storage_since)
        self._storage_since = now
        return now

    def _set_level(self, stored_bytes: int, at: float, objects: int | None = None) -> None:
        t = self._storage_to(at)
        self._storage_level = int(stored_bytes)
        self._current.storage.last_bytes = int(stored_bytes)
        record = {"e": "stored", "t": t, "bytes": int(stored_bytes)}
        self._write({**record, "objects": objects} if objects is not None else record)
        self._file.sync()

    def _measure_later(self, at: float) -> None:
        """``_measure_storage`` in a thread of its own: a listing of a large bucket takes seconds, which the training
        step (the caller holds the ledger's lock) must not wait for. The level is the folder's from ``at`` (the
        checkpoint's moment) on. One at a time: a mark during a listing is measured by the next mark."""
        if self._measuring is not None and self._measuring.is_alive():
            return  # the listing in progress sees this checkpoint too, or the next mark measures again

        def measure() -> None:
            try:
                found = self._measure()  # type: ignore[misc]  # outside the lock: the listing is the slow part
            except Exception as exc:  # any listing failure (a network error is not always an OSError)
                log.warning("could not measure the run folder's storage (%s): keeping %d bytes", exc,
                            self._storage_level)
                return
            with self._lock:
                if not self._closed:
                    self._record_measured(*found, at=at)

        self._measuring = threading.Thread(target=measure, name="cost-ledger-storage", daemon=True)
        self._measuring.start()

    def settle_storage(self, timeout: float | None = None) -> None:
        """Wait for a storage measurement in progress to be recorded (``close`` does; tests do)."""
        measuring = self._measuring
        if measuring is not None and measuring is not threading.current_thread():
            measuring.join(timeout)

    def _record_measured(self, stored_bytes: int, objects: int, at: float | None = None) -> None:
        if self._listing_path is not None:
            self._count_requests(listing_requests(self._listing_path, objects), 0, 0)
        self._set_level(stored_bytes, self._clock() if at is None else at, objects)

    def _measure_storage(self, at: float | None = None) -> None:
        """Measure the run folder (one listing, itself counted as LIST requests) and record its level; a listing
        that fails keeps the level it had, with a warning: the bill is never worth a run."""
        assert self._measure is not None
        try:
            stored_bytes, objects = self._measure()
        except Exception as exc:  # any listing failure (a network error is not always an OSError)
            log.warning("could not measure the run folder's storage (%s): keeping %d bytes", exc, self._storage_level)
            return
        self._record_measured(stored_bytes, objects, at)

    def _count_requests(self, writes: int, reads: int, egress_bytes: int) -> None:
        for index, value in enumerate((writes, reads, egress_bytes)):
            self._pending_requests[index] += int(value)
        self._current.storage.writes += int(writes)
        self._current.storage.reads += int(reads)
        self._current.storage.egress_bytes += int(egress_bytes)

    def set_stored_bytes(self, stored_bytes: int) -> None:
        """The run folder holds ``stored_bytes`` from now on (a caller that knows it better than a listing: the
        checkpoints kept x their size, the shards, the corpus). Priced when ``cost.storage`` prices the folder."""
        if stored_bytes < 0:
            raise ValueError(f"stored bytes must be >= 0, got {stored_bytes}")
        with self._lock:
            self._check_open()
            self._set_level(stored_bytes, self._clock())

    def add_requests(self, writes: int = 0, reads: int = 0, egress_bytes: int = 0) -> None:
        """Requests made to the run's bucket since the last call: write class (PUT, POST, COPY, LIST), read class
        (GET, HEAD), and bytes read out of the provider's network; written with the next flush."""
        if min(writes, reads, egress_bytes) < 0:
            raise ValueError(f"request counts must be >= 0, got {writes}, {reads}, {egress_bytes}")
        with self._lock:
            self._check_open()
            self._count_requests(writes, reads, egress_bytes)
            self._maybe_flush()

    # ----------------------------------------------------------------------------------- reading
    def summary(self) -> CostSummary:
        """Totals so far, including the phase in progress."""
        with self._lock:
            current = Tally(dict(self._current.seconds), self._current.tokens, self._current.last_step,
                            self._current.storage.copy())
            if not self._closed:
                current.add(self._phase_now(), self._clock() - self._phase_start)
                now = max(self._clock(), self._storage_since)
                current.storage.byte_seconds += self._storage_level * (now - self._storage_since)
            return summarize([*self._past_tallies, (self.meta, current)], self.meta.get("token_budget"))

    # ----------------------------------------------------------------------------------- closing
    def close(self, clean: bool = True, ended_by: str | None = None) -> None:
        """End the session; ``clean=False`` (an exception) makes its unsaved work count as lost on resume.
        ``ended_by``: the exit code or exception that ended it (its wait until the next session is then booked).

        A session whose every step is in a durable checkpoint (a SIGTERM save, a crash right after a
        save) lost nothing: its close is clean whatever ended it.
        """
        self.settle_storage(timeout=60)  # the level the last checkpoint left, measured before the session's end
        with self._lock:
            if self._closed:
                return
            if self._failed is not None:  # the file takes no more records: the session ends as a killed one does
                self._closed = True
                self._file.close(publish=False)
                return
            last = self._current.last_step
            clean = clean or last is None or (self._durable_step is not None and last <= self._durable_step)
            now = self._flush()
            self._storage_to(now)
            record = {"e": "close", "clean": clean, "t": now}
            self._write({**record, "ended_by": ended_by} if ended_by else record)
            self._file.sync()
            self._closed = True
            self._file.close()
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
        if exc is not None and storage_failure_reason(exc) is not None:
            # the storage that holds the ledger gave up on this process: writing the close record would only wait
            # out the client's retries again. The session ends as a killed one does; the next reconciles it
            with self._lock:
                self._closed = True
            self._stop.set()
            log.warning("the cost ledger %s could not be closed (its storage failed): the next session counts this "
                        "one from its records up to the last flush", self.path)
            return
        self.close(clean=exc_type is None, ended_by=what_ended(exc_type, exc))

