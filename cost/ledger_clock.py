"""The ledger's clock: wall-clock timestamps that advance with the monotonic clock.

A session's durations must not follow the wall clock: an NTP step, a VM restored with a stale clock or an
operator's ``date -s`` moves ``time.time()`` by seconds to days, and a ledger that subtracted wall times would bill
that jump as training (a +3-day step inside a 60-step run was three days of chip time). ``SteadyClock`` reads the
wall clock once, when the session opens, and from then on returns that moment plus the monotonic seconds elapsed
(``time.monotonic``, which no clock setting moves), so the session's records stay wall-clock dates (comparable
across sessions and hosts) while every interval between them is real elapsed time.

A jump is still worth knowing (the host's clock is wrong, or was): each call also reads the wall clock, and when its
distance to the steady time changes by more than ``JUMP_TOLERANCE_S`` between two readings, the change is kept in
``jumps`` (the ledger writes each as a ``clock`` record; the cost report lists them, priced at nothing). Slow
adjustments (NTP slewing, at most 0.5 ms per second) stay under the tolerance between the ledger's readings,
which come at least every ``cost.flush_seconds``.

Between sessions there is no monotonic clock to compare with (another process, often another host): the time
from one session's last record to the next one's start is the wall clock's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

JUMP_TOLERANCE_S = 2.0  # a change of wall minus monotonic larger than this between two readings is a jump


@dataclass(frozen=True)
class ClockJump:
    """The wall clock moved by ``seconds`` (negative: backwards) relative to elapsed time, around ``at``."""

    at: float  # the session's steady time of the reading that saw it
    seconds: float

    def record(self) -> dict[str, float | str]:
        return {"e": "clock", "t": self.at, "jump_s": self.seconds}


class SteadyClock:
    """``wall`` at the first reading plus ``monotonic`` seconds since; wall-clock jumps are collected, not counted."""

    def __init__(self, wall: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._lock = threading.Lock()  # the ledger's heartbeat thread reads it too
        self._origin_mono = monotonic()
        self._origin_wall = wall()
        self._offset = 0.0  # wall minus steady at the last reading
        self.jumps: list[ClockJump] = []

    def __call__(self) -> float:
        with self._lock:
            steady = self._origin_wall + (self._monotonic() - self._origin_mono)
            offset = self._wall() - steady
            if abs(offset - self._offset) > JUMP_TOLERANCE_S:
                self.jumps.append(ClockJump(steady, offset - self._offset))
            self._offset = offset
            return steady

    def take_jumps(self) -> list[ClockJump]:
        """The jumps seen since the last call (each is written once)."""
        with self._lock:
            jumps, self.jumps = self.jumps, []
            return jumps
