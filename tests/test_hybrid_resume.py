"""A run that moves between hardware: each session priced at its own catalog row and rate, one ledger.

The first test is arithmetic on a fake clock; the second runs recipe 04 for real: 2 CPU devices priced as
TPU v5e, SIGTERM, then resumed on 1 CPU device priced as an AWS H100, with the data order unchanged."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cost.ledger import REPORT_FILE, Ledger, summarize_ledger, summarize_sessions
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
