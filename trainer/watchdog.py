"""The hang watchdog: a step or a checkpoint save that outlives its deadline ends the process, with its stacks.

A multi-host step waiting on a host that died, or an async save to a bucket that stopped answering, never
returns and never raises: the slice is paid while nothing trains and nobody watches. The loop arms a
deadline around each step (``train.step_deadline_s``; the session's first step, which compiles,
``train.first_step_deadline_s``) and around the blocking part of each checkpoint save (``train.save_deadline_s``).
A background thread, on a monotonic clock, finds one that ran out and, since the hung main thread cannot be
interrupted:

1. logs every thread's stack (``sys._current_frames``) through the ``trainer`` logger: on a multi-host run each
   process writes its own to its own log, which is what tells the host that hangs from those that wait on it;
2. records the hang in the cost ledger (process 0's: ``Ledger.record_hang``), so the report books the hung time
   as the badput phase ``hang``;
3. exits with ``HUNG_EXIT_CODE`` (``os._exit``: no cleanup that could hang again), which a relauncher treats
   as "restart from the last checkpoint" (docs/launch.md).

If logging or the ledger themselves block (the hung thread holding a lock), a timer exits with the same code
after ``EXIT_GRACE_S``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Protocol

from experiment.sections.train import TrainConfig

log = logging.getLogger("trainer")
HUNG_EXIT_CODE = 124  # what coreutils' timeout exits with when the command outlived its limit: relaunch
EXIT_GRACE_S = 30.0  # the most the stacks and the ledger record may take before the process exits anyway


class HangLedger(Protocol):
    def record_hang(self, what: str, seconds: float, lock_timeout: float = 10.0) -> bool: ...


def thread_stacks() -> str:
    """Every thread's current stack, named, as ``traceback`` formats it (most recent call last)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"thread {names.get(ident, '?')} ({ident}):\n{''.join(traceback.format_stack(frame))}")
    return "\n".join(parts)


class Watchdog:
    """Deadlines for one thing at a time (the loop's step or save), watched by a daemon thread while entered.

    ``exit``: how the process ends (``os._exit``; a test of this class alone passes its own).
    """

    def __init__(self, ledger: HangLedger, train_cfg: TrainConfig, exit: Callable[[int], None] = os._exit,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger, self.train_cfg, self._exit, self._clock = ledger, train_cfg, exit, clock
        self._armed: tuple[str, str, float, float] | None = None  # (what, key, started, deadline)
        self._changed = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.fired: str | None = None  # what hung (set before the process exits)

    def __enter__(self) -> Watchdog:
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def step(self, number: int, first: bool) -> contextlib.AbstractContextManager[None]:
        """The deadline of step ``number``; ``first``: the session's first, which compiles."""
        if first:
            return self.deadline(f"step {number} (the session's first)", self.train_cfg.first_step_deadline_s,
                                 "first_step_deadline_s")
        return self.deadline(f"step {number}", self.train_cfg.step_deadline_s, "step_deadline_s")

    def save(self, what: str) -> contextlib.AbstractContextManager[None]:
        """The deadline of the blocking part of a checkpoint save (``what`` says which)."""
        return self.deadline(what, self.train_cfg.save_deadline_s, "save_deadline_s")

    @contextlib.contextmanager
    def deadline(self, what: str, seconds: float, key: str) -> Iterator[None]:
        """Watch the block: if it runs longer than ``seconds`` (config key ``key``; 0: not watched), the
        process ends as the module docstring says. Not reentrant: a save inside a watched step is not nested."""
        if seconds <= 0 or self._thread is None:
            yield
            return
        start = self._clock()
        with self._changed:
            self._armed = (what, key, start, start + seconds)
            self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                self._armed = None
                self._changed.notify_all()

    def _watch(self) -> None:
        with self._changed:
            while not self._stopped:
                if self._armed is None:
                    self._changed.wait()
                    continue
                left = self._armed[3] - self._clock()
                if left > 0:
                    self._changed.wait(timeout=left)
                    continue
                what, key, started, _ = self._armed
                break
            else:
                return
        self._fire(what, key, self._clock() - started)

    def _fire(self, what: str, key: str, seconds: float) -> None:
        self.fired = what
        backstop = threading.Timer(EXIT_GRACE_S, self._exit, (HUNG_EXIT_CODE,))
        backstop.daemon = True
        backstop.start()
        try:
            log.error("%s has run %.0f s, past its deadline (train.%s): the stacks of every thread follow, then "
                      "the process exits with code %d (hung; rerun the same command to resume from the last "
                      "checkpoint)\n%s", what, seconds, key, HUNG_EXIT_CODE, thread_stacks())
            if not self.ledger.record_hang(what, seconds):
                log.error("the cost ledger was busy: the hang is not recorded in it")
            for handler in logging.getLogger().handlers + log.handlers:
                handler.flush()
        finally:
            self._exit(HUNG_EXIT_CODE)
