"""The ledger's time: a wall-clock jump inside a session is recorded and not billed (cost/ledger_clock.py)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from cost.ledger import Ledger
from cost.ledger_format import LEDGER_FILE
from cost.ledger_pricing import summarize_ledger
from cost.ledger_report import REPORT_FILE
from cost.rates import UsdRubRate
from experiment.sections.cost import CostConfig

RATE = UsdRubRate(100.0, dt.date.today(), "test")
DEMO_RATE = UsdRubRate(101.6797, dt.date(2025, 1, 1), "test")  # the demo's: its 3 days of CPU were 490 RUB
DEMO_RUB_PER_SECOND = 0.06701 * 101.6797 / 3600  # cpu-e2-standard-2 on demand (the bundled catalog)
THREE_DAYS = 3 * 86400.0


class Clocks:
    """A wall clock and a monotonic clock that advance together, and a wall clock that can be set."""

    def __init__(self) -> None:
        self.wall_t, self.mono_t = 1_000_000.0, 50.0

    def wall(self) -> float:
        return self.wall_t

    def monotonic(self) -> float:
        return self.mono_t

    def advance(self, seconds: float) -> None:
        self.wall_t += seconds
        self.mono_t += seconds


def test_a_three_day_wall_clock_jump_mid_run_is_reported_not_billed(tmp_path: Path) -> None:
    clocks = Clocks()
    cfg = CostConfig(accelerator="cpu-e2-standard-2", pricing="on-demand", chips=1, usd_rub_rate=101.6797,
                     usd_rub_date="2025-01-01", max_rate_age_days=100000, flush_seconds=10.0)
    ledger = Ledger.open(tmp_path / "ledger", cfg, "run-1", rate=DEMO_RATE, clock=clocks.wall,
                         monotonic=clocks.monotonic, started_at=clocks.wall(), background=False)
    for step in range(1, 61):  # 60 steps of one second each
        with ledger.phase("train"):
            clocks.advance(1.0)
            if step == 30:
                clocks.wall_t += THREE_DAYS  # an NTP step or `date -s` in the middle of step 30
            ledger.add_tokens(step, 1000)
    ledger.close()

    summary = summarize_ledger(tmp_path / "ledger")
    assert summary.seconds_by_phase == pytest.approx({"train": 60.0})
    assert summary.rub_total == pytest.approx(60.0 * DEMO_RUB_PER_SECOND)  # 0.11 RUB, not 3 days' 490
    records = [json.loads(line) for line in (tmp_path / "ledger" / LEDGER_FILE).read_text().splitlines()]
    assert [r["jump_s"] for r in records if r["e"] == "clock"] == [pytest.approx(THREE_DAYS)]
    report = (tmp_path / "ledger" / REPORT_FILE).read_text()
    assert "## Wall-clock jumps" in report and "session 0: +259,200 s" in report


def test_a_fake_wall_clock_alone_still_drives_the_session(tmp_path: Path) -> None:
    """Tests that pass only ``clock`` (tests/test_ledger.py) keep timing by it: it is both clocks."""
    clocks = Clocks()
    cfg = CostConfig(accelerator="tpu-v5e", chips=8, usd_rub_rate=100.0, usd_rub_date=dt.date.today().isoformat())
    ledger = Ledger.open(tmp_path / "ledger", cfg, "run-1", rate=RATE, clock=clocks.wall,
                         started_at=clocks.wall(), background=False)
    with ledger.phase("train"):
        clocks.wall_t += 7.0
    ledger.close()
    assert summarize_ledger(tmp_path / "ledger").seconds_by_phase == pytest.approx({"train": 7.0})


def test_a_jump_inside_a_killed_session_is_not_waited_for_by_the_next(tmp_path: Path) -> None:
    """The next session starts by the wall clock, which jumped 3 days inside the killed one: the wait is the hour."""
    clocks = Clocks()
    cfg = CostConfig(accelerator="tpu-v5e", pricing="on-demand", chips=8, usd_rub_rate=100.0,
                     usd_rub_date=dt.date.today().isoformat(), flush_seconds=1.0)
    ledger = Ledger.open(tmp_path / "ledger", cfg, "run-1", rate=RATE, clock=clocks.wall,
                         monotonic=clocks.monotonic, started_at=clocks.wall(), background=False)
    with ledger.phase("train"):
        clocks.advance(30.0)
        clocks.wall_t += THREE_DAYS
        clocks.advance(30.0)
        ledger.add_tokens(1, 1000)
    ledger.mark_checkpoint(1)
    ledger._file.close()  # killed: no close record  # noqa: SLF001
    clocks.advance(3600.0)  # an hour until the relaunch (held on demand: billed as idle)
    resumed = Ledger.open(tmp_path / "ledger", cfg, "run-1", rate=RATE, clock=clocks.wall,
                          monotonic=clocks.monotonic, started_at=clocks.wall(), background=False)
    resumed.mark_resume(1)
    resumed.close()
    summary = summarize_ledger(tmp_path / "ledger")
    assert summary.seconds_by_phase == pytest.approx({"train": 60.0, "idle": 3600.0})
