"""The wait between an interrupted session and the session that resumes it, booked as idle (cost.between_sessions)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from cost.ledger import Ledger, what_ended
from cost.ledger_format import RELAUNCHED_EXITS
from cost.ledger_pricing import summarize_ledger
from cost.ledger_report import REPORT_FILE, summarize_sessions
from cost.rates import UsdRubRate
from experiment.errors import ConfigError
from experiment.sections.cost import CostConfig
from tests.fake_clock import FakeClock
from trainer.guard import TrainingDiverged
from trainer.preemption import PREEMPTED_EXIT_CODE
from trainer.watchdog import HUNG_EXIT_CODE

RATE = UsdRubRate(100.0, dt.date.today(), "test")
USD_PER_CHIP_HOUR = {"on-demand": 1.20, "spot": 0.24493}  # tpu-v5e in the bundled catalog


def open_at(tmp_path: Path, clock: FakeClock, pricing: str, between_sessions: str = "auto") -> Ledger:
    cfg = CostConfig(accelerator="tpu-v5e", pricing=pricing, chips=8, usd_rub_rate=100.0,
                     usd_rub_date=dt.date.today().isoformat(), flush_seconds=1.0, between_sessions=between_sessions)
    return Ledger.open(tmp_path / "ledger", cfg, "run-1", rate=RATE, clock=clock, started_at=clock(),
                       background=False)


def first_session(tmp_path: Path, clock: FakeClock, pricing: str, ending: str, between_sessions: str = "auto") -> None:
    """One hour of training to step 100, checkpointed, then the session ends as ``ending`` says."""
    ledger = open_at(tmp_path, clock, pricing, between_sessions)
    with ledger.phase("train"):
        clock.advance(1.0)
        ledger.add_tokens(100, 1_000_000)
    ledger.mark_checkpoint(100)
    if ending == "sigkill":
        ledger._file.close()  # the process dies: no close record  # noqa: SLF001
    elif ending == "preempted":  # SIGTERM: the checkpoint is saved, the trainer exits 143 through the ledger
        with pytest.raises(SystemExit), ledger:
            raise SystemExit(PREEMPTED_EXIT_CODE)
    elif ending == "hung":  # the watchdog's exit, where its os._exit let the close record through
        with pytest.raises(SystemExit), ledger:
            raise SystemExit(HUNG_EXIT_CODE)
    elif ending in STOPPED_BY:
        with pytest.raises(STOPPED_BY[ending]), ledger:
            raise STOPPED_BY[ending]("stopped")
    else:
        with ledger:  # finished: a normal end
            pass


# ends nobody relaunches: a person's Ctrl-C, a config error, a divergence; whoever reruns later was not waiting
STOPPED_BY: dict[str, type[BaseException]] = {"ctrl-c": KeyboardInterrupt, "config error": ConfigError,
                                              "diverged": TrainingDiverged}


def resumed_session(tmp_path: Path, clock: FakeClock, pricing: str, between_sessions: str = "auto") -> float:
    ledger = open_at(tmp_path, clock, pricing, between_sessions)
    ledger.mark_resume(100)
    live_idle = ledger.summary().rub_by_phase.get("idle", 0.0)  # what W&B's rub_spent shows from the reopen on
    with ledger.phase("train"):
        clock.advance(0.5)
        ledger.add_tokens(150, 500_000)
    ledger.close()
    return live_idle


@pytest.mark.parametrize(("pricing", "ending", "between_sessions", "billed"), [
    ("on-demand", "sigkill", "auto", True),  # a crashed on-demand VM stays up and bills until the relaunch
    ("on-demand", "preempted", "auto", True),
    ("spot", "sigkill", "auto", False),  # a spot slice taken away bills nothing meanwhile
    ("spot", "preempted", "auto", False),
    ("spot", "preempted", "held", True),  # a queued resource kept waiting for capacity, say
    ("on-demand", "sigkill", "released", False),  # the relauncher deletes the VM at once
])
def test_a_run_killed_and_resumed_an_hour_later_shows_the_wait(tmp_path: Path, pricing: str, ending: str,
                                                                between_sessions: str, billed: bool) -> None:
    clock = FakeClock()
    first_session(tmp_path, clock, pricing, ending, between_sessions)
    clock.advance(1.0)  # an hour until the relaunched process starts
    live_idle = resumed_session(tmp_path, clock, pricing, between_sessions)

    rub_per_hour = 8 * USD_PER_CHIP_HOUR[pricing] * 100.0
    idle_rub = rub_per_hour if billed else 0.0
    summary = summarize_ledger(tmp_path / "ledger")
    assert summary.rub_by_phase.get("idle", 0.0) == pytest.approx(idle_rub)
    assert live_idle == pytest.approx(idle_rub)
    assert summary.rub_total == pytest.approx(1.5 * rub_per_hour + idle_rub)  # 1 h + 0.5 h of training, and the wait
    assert summary.hours == pytest.approx(1.5 + (1.0 if billed else 0.0))
    rows = summarize_sessions(tmp_path / "ledger")
    assert rows[0]["waited_hours"] == pytest.approx(1.0) and rows[1]["waited_hours"] == 0.0
    assert rows[0]["wait"] == ("held: idle at this session's rate" if billed else "released: not billed")
    report = (tmp_path / "ledger" / REPORT_FILE).read_text()
    idle_cells = next(line for line in report.splitlines() if line.startswith("| idle")).split("|")
    assert float(idle_cells[4].replace(",", "")) == pytest.approx(idle_rub, rel=1e-3)  # the goodput/badput table
    assert "waited for the next session (h)" in report and rows[0]["wait"] in report


def test_the_relaunched_exits_are_the_trainers() -> None:
    assert (PREEMPTED_EXIT_CODE, HUNG_EXIT_CODE) == RELAUNCHED_EXITS


def rewrite_close_record(ledger_dir: Path, ended_by: object) -> None:
    """The first session's close record as another writer (an older version, a hand edit) may have left it."""
    path = next(p for p in ledger_dir.iterdir() if p.suffix == ".jsonl")
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    close = next(r for r in records if r["e"] == "close")
    close["ended_by"] = ended_by
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.mark.parametrize(("ended_by", "relaunched"), [
    ("exit 143 ", True), ("exit  143", True), (143, True), ("exit 124", True),  # the same codes, spelled otherwise
    ("exit 1430", False), ("exit 14", False), ("exit 0", False), ("exit 14 3", False), ("ValueError", False)])
def test_the_wait_is_booked_by_the_exit_code_as_a_number(tmp_path: Path, ended_by: object, relaunched: bool) -> None:
    """The code a close record names is compared as the integer it is, not as text: a 143 spelled with a space
    more is still a preemption's exit, and a 1430 or 14 is none."""
    clock = FakeClock()
    first_session(tmp_path, clock, "on-demand", "preempted")
    rewrite_close_record(tmp_path / "ledger", ended_by)
    clock.advance(1.0)
    resumed_session(tmp_path, clock, "on-demand")
    idle = summarize_ledger(tmp_path / "ledger").rub_by_phase.get("idle", 0.0)
    assert idle == (pytest.approx(8 * 1.20 * 100.0) if relaunched else 0.0)


@pytest.mark.parametrize(("code", "recorded"), [(PREEMPTED_EXIT_CODE, "exit 143"), ("143", "exit 1"),
                                                ("0", "exit 1"), (0, None), (None, None), (399, "exit 143")])
def test_a_close_record_names_the_status_the_process_exits_with(code: object, recorded: str | None) -> None:
    """``sys.exit("143")`` prints 143 and exits 1 (a string code is a message), and ``sys.exit(399)`` exits
    399 & 0xFF = 143: the record says what the shell and the relauncher see."""
    assert what_ended(SystemExit, SystemExit(code)) == recorded


def test_a_hang_ended_session_resumed_an_hour_later_shows_the_wait(tmp_path: Path) -> None:
    clock = FakeClock()
    first_session(tmp_path, clock, "on-demand", "hung")
    clock.advance(1.0)
    resumed_session(tmp_path, clock, "on-demand")
    assert summarize_ledger(tmp_path / "ledger").rub_by_phase.get("idle") == pytest.approx(8 * 1.20 * 100.0)


@pytest.mark.parametrize("ending", ["finished", *STOPPED_BY])
def test_a_run_ended_by_nobodys_relauncher_and_started_again_later_books_no_wait(tmp_path: Path, ending: str) -> None:
    clock = FakeClock()
    first_session(tmp_path, clock, "on-demand", ending)
    clock.advance(24.0)  # a day later the run is extended: nobody was waiting for it
    resumed_session(tmp_path, clock, "on-demand")
    summary = summarize_ledger(tmp_path / "ledger")
    assert "idle" not in summary.rub_by_phase and summary.hours == pytest.approx(1.5)
    assert [row["waited_hours"] for row in summarize_sessions(tmp_path / "ledger")] == [0.0, 0.0]
    assert "waited for the next session" not in (tmp_path / "ledger" / REPORT_FILE).read_text()
