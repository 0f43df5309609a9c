"""A run that moves between hardware: each session priced at its own catalog row and rate, one ledger.

The first test is arithmetic on a fake clock; the second runs recipe 04 for real: 4 CPU devices (a 2 x 2
data x fsdp mesh: parameters sharded) priced as TPU v5e, SIGTERM, then resumed on 1 CPU device priced as an
AWS H100, with the data order unchanged."""

from __future__ import annotations

import datetime as dt
import signal
import time
from pathlib import Path

import pytest

from cost.ledger import Ledger
from cost.ledger_pricing import summarize_ledger
from cost.ledger_report import REPORT_FILE, summarize_sessions
from cost.rates import UsdRubRate
from experiment.sections.cost import CostConfig

HOUR = 3600.0


def test_two_sessions_on_two_price_rows_sum_to_the_hand_sum(tmp_path: Path) -> None:
    t = [1_000_000.0]
    today = dt.date.today()
    v5e = CostConfig(accelerator="tpu-v5e", pricing="on-demand", chips=8, usd_rub_rate=100.0,
                     usd_rub_date=today.isoformat())
    h100 = CostConfig(accelerator="nvidia-h100", cloud="aws", pricing="spot", chips=4, usd_rub_rate=90.0,
                      usd_rub_date=today.isoformat())
    first = Ledger.open(tmp_path, v5e, "run", rate=UsdRubRate(100.0, today, "config"), clock=lambda: t[0],
                        started_at=t[0], background=False)
    with first.phase("train"):
        t[0] += 2 * HOUR
        first.add_tokens(20, 2_000)
    item = first.checkpoint_record(20)  # the SIGTERM save of step 20
    first.mark_checkpoint(20)
    first.close(clean=False)  # ended by the signal, but every step is checkpointed: nothing is lost
    t[0] += 0.5 * HOUR  # nobody pays between sessions
    second = Ledger.open(tmp_path, h100, "run", rate=UsdRubRate(90.0, today, "config"), clock=lambda: t[0],
                         started_at=t[0], background=False)
    second.mark_resume(20, item)
    with second.phase("train"):
        t[0] += 1 * HOUR
        second.add_tokens(30, 1_000)
    second.close()
    total = summarize_ledger(tmp_path)
    by_hand = 2 * 8 * 1.2 * 100.0 + 1 * 4 * (14.8686 / 8) * 90.0  # v5e on demand, then the AWS H100 spot row
    assert total.rub_total == pytest.approx(by_hand)
    assert total.usd_total == pytest.approx(2 * 8 * 1.2 + 1 * 4 * 14.8686 / 8)
    assert total.tokens == 3_000 and total.last_step == 30 and total.rub_lost_to_restarts == 0
    sessions = summarize_sessions(tmp_path)
    assert [(s["accelerator"], s["pricing"], s["where"], s["chips"]) for s in sessions] == [
        ("tpu-v5e", "on-demand", "gcp/us-central1", 8), ("nvidia-h100", "spot", "aws/us-east-1", 4)]
    assert sum(s["rub"] for s in sessions) == pytest.approx(total.rub_total)
    assert [s["tokens"] for s in sessions] == [2_000, 1_000]
    report = (tmp_path / REPORT_FILE).read_text(encoding="utf-8")
    assert "nvidia-h100" in report and "tpu-v5e" in report and "100.0000 (" in report and "90.0000 (" in report


STEPS = 12
TRAIN = {"steps": STEPS, "log_every": 1, "checkpoint_every": 4, "keep_checkpoints": 2, "warmup_steps": 2,
         "preemption_grace_s": 60.0}
FIRST = ["train.cpu_devices=4", "train.mesh.fsdp=2", "cost.accelerator=tpu-v5e", "cost.chips=2"]  # data 2 x fsdp 2
SECOND = ["train.cpu_devices=1", "cost.accelerator=nvidia-h100", "cost.cloud=aws", "cost.pricing=spot", "cost.chips=1",
          "cost.usd_rub_rate=90.0"]


@pytest.mark.integration
def test_resume_on_another_device_count_and_price_row(fixture_stages: Path, tmp_path: Path) -> None:
    """4 CPU devices (data 2 x fsdp 2) priced as TPU v5e, SIGTERM, resumed on 1 CPU device priced as an AWS H100
    (spot, another rate): one ledger priced session by session, every token once, the data order of an uninterrupted
    run, and the loss after the mesh change close to (not bitwise) the uninterrupted 4-device run's."""
    from tests.fixture_run import log_records, run_copy
    from tests.recipe_runner import logged_steps, run_recipe, signal_when, start_pretrain

    straight = run_copy(fixture_stages, tmp_path / "straight", train=TRAIN)
    run_recipe("04_pretrain.py", straight, *FIRST, subprocess_=True)  # 4 devices: a process of its own
    reference = {r["train/step"]: r for r in log_records(straight.parent / "runs" / "tiny")}

    config = run_copy(fixture_stages, tmp_path / "hybrid", train=TRAIN)
    run_dir = config.parent / "runs" / "tiny"
    output = tmp_path / "first.log"
    proc = start_pretrain(config, output, *FIRST)
    code = signal_when(proc, lambda: any(step >= 5 for step in logged_steps(run_dir)), signal.SIGTERM, timeout=300,
                       output=output, exit_timeout=60)
    assert code == 143, output.read_text()[-3000:]
    stopped = max(r["train/step"] for r in log_records(run_dir))
    assert 5 <= stopped < STEPS
    # a relaunch takes its time: a second at least, so the wait booked below is more than the milliseconds by which
    # the first session's monotonic times and the next process's wall-clock start may disagree
    time.sleep(1.0)
    resumed = run_recipe("04_pretrain.py", config, *SECOND, subprocess_=True)  # a new process, as a relaunch is
    assert f"resumed from the checkpoint of step {stopped}" in resumed.stderr

    # the data order is the uninterrupted run's: same global batch, same loader position at every step
    records = {r["train/step"]: r for r in log_records(run_dir)}
    assert sorted(records) == list(range(1, STEPS + 1))
    for step in records:
        assert records[step]["train/tokens_seen"] == reference[step]["train/tokens_seen"]
        assert records[step]["train/lr"] == reference[step]["train/lr"]
    from tests.fixture_run import checkpoint_contents

    assert checkpoint_contents(run_dir, STEPS)[1]["loader"] == checkpoint_contents(
        straight.parent / "runs" / "tiny", STEPS)[1]["loader"]
    # up to the SIGTERM the same 4-device program ran: bitwise; after it, 1 device: close, not bitwise
    assert all(records[s]["train/loss"] == reference[s]["train/loss"] for s in range(1, stopped + 1))
    after = {s: abs(records[s]["train/loss"] - reference[s]["train/loss"]) / reference[s]["train/loss"]
             for s in range(stopped + 1, STEPS + 1)}
    print(f"relative loss difference after the 4 -> 1 device resume at step {stopped}: max {max(after.values()):.2e}",
          {s: f"{d:.1e}" for s, d in after.items()})
    assert max(after.values()) < 1e-3

    # one ledger, each session at its own price row and rate; the total is the sum of the sessions by hand
    ledger_dir = run_dir / "ledger"
    total = summarize_ledger(ledger_dir)
    sessions = summarize_sessions(ledger_dir)
    assert [(s["accelerator"], s["pricing"], s["chips"], s["usd_rub_rate"], s["devices"]) for s in sessions] == [
        ("tpu-v5e", "on-demand", 2, 101.6797, "4 x cpu"), ("nvidia-h100", "spot", 1, 90.0, "1 x cpu")]
    by_hand = [sum(s["seconds_by_phase"].values()) / 3600 * s["chips"] * s["usd_per_chip_hour"] * s["usd_rub_rate"]
               for s in sessions]
    assert total.rub_total == pytest.approx(sum(by_hand), rel=1e-9)
    assert by_hand[0] > 0 and by_hand[1] > 0
    assert total.tokens == STEPS * 8 * 64 and [s["tokens"] for s in sessions] == [stopped * 512,
                                                                                   (STEPS - stopped) * 512]
    assert total.rub_lost_to_restarts == 0  # the SIGTERM save kept every step
    report = (ledger_dir / REPORT_FILE).read_text(encoding="utf-8")
    assert "4 x cpu" in report and "1 x cpu" in report and "nvidia-h100" in report and "badput" in report
    # the preempted session's close names its exit, and the wait until the resumed process started is booked to it
    # as idle at its on-demand rate (cost.between_sessions: auto holds an on-demand slice)
    from cost.ledger_format import read_sessions

    first, second = read_sessions(ledger_dir)
    assert first.ended_by == "exit 143" and second.ended_by is None
    waited = second.meta["t"] - first.last_time()
    assert waited > 0 and sessions[0]["waited_hours"] == pytest.approx(waited / 3600)
    assert sessions[0]["seconds_by_phase"]["idle"] >= waited
