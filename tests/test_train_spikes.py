"""Recipe 04 with train.skip_spikes on the fixture stages: a planted bad batch is skipped and booked as lost, a
run of them past train.max_skipped_steps stops naming a checkpoint, and a resumed run skips what an
uninterrupted one does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fixture_run import checkpoint_contents, read_train_log, run_copy
from tests.recipe_runner import error_line, run_recipe

# spikes checked from step 16 on (half the window); a checkpoint every 8 steps
SPIKY = {"steps": 24, "checkpoint_every": 8, "keep_checkpoints": 4, "warmup_steps": 2, "log_every": 1,
         "skip_spikes": True, "spike_window": 32, "spike_sigma": 6.0}
PLANTED = 18


class Crash(RuntimeError):
    """The process dies mid-run (after the checkpoint of step 8)."""


@contextlib.contextmanager
def planted(monkeypatch: pytest.MonkeyPatch, bad_steps: set[int], first_step: int = 1,
            crash_at: int | None = None) -> Iterator[None]:
    """Recipe 04 in this process with the batches of ``bad_steps`` corrupted (every target one token id, as a
    broken record would read) and, at ``crash_at``, a crash before the step runs."""
    import trainer.train

    real = trainer.train.global_batch
    steps = iter(range(first_step, 10**6))

    def global_batch(host_batch: dict, sharding: object) -> dict:
        step = next(steps)
        if step == crash_at:
            raise Crash(f"planted crash before step {step}")
        if step in bad_steps:
            host_batch = {**host_batch, "targets": np.full_like(host_batch["targets"], 7)}
        return real(host_batch, sharding)

    with monkeypatch.context() as patch:
        patch.setattr(trainer.train, "global_batch", global_batch)
        yield


def run_dir(root: Path) -> Path:
    return root / "runs" / "tiny"


def skipped(run: Path) -> list[int]:
    return [r["train/step"] for r in read_train_log(run) if r["train/skipped"]]


def test_a_planted_spike_is_skipped_booked_as_lost_and_skipped_again_after_a_resume(
        fixture_stages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cost.ledger_pricing import summarize_ledger

    straight = run_copy(fixture_stages, tmp_path / "straight", train=SPIKY)
    with planted(monkeypatch, {PLANTED}):
        run_recipe("04_pretrain.py", straight)
    run = run_dir(tmp_path / "straight")
    assert skipped(run) == [PLANTED]  # the bad batch alone: the ordinary steps around it train
    assert summarize_ledger(run / "ledger").seconds_by_phase["lost"] > 0  # no restart: the skipped step is the loss
    assert len(checkpoint_contents(run, 16)[1]["meta"]["guard"]["window"]["losses"]) == 16

    # killed after the checkpoint of step 8 (a window of 8 steps, not yet warm), resumed: the window it restores
    # is warm at step 16 as the uninterrupted run's was, so step 18 is skipped again, and the runs end bitwise equal
    resumed = run_copy(fixture_stages, tmp_path / "resumed", train=SPIKY)
    with planted(monkeypatch, {PLANTED}, crash_at=12):
        crashed = run_recipe("04_pretrain.py", resumed, check=False)
    assert crashed.returncode == 1 and "planted crash before step 12" in crashed.stderr
    with planted(monkeypatch, {PLANTED}, first_step=9):
        run_recipe("04_pretrain.py", resumed)
    again = run_dir(tmp_path / "resumed")
    assert skipped(again) == [PLANTED]
    ours, theirs = checkpoint_contents(again, 24)[0], checkpoint_contents(run, 24)[0]
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        assert np.array_equal(value, theirs[key]), key


def test_a_run_of_spikes_past_max_skipped_steps_stops_naming_a_checkpoint(
        fixture_stages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # at 3 sigma the second bad batch in a row is still a spike (at 6 the first one widens the window enough
    # to pass: a lasting shift becomes the baseline, as in MaxText)
    config = run_copy(fixture_stages, tmp_path, train={**SPIKY, "spike_sigma": 3.0, "max_skipped_steps": 1})
    with planted(monkeypatch, {PLANTED, PLANTED + 1}):
        proc = run_recipe("04_pretrain.py", config, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = error_line(proc)
    assert f"training diverged at step {PLANTED + 1}" in line and "a spike (limits" in line, line
    assert "2 steps in a row skipped, more than train.max_skipped_steps=1" in line
    assert "the last good checkpoint is step 16" in line and "Raise train.spike_sigma" in line, line
