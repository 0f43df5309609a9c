"""The hang watchdog: a step or a checkpoint save past its deadline logs every thread's stack, books the hang in
the ledger (phase ``hang``) and ends the process with HUNG_EXIT_CODE; recipe 04 made to hang, in a subprocess."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cost.ledger_pricing import summarize_ledger
from experiment.sections.train import TrainConfig
from tests.fixture_run import run_copy
from tests.recipe_runner import REPO, check_integration, recipe_env
from tests.test_ledger import FakeClock, open_fake
from trainer.watchdog import HUNG_EXIT_CODE, Watchdog

HOUR = 3600.0


class Ledger:
    """What the watchdog asks of the ledger, kept for the test to read."""

    def __init__(self) -> None:
        self.hangs: list[tuple[str, float]] = []

    def record_hang(self, what: str, seconds: float, lock_timeout: float = 10.0) -> bool:
        self.hangs.append((what, seconds))
        return True


def stuck_in_a_save(release: threading.Event) -> None:
    release.wait(timeout=60)


def test_a_block_past_its_deadline_dumps_every_stack_records_the_hang_and_exits(
        caplog: pytest.LogCaptureFixture) -> None:
    ledger, exits, release = Ledger(), [], threading.Event()

    def exit_(code: int) -> None:  # the process would end here; the test lets the "hung" thread go instead
        exits.append(code)
        release.set()

    train_cfg = TrainConfig(save_deadline_s=0.3, step_deadline_s=0.0)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, "trainer"), Watchdog(ledger, train_cfg, exit=exit_) as watchdog:
        with watchdog.step(7, first=False):  # step_deadline_s 0: not watched
            time.sleep(0.5)
        assert not exits
        with watchdog.save("the checkpoint save of step 8"):
            stuck_in_a_save(release)
    waited = time.monotonic() - started - 0.5
    assert exits[:1] == [HUNG_EXIT_CODE] and 0.3 <= waited < 5.0
    assert watchdog.fired == "the checkpoint save of step 8"
    assert ledger.hangs[0][0] == "the checkpoint save of step 8" and ledger.hangs[0][1] >= 0.3
    dump = caplog.text
    assert "past its deadline (train.save_deadline_s)" in dump and f"exits with code {HUNG_EXIT_CODE}" in dump
    assert "thread MainThread" in dump and "in stuck_in_a_save" in dump and "release.wait" in dump


def test_a_block_within_its_deadline_ends_nothing() -> None:
    exits: list[int] = []
    with Watchdog(Ledger(), TrainConfig(step_deadline_s=1.0), exit=exits.append) as watchdog:
        for number in range(3):
            with watchdog.step(number, first=False):
                time.sleep(0.4)  # 1.2 s in all: each step is timed on its own
    time.sleep(0.8)
    assert exits == []


def test_the_ledger_books_the_hung_span_as_its_own_badput(tmp_path: Path) -> None:
    clock = FakeClock()
    ledger = open_fake(tmp_path, clock)
    with ledger.phase("train"):
        clock.advance(1.0)
        ledger.add_tokens(1, 1000)
    with ledger.phase("train"):  # a step that never returns: the last half hour of it is the hang
        clock.advance(1.0)
        assert ledger.record_hang("step 2", 0.5 * HOUR)
        # the process ends here (os._exit): no close record
    summary = summarize_ledger(tmp_path / "ledger")
    assert summary.seconds_by_phase == pytest.approx({"train": 1.5 * HOUR, "hang": 0.5 * HOUR})
    rows = {row["phase"]: row for row in summary.badput_rows()}
    assert rows["hang"]["kind"] == "badput" and rows["badput"]["hours"] == pytest.approx(0.5)
    records = [json.loads(line) for line in (tmp_path / "ledger" / "ledger.jsonl").read_text().splitlines()]
    assert {"e": "hang", "what": "step 2", "t0": clock() - 0.5 * HOUR, "t": clock()} in records


# -- recipe 04 made to hang, in a process of its own (it ends with os._exit) --

DEADLINE_S = 3.0
HANGING = {"steps": 12, "checkpoint_every": 4, "log_every": 1, "warmup_steps": 2, "step_deadline_s": DEADLINE_S,
           "save_deadline_s": DEADLINE_S, "first_step_deadline_s": 300.0}


def planted_hang_in_step(marker: Path) -> None:
    marker.write_text(str(time.time()))
    threading.Event().wait()  # a collective whose other host is gone


def planted_hang_in_save(marker: Path) -> None:
    marker.write_text(str(time.time()))
    threading.Event().wait()  # an upload to a bucket that stopped answering


def run_hanging(argv: list[str]) -> None:
    """Recipe 04 with a hang planted (``where``: step or save; ``at``: its step), then the recipe's argv."""
    import trainer.checkpoint
    import trainer.train
    from tests.recipe_runner import recipe_module

    where, at, marker, *recipe_argv = argv
    if where == "step":
        real_batch, steps = trainer.train.global_batch, iter(range(1, 10**6))

        def global_batch(host_batch: dict, sharding: object) -> dict:
            if next(steps) == int(at):
                planted_hang_in_step(Path(marker))
            return real_batch(host_batch, sharding)

        trainer.train.global_batch = global_batch
    else:
        real_save = trainer.checkpoint.save

        def save(manager: object, step: int, *args: object, **kwargs: object) -> None:
            if step == int(at):
                planted_hang_in_save(Path(marker))
            real_save(manager, step, *args, **kwargs)

        trainer.checkpoint.save = save
    recipe_module("04_pretrain.py").main(recipe_argv)


@pytest.mark.integration
@pytest.mark.parametrize(("where", "at", "key"), [("step", 6, "step_deadline_s"), ("save", 4, "save_deadline_s")])
def test_recipe_04_made_to_hang_exits_within_its_deadline_with_the_stacks_and_the_hang_booked(
        fixture_stages: Path, tmp_path: Path, where: str, at: int, key: str) -> None:
    check_integration("04_pretrain.py")
    config = run_copy(fixture_stages, tmp_path, train=HANGING)
    marker = tmp_path / "hung_at"
    command = [sys.executable, "-c", "import sys; from tests.test_hang_watchdog import run_hanging; "
               "run_hanging(sys.argv[1:])", where, str(at), str(marker), "--config", str(config)]
    proc = subprocess.run(command, cwd=REPO, env=recipe_env(tmp_path), capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert proc.returncode == HUNG_EXIT_CODE, proc.stderr[-3000:]
    hung_for = ended - float(marker.read_text())
    assert DEADLINE_S <= hung_for < DEADLINE_S + 10, hung_for  # the deadline, then the dump and the exit
    what = f"step {at}" if where == "step" else f"the checkpoint save of step {at}"
    assert f"{what} has run " in proc.stderr and f"past its deadline (train.{key})" in proc.stderr
    assert f"in planted_hang_in_{where}" in proc.stderr and "thread hang-watchdog" in proc.stderr
    hang_s = summarize_ledger(tmp_path / "runs" / "tiny" / "ledger").seconds_by_phase["hang"]
    assert DEADLINE_S <= hang_s < hung_for + 1
