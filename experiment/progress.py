"""Progress reporting that stays readable in a log file: a tqdm bar on a terminal, plain lines elsewhere.

tqdm redraws its bar with carriage returns; written to a file or a CI log, every redraw is kept, so a
long stage leaves thousands of frames on one line. When stderr is not a terminal, ``progress`` prints
one plain line (count, share done, rate, time left) every ``RU_PROGRESS_EVERY_S`` seconds (default 30)
instead. The share done and the time left count the steps this run set out to do from where it started
(``initial``: a resumed run's or a stage's first step), the count the absolute step.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO, TypeVar

from tqdm.auto import tqdm

from experiment.errors import ConfigError

INTERVAL_ENV = "RU_PROGRESS_EVERY_S"
DEFAULT_INTERVAL_S = 30.0
T = TypeVar("T")


class PlainProgress:
    """The part of tqdm's interface the project uses, printing a line every ``interval_s`` seconds."""

    def __init__(self, iterable: Iterable[Any] | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", initial: int = 0, disable: bool = False, leave: bool = True,
                 interval_s: float = DEFAULT_INTERVAL_S, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.n = self.initial = initial
        self.disable, self.leave, self.interval_s = disable, leave, interval_s
        self.stream, self.clock = stream, clock
        self.postfix = ""
        self.started = self.last_line = clock()
        self.lines_printed = 0
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("progress() was given no iterable to iterate over")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.disable and self.clock() - self.last_line >= self.interval_s:
            self._print()

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        # a transient bar (leave=False) that finished before its first line stays silent, as on a terminal
        if not self.closed and not self.disable and (self.leave or self.lines_printed):
            self._print(final=True)
        self.closed = True

    def line(self, final: bool = False) -> str:
        elapsed = self.clock() - self.started
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        count = f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"
        parts = [f"{self.desc}: {count}" if self.desc else count]
        if self.total:
            # the share of what this run set out to do, on the ETA's base: a stage branched from step 300 of 450 (or
            # a run resumed there) is at 0%, not 67%, when it starts; the count above stays the absolute step
            todo = self.total - self.initial
            share = f"{100 * (self.n - self.initial) / todo if todo > 0 else 100.0:.0f}%"
            parts[0] += f" ({share})" if not self.initial else f" ({share} of {todo} from {self.unit} {self.initial})"
        parts.append(f"{rate:.3g} {self.unit}/s")
        parts.append(f"elapsed {clock_time(elapsed)}")
        if self.total and rate > 0 and not final and self.n < self.total:
            parts.append(f"ETA {clock_time((self.total - self.n) / rate)}")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts) + (" (done)" if final else "")

    def _print(self, final: bool = False) -> None:
        print(self.line(final), file=self.stream or sys.stderr, flush=True)
        self.last_line = self.clock()
        self.lines_printed += 1


def clock_time(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def interval_from_env() -> float:
    raw = os.environ.get(INTERVAL_ENV)
    if raw is None:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ConfigError(f"environment variable {INTERVAL_ENV}: give seconds >= 0 between progress lines, got {raw!r}")
    return value


def progress(iterable: Iterable[T] | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             initial: int = 0, disable: bool = False, leave: bool = True, **tqdm_options: Any) -> Any:
    """tqdm on a terminal (``tqdm_options`` go to it), a ``PlainProgress`` when stderr is not one."""
    if getattr(sys.stderr, "isatty", lambda: False)():
        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=disable, leave=leave,
                    **tqdm_options)
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=disable, leave=leave,
                         interval_s=interval_from_env())
