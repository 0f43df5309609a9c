"""Recipe 04 end to end on real text: the loss falls, and SIGKILL / SIGTERM + resume retrace the
uninterrupted run's loss bit for bit, continuing one W&B run without gaps or duplicate steps."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixture_run import assert_same_checkpoint, assert_same_log
from tests.recipe_runner import REPO, recipe_env, run_recipe, tiny_config

pytestmark = [pytest.mark.integration, pytest.mark.shared_data]

STEPS = 24
TRAIN = {"steps": STEPS, "log_every": 1, "checkpoint_every": 8, "keep_checkpoints": 3, "warmup_steps": 3,
         "preemption_grace_s": 60.0}


def experiment_copy(data_root: Path, tmp_path: Path, name: str) -> Path:
    """A fresh run root with the prepared stages copied in, and its config."""
    root = tmp_path / name
    for stage in ("corpus", "tokenizer", "shards"):
        shutil.copytree(data_root / "runs" / "tiny" / stage, root / "runs" / "tiny" / stage)
    return tiny_config(root, train=TRAIN)


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss from train_log.jsonl; a step logged twice (before a kill, after resume) keeps the last."""
    out: dict[int, float] = {}
    for line in (run_dir / "train_log.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "train/loss" in record:
            out[record["train/step"]] = record["train/loss"]
    return out


def start(config: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(REPO / "recipes" / "04_pretrain.py"), "--config", str(config)]
    return subprocess.Popen(cmd, cwd=REPO, env=recipe_env(config.parent), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_step(proc: subprocess.Popen[str], run_dir: Path, step: int, checkpoint: int | None = None,
                  timeout: float = 400) -> int:
    """Poll the train log until it reaches ``step`` (and the async save of ``checkpoint`` has landed);
    returns the last logged step."""
    log = run_dir / "train_log.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"training ended early:\n{proc.communicate()[1][-3000:]}"
        # a step counts once its checksums are written (after Orbax's commit): resume skips a step without them
        landed = checkpoint is None or (run_dir / "checkpoints" / str(checkpoint) / "checksums.json").is_file()
        if log.is_file() and landed:
            steps = [json.loads(line)["train/step"] for line in log.read_text(encoding="utf-8").splitlines()
                     if line.strip()]
            if steps and steps[-1] >= step:
                return steps[-1]
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"step {step} not reached in {timeout} s")


def test_kill_and_sigterm_resume_retrace_the_same_losses(data_root: Path, straight_run: Path, tmp_path: Path) -> None:
    straight_cfg = straight_run  # the uninterrupted run (conftest.py: shared with tests/test_checkpoint_integrity.py)
    reference = losses(straight_cfg.parent / "runs" / "tiny")
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert reference[STEPS] < reference[1] - 1.0, "the loss should fall on real Russian text"

    config = experiment_copy(data_root, tmp_path, "interrupted")
    run_dir = config.parent / "runs" / "tiny"

    # 1. SIGKILL after the checkpoint of step 8 has landed: the steps after the latest one are lost
    proc = start(config)
    wait_for_step(proc, run_dir, 10, checkpoint=8)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = max(losses(run_dir))
    landed = max(int(p.parent.name) for p in (run_dir / "checkpoints").glob("*/checksums.json"))
    assert 8 <= landed < killed_at < STEPS - 3

    # 2. resume; SIGTERM a few steps later saves that step and exits 143 within the grace period
    proc = start(config)
    wait_for_step(proc, run_dir, killed_at + 3)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=TRAIN["preemption_grace_s"])
    assert proc.returncode == 143, stderr[-3000:]
    assert time.monotonic() - signalled < TRAIN["preemption_grace_s"]
    assert f"resumed from the checkpoint of step {landed}" in stderr
    preempted_at = max(losses(run_dir))
    assert f"SIGTERM: checkpoint of step {preempted_at} saved" in stderr
    assert (run_dir / "checkpoints" / str(preempted_at)).is_dir()

    # 3. resume to the end
    proc = start(config)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"resumed from the checkpoint of step {preempted_at}" in stderr

    resumed = losses(run_dir)
    assert resumed == reference, "losses after SIGKILL/SIGTERM and resume differ from the uninterrupted run"
    # one log line per step, and every array of the final checkpoint (params, optimizer state, step,
    # RNG) and the loader state as the uninterrupted run's
    assert_same_log(run_dir, straight_cfg.parent / "runs" / "tiny", STEPS)
    assert_same_checkpoint(run_dir, straight_cfg.parent / "runs" / "tiny", STEPS)
    check_wandb_history_continues(run_dir, killed_at)
    # the cost ledger counts each step once: the SIGKILLed session's steps up to its checkpoint too
    from cost.ledger_pricing import summarize_ledger

    ledger = summarize_ledger(run_dir / "ledger")
    assert ledger.sessions == 3 and ledger.last_step == STEPS
    assert ledger.tokens == STEPS * 8 * 64  # train.batch_size x model.max_seq_len of the tiny config
    records = [json.loads(line) for line in (run_dir / "ledger" / "ledger.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["clean"] for r in records if r["e"] == "close"] == [True, True]  # the SIGTERM exit closes clean


def check_wandb_history_continues(run_dir: Path, killed_at: int) -> None:
    """The three local W&B folders are one run id; synced in order (W&B keeps the first value of a
    step and drops later ones), the history is steps 1..STEPS once each."""
    from tracking.readback import find_offline_runs, read_offline_run

    runs = [read_offline_run(d) for d in find_offline_runs(run_dir / "wandb")]
    pretrain = sorted((r for r in runs if r.job_type == "pretrain"), key=lambda r: r.start_time)
    # a folder SIGKILLed before wandb flushed its first block holds no record and is not listed
    assert len(pretrain) in (2, 3) and len({r.run_id for r in pretrain}) == 1
    kept: list[int] = []
    for run in pretrain:
        steps = [int(row["_step"]) for row in run.history]
        assert steps == sorted(set(steps)), "each folder logs increasing steps"
        kept += [s for s in steps if not kept or s > kept[-1]]
    assert kept == list(range(1, STEPS + 1))
    # wandb writes offline history in blocks: the SIGKILLed folder may have kept none of it, and the
    # resumed session re-logs what is missing up to its checkpoint (tracking.history.backfill_offline_history)
    if len(pretrain) == 3:
        assert all(int(row["_step"]) <= killed_at for row in pretrain[0].history)


def test_damaged_shard_stops_the_run_or_is_skipped_record_by_record(data_root: Path, tmp_path: Path) -> None:
    """A byte flipped in every record of a train shard: one error line naming the shard (its sha256 or a
    record's CRC, whichever the loader meets first); under shards.on_corrupt=skip each skipped record is
    logged with file and offset, counted in train_log.jsonl, and the run finishes."""
    from data_prep.shards.tfrecord import read_index
    from tests.recipe_runner import error_line

    config = experiment_copy(data_root, tmp_path, "damaged")
    shards = config.parent / "runs" / "tiny" / "shards"
    manifest = json.loads((shards / "manifest.json").read_text(encoding="utf-8"))
    shard = shards / manifest["splits"]["train"]["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    for offset in read_index(shard):
        data[int(offset) + 12 + 4] ^= 0x01  # inside each record's payload
    shard.write_bytes(bytes(data))

    stopped = run_recipe("04_pretrain.py", config, "train.steps=8", check=False)
    assert stopped.returncode == 2 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert error_line(stopped).startswith("error: ") and str(shard) in error_line(stopped)

    skipped = run_recipe("04_pretrain.py", config, "train.steps=8", "shards.on_corrupt=skip")
    named = [line for line in skipped.stderr.splitlines() if "skipped (shards.on_corrupt=skip)" in line]
    assert named and all(f"{shard}: corrupt TFRecord record" in line and "byte offset" in line for line in named)
    assert skipped.stderr.count(f"shard {shard} does not match its manifest") == 1
    last = json.loads((config.parent / "runs" / "tiny" / "train_log.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert last["train/step"] == 8 and last["data/skipped_records"] == len(named)
