"""Recipe 04b on this CPU with libtpu: a small model fits v5e-16 and v6e-8; a 7B one gets the clear error.

Needs the ``tpu`` extra (libtpu). Runs with this interpreter when it has libtpu, or with the one
named by RU_TPU_PYTHON (e.g. a separate venv with ``pip install -e '.[tpu]'``); skips otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import missing_extra
from tests.recipe_runner import REPO, error_line, recipe_env, tiny_config

pytestmark = pytest.mark.integration


def tpu_python() -> str:
    candidates = [os.environ.get("RU_TPU_PYTHON", ""), sys.executable]
    for python in filter(None, candidates):
        probe = subprocess.run([python, "-c", "import libtpu"], capture_output=True)
        if probe.returncode == 0:
            return python
    missing_extra("tpu", "libtpu does not import (or set RU_TPU_PYTHON to a python that has it)")


def run_fit_check(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    config = tiny_config(tmp_path)
    env = {**recipe_env(tmp_path), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    cmd = [tpu_python(), str(REPO / "recipes" / "04b_tpu_fit_check.py"), "--config", str(config), *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_small_model_fits_v5e_16_and_v6e_8(tmp_path: Path) -> None:
    proc = run_fit_check(tmp_path, "train.fit_topologies=[v5e-16, v6e-8]", "train.batch_size=32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads((tmp_path / "runs" / "tiny" / "reports" / "fit_check.json").read_text(encoding="utf-8"))
    assert [r["slice"] for r in reports] == ["v5e-16", "v6e-8"]
    assert [r["devices"] for r in reports] == [16, 8]
    for report in reports:
        assert report["fits"] and 0 < report["needed_gib"] < report["capacity_gib"]
        assert report["argument_gib"] > 0
    assert reports[0]["capacity_gib"] == pytest.approx(15.75) and reports[1]["capacity_gib"] == pytest.approx(31.24)
    assert "fits," in proc.stderr and "GiB of 15.75 GiB per device" in proc.stderr


def test_oversized_model_gets_a_clear_error(tmp_path: Path) -> None:
    # 7b width with 8 layers (to compile fast); the tiny shape fields go back to the schema defaults so the preset fills them
    proc = run_fit_check(tmp_path, "model.preset=7b", "model.d_model=256", "model.n_layers=8", "model.d_ff=688",
                         "model.max_seq_len=4096",
                         "shards.seq_len=4096", "tokenizer.vocab_size=32000", "train.batch_size=64",
                         "train.fit_topologies=[v5e-16]")
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert line.startswith("error: v5e-16 (v5e:4x4, 16 devices") and "DOES NOT FIT" in line
    assert "RESOURCE_EXHAUSTED" in line or "GiB of 15.75 GiB" in line
