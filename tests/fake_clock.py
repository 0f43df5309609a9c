"""The clock the cost ledger's tests hand it: time moves only when the test says so (hours at a time)."""

from __future__ import annotations

HOUR = 3600.0


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, hours: float) -> None:
        self.t += hours * HOUR
