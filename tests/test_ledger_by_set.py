"""The cost ledger's tokens by data set (a mixture's shard sets): booked with the steps, cut with them at a resume,
and the report's rubles by data set adding up to the run's rubles."""

from __future__ import annotations

from pathlib import Path

import pytest

from cost.ledger_format import read_sessions
from cost.ledger_pricing import summarize_ledger
from cost.ledger_report import REPORT_FILE, _rows, data_set_rows
from cost.ledger_sessions import tally_on_disk
from tests.fake_clock import FakeClock
from tests.test_ledger import RUB_PER_HOUR, open_fake

B = 1_000_000_000


def test_rubles_by_data_set_follow_the_surviving_tokens_and_add_up(tmp_path: Path) -> None:
    """Session 0: 0.5 h compile, 1 h to step 100 (web 0.75B, code 0.25B), 0.25 h checkpoint, 1 h to step 150 (code
    0.5B), killed, 0.25 h until the restart (held: idle). Session 1 resumes from 100: 0.5 h compile, 1.5 h to step
    200 (web 0.2B, books 0.8B). Session 0 paid 3 h (its lost hour too) for web 0.75 : code 0.25 of what survived."""
    clock = FakeClock()
    ledger = open_fake(tmp_path, clock)
    with ledger.phase("compile"):
        clock.advance(0.5)
    with ledger.phase("train"):
        clock.advance(1.0)
        ledger.add_tokens(50, B // 2, {"web": 3 * B // 8, "code": B // 8})
        ledger.add_tokens(100, B // 2, {"web": 3 * B // 8, "code": B // 8})  # one record with the one before
    with ledger.phase("checkpoint"):
        clock.advance(0.25)
        item = ledger.checkpoint_record(100)
        ledger.mark_checkpoint(100)
    with ledger.phase("train"):
        clock.advance(1.0)
        ledger.add_tokens(150, B // 2, {"web": 0, "code": B // 2})
    ledger._file.close()  # the process dies here: no close record  # noqa: SLF001
    clock.advance(0.25)
    ledger = open_fake(tmp_path, clock)
    ledger.mark_resume(100, item)
    with ledger.phase("compile"):
        clock.advance(0.5)
    with ledger.phase("train"):
        clock.advance(1.5)
        ledger.add_tokens(200, B, {"web": B // 5, "books": 4 * B // 5})
    ledger.close()

    sessions = read_sessions(tmp_path / "ledger")
    tallies = tally_on_disk(sessions)
    assert tallies[0][1].tokens_by_set == {"web": 0.75 * B, "code": 0.25 * B}  # steps 101-150 were redone
    total = summarize_ledger(tmp_path / "ledger").rub_total
    assert total == pytest.approx(5.0 * RUB_PER_HOUR)
    table = {row["data_set"]: row for row in data_set_rows(_rows(sessions, tallies), tallies, total)}
    assert table["web"]["rub"] == pytest.approx(3.0 * RUB_PER_HOUR * 0.75 + 2.0 * RUB_PER_HOUR * 0.2)
    assert table["code"]["rub"] == pytest.approx(3.0 * RUB_PER_HOUR * 0.25)
    assert table["books"]["rub"] == pytest.approx(2.0 * RUB_PER_HOUR * 0.8)
    assert table["web"]["tokens"] == pytest.approx(0.95 * B)
    assert sum(table[n]["rub"] for n in ("web", "code", "books")) == pytest.approx(table["total"]["rub"]) \
        == pytest.approx(total)
    assert sum(table[n]["share"] for n in ("web", "code", "books")) == pytest.approx(1.0)
    report = (tmp_path / "ledger" / REPORT_FILE).read_text(encoding="utf-8")
    assert "## Rubles by data set" in report and "| books |" in report


def test_a_run_on_one_shard_set_has_no_such_table(tmp_path: Path) -> None:
    clock = FakeClock()
    ledger = open_fake(tmp_path, clock)
    with ledger.phase("train"):
        clock.advance(1.0)
        ledger.add_tokens(10, B)
    ledger.close()
    assert "by data set" not in (tmp_path / "ledger" / REPORT_FILE).read_text(encoding="utf-8")
