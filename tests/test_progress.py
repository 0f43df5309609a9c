"""Progress reporting: plain lines on a fake clock, and recipes whose output is not a terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from experiment.errors import ConfigError
from experiment.progress import INTERVAL_ENV, PlainProgress, interval_from_env, progress
from tests.fixture_run import fixture_config
from tests.recipe_runner import run_recipe


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_every_interval_with_rate_and_eta() -> None:
    clock, out = FakeClock(), io.StringIO()
    bar = PlainProgress(total=100, desc="pretrain", unit="step", initial=20, interval_s=30, stream=out, clock=clock)
    for _ in range(10):  # 10 steps in 20 s: no line yet
        clock.now += 2
        bar.update(1)
    assert out.getvalue() == ""
    bar.set_postfix(loss="3.2100")
    for _ in range(5):  # the 15th step comes at 30 s: one line, 15 steps in 30 s = 0.5 step/s, 65 left
        clock.now += 2
        bar.update(1)
    assert out.getvalue() == ("pretrain: 35/100 step (19% of 80 from step 20), 0.5 step/s, elapsed 0:30, ETA 2:10, "
                              "loss=3.2100\n")
    clock.now += 10
    bar.update(1)  # 10 s after the last line: nothing
    bar.close()
    bar.close()
    assert out.getvalue().splitlines()[1:] == [
        "pretrain: 36/100 step (20% of 80 from step 20), 0.4 step/s, elapsed 0:40, loss=3.2100 (done)"]


def test_a_stage_counts_its_percentage_from_the_step_it_started_at() -> None:
    """A stage branched from its parent's step 300 (or a run resumed there) with train.steps 450 has 150 steps to do:
    at 301 it has done 1 of them, not 67%; the ETA has the same base, and the absolute step stays shown."""
    clock, out = FakeClock(), io.StringIO()
    bar = PlainProgress(total=450, desc="pretrain", unit="step", initial=300, interval_s=30, stream=out, clock=clock)
    clock.now += 30
    bar.update(1)
    assert out.getvalue() == ("pretrain: 301/450 step (1% of 150 from step 300), 0.0333 step/s, elapsed 0:30, "
                              "ETA 1:14:30\n")
    clock.now += 30 * 74
    bar.update(74)
    assert out.getvalue().splitlines()[-1] == ("pretrain: 375/450 step (50% of 150 from step 300), 0.0333 step/s, "
                                               "elapsed 37:30, ETA 37:30")


def test_iterating_counts_items_and_transient_bars_stay_quiet() -> None:
    clock, out = FakeClock(), io.StringIO()
    items = list(PlainProgress(range(3), desc="scoring", unit="batch", leave=False, stream=out, clock=clock))
    assert items == [0, 1, 2] and out.getvalue() == ""  # finished before its first line, like a vanished bar

    def slow() -> object:
        for i in range(4):
            clock.now += 3600
            yield i

    assert list(PlainProgress(slow(), desc="documents", unit="doc", interval_s=30, stream=out,
                              clock=clock)) == [0, 1, 2, 3]
    lines = out.getvalue().splitlines()
    assert lines[0] == "documents: 1 doc, 0.000278 doc/s, elapsed 1:00:00"
    assert lines[-1] == "documents: 4 doc, 0.000278 doc/s, elapsed 4:00:00 (done)" and len(lines) == 5


def test_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert interval_from_env() == 30.0
    monkeypatch.setenv(INTERVAL_ENV, "2.5")
    assert interval_from_env() == 2.5
    monkeypatch.setenv(INTERVAL_ENV, "often")
    with pytest.raises(ConfigError, match=f"environment variable {INTERVAL_ENV}: .* got 'often'"):
        interval_from_env()


def test_no_terminal_gives_plain_progress(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "0")
    assert isinstance(progress(total=2), PlainProgress)  # pytest's captured stderr is not a terminal
    assert sum(progress(range(2), desc="two")) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("two: 2/2 it (100%)")


@pytest.mark.integration
def test_recipe_logs_progress_lines_without_carriage_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recipe 01 with stdout and stderr captured (not a terminal): lines, never redrawn bars.

    Recipe 04's bar is checked the same way by the resumed run in tests/test_pipeline.py."""
    monkeypatch.setenv(INTERVAL_ENV, "0")  # a line at every update: the fixture corpus takes a second
    proc = run_recipe("01_build_corpus.py", fixture_config(tmp_path))
    assert "\r" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("documents: ")]
    assert len(lines) >= 2 and lines[-1].endswith("(done)"), proc.stderr[-2000:]
