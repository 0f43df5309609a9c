"""Recipe 04 on real text: the tiny experiment's train section and run copies shared with
tests/test_pipeline.py (its SIGKILL / SIGTERM + resume chain, retracing conftest.py's ``straight_run`` bit
for bit) and tests/test_checkpoint_integrity.py, and a damaged shard."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.recipe_runner import (
    logged_steps,
    read_train_log,
    run_recipe,
    tiny_config,
)

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
    return {record["train/step"]: record["train/loss"] for record in read_train_log(run_dir) if "train/loss" in record}


def step_reached(run_dir: Path, step: int, checkpoint: int | None = None) -> Callable[[], bool]:
    """Whether the train log reached ``step`` (and the async save of ``checkpoint`` has landed)."""
    def ready() -> bool:
        # a step counts once its checksums are written (after Orbax's commit): resume skips a step without them
        landed = checkpoint is None or (run_dir / "checkpoints" / str(checkpoint) / "checksums.json").is_file()
        steps = logged_steps(run_dir)
        return landed and bool(steps) and steps[-1] >= step
    return ready


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
    last = read_train_log(config.parent / "runs" / "tiny")[-1]
    assert last["train/step"] == 8 and last["data/skipped_records"] == len(named)
