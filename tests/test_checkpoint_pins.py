"""Readers and checkpoint rotation: a step being read is pinned, a step rotated away before the pin is replaced
by the newest one in one line, and no message tells the user to delete a healthy run's checkpoints.

A real training manager (``open_manager`` with ``train.keep_checkpoints=1``) saves beside a real read-only
one (what recipes 05, 05b, 05c, 09 and a branch open); the save that rotates a step runs at a chosen
moment of the read (between listing and reading, or inside the read), so each race is deterministic.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from experiment.sections.train import TrainConfig
from experiment.storage import RunPath
from trainer import checkpoint
from trainer.checkpoint_integrity import CheckpointRotated, committed, restore_verified
from trainer.checkpoint_pins import PINS_DIR, pinned_steps

TRAINING = dataclasses.replace(TrainConfig(), keep_checkpoints=1, async_checkpointing=False)


def save_step(manager: ocp.CheckpointManager, step: int) -> None:
    """A checkpoint of ``step`` whose parameters are all ``step`` (so a read tells which step it got)."""
    state = {"params": {"w": jnp.full((4,), float(step))}, "opt_state": {"m": jnp.zeros((4,))},
             "step": jnp.asarray(step), "rng": jnp.zeros((2,), jnp.uint32)}
    checkpoint.save(manager, step, state, {"position": step}, {"step": step}, {"step": step})
    manager.wait_until_finished()


def params_reader(manager: ocp.CheckpointManager, during: Any = None) -> Any:
    """``read(step)`` as the trained-model loader does it (the parameters alone); ``during()`` runs after the
    reader has chosen and pinned its step, before it reads a byte of it."""
    def read(step: int) -> float:
        if during is not None:
            during()
        target = {"w": jax_struct()}
        restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))
        return float(np.asarray(restored["params"]["w"])[0])

    return read


def jax_struct() -> Any:
    import jax

    return jax.ShapeDtypeStruct((4,), jnp.float32)


def steps_on_disk(directory: RunPath) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and committed(p))


@pytest.fixture
def directory(any_root: RunPath) -> RunPath:
    """A run's checkpoint folder on each backend (a disk, a GCS bucket, an S3 bucket)."""
    return any_root / "checkpoints"


@pytest.fixture
def training(directory: RunPath) -> Iterator[ocp.CheckpointManager]:
    """A training run's manager with steps 1 and 2 saved (only step 2 kept)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "wandb_run.json").write_text('{"run_id": "x"}\n')  # recipe 04 writes it before its first save
    manager = checkpoint.open_manager(directory, TRAINING)
    save_step(manager, 1)
    save_step(manager, 2)
    assert steps_on_disk(directory) == [2]
    yield manager
    manager.close()


def test_a_step_being_read_is_kept_by_the_training_runs_rotation(training: Any, directory: RunPath,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    reader = checkpoint.open_manager(directory)
    try:
        step, value, damaged = restore_verified(reader, params_reader(reader, lambda: save_step(training, 3)))
    finally:
        reader.close()
    assert (step, value, damaged) == (2, 2.0, [])
    assert steps_on_disk(directory) == [2, 3], "the pinned step outlived the save that would have rotated it"
    assert not (directory / PINS_DIR).exists(), "the pin is removed when the read is done"
    save_step(training, 4)  # unpinned now: the next save rotates it as usual
    assert steps_on_disk(directory) == [4]
    assert "delete" not in caplog.text


def test_a_step_rotated_before_the_read_gives_the_newest_in_one_line(training: Any, directory: RunPath,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    reader = checkpoint.open_manager(directory)  # lists step 2 now
    save_step(training, 3)  # the trainer rotates step 2 away before the reader opens it
    caplog.set_level(logging.WARNING, logger="trainer.checkpoint")
    try:
        step, value, damaged = restore_verified(reader, params_reader(reader))
    finally:
        reader.close()
    assert (step, value, damaged) == (3, 3.0, [])
    assert [r.getMessage() for r in caplog.records] == [
        "checkpoint step 2 was removed by its run's checkpoint rotation (train.keep_checkpoints) while this was "
        "loading it: loading step 3"]


def test_a_given_step_rotated_away_is_one_line_that_never_advises_deleting(training: Any, directory: RunPath) -> None:
    reader = checkpoint.open_manager(directory)
    save_step(training, 3)
    try:
        with pytest.raises(CheckpointRotated) as caught:
            restore_verified(reader, params_reader(reader), [2])
    finally:
        reader.close()
    assert str(caught.value) == (
        f"checkpoint step 2 of {directory} was removed by its run's checkpoint rotation (train.keep_checkpoints) "
        "before it could be read: choose a step the run keeps (there now: 3)")


def test_a_pin_left_by_a_dead_reader_keeps_nothing(training: Any, directory: RunPath) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    (directory / PINS_DIR).mkdir(parents=True, exist_ok=True)  # nothing to make in a bucket
    record = {"step": 2, "host": socket.gethostname(), "pid": int(dead.stdout), "since": time.time()}
    (directory / PINS_DIR / f"2.{socket.gethostname()}.{dead.stdout.strip()}.x.json").write_text(json.dumps(record))
    alive = {**record, "pid": os.getpid(), "since": time.time() - 7 * 3600}  # a reader at work for 7 hours
    (directory / PINS_DIR / f"2.{socket.gethostname()}.{os.getpid()}.y.json").write_text(json.dumps(alive))
    assert pinned_steps(directory) == set()
    save_step(training, 3)
    assert steps_on_disk(directory) == [3]


def test_a_pin_file_nested_too_deep_is_no_pin(tmp_path: Any) -> None:
    """A planted pin of 100,000 nested lists was a RecursionError (not an OSError or ValueError) out of Orbax's
    preservation policy, at the training run's next save; now it is an unreadable pin: it keeps nothing."""
    pins = tmp_path / PINS_DIR
    pins.mkdir()
    (pins / f"2.{socket.gethostname()}.{os.getpid()}.z.json").write_text("[" * 100_000 + "]" * 100_000)
    assert pinned_steps(tmp_path) == set()
