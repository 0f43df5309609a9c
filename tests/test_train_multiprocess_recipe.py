"""Recipe 04 as two processes (jax.distributed on the CPU, gloo collectives, one device each), killed
after a checkpoint and resumed, against one process holding both devices, on the fixture corpus.

What is compared, and how exactly:
- W&B: one run, opened by process 0 only (one local folder per session, both of that run's id);
- the logged step sequence (each step once, process 0 writes the log) and the learning rate: equal;
- the step counter, the loader position and the meta: equal;
- every array of the final checkpoint (params, optimizer state, RNG): the RNG key bitwise; params and
  optimizer state within a tolerance, not bitwise. Both runs shard the global batch of 8 rows over 2
  devices, but one process puts rows 0-3 on device 0 while two processes each feed the rows their
  loader owns (every second record, as on a multi-host slice), so each device sums a different set of
  rows before the all-reduce: the same sums in another order, which float32 rounds differently
  (measured on this 24-step run: at most 2.4e-7 apart on any array). AdamW divides by sqrt(nu), which
  can grow such a difference on a near-zero gradient entry, hence rtol 1e-4 plus atol 1e-6.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.fixture_run import checkpoint_contents, log_records, run_copy
from tests.recipe_runner import recipe_env, start_pretrain
from tracking.readback import run_id_of

pytestmark = pytest.mark.integration

STEPS = 24
SECTIONS = {"train": {"steps": STEPS, "log_every": 1, "checkpoint_every": 4, "keep_checkpoints": 3, "warmup_steps": 2},
            "wandb": {"mode": "offline"}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env_for(config: Path, devices: int, **extra: str) -> dict[str, str]:
    env = recipe_env(config.parent)
    env.pop("XLA_FLAGS", None)
    return {**env, "JAX_NUM_CPU_DEVICES": str(devices), **extra}


def start_pair(config: Path, logs: Path, name: str) -> list[subprocess.Popen[bytes]]:
    """Two processes of one jax.distributed job on this host."""
    port = free_port()
    return [start_pretrain(config, logs / f"{name}-{i}.err", "train.distributed=true",
                           env=env_for(config, 1, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                       JAX_PROCESS_ID=str(i))) for i in range(2)]


def finish(procs: list[subprocess.Popen[bytes]], logs: Path, name: str) -> None:
    try:
        for i, proc in enumerate(procs):
            assert proc.wait(timeout=300) == 0, (logs / f"{name}-{i}.err").read_text()[-3000:]
    finally:
        kill(procs)  # a process whose peer failed waits for it in a collective


def kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)


def test_two_processes_with_a_kill_and_resume_train_like_one_process(fixture_stages: Path, tmp_path: Path) -> None:
    single = run_copy(fixture_stages, tmp_path / "single", **SECTIONS)
    finish([start_pretrain(single, tmp_path / "single.err", env=env_for(single, 2))], tmp_path, "single")

    config = run_copy(fixture_stages, tmp_path / "pair", **SECTIONS)
    run_dir = config.parent / "runs" / "tiny"
    procs = start_pair(config, tmp_path, "first")
    deadline = time.monotonic() + 300
    try:
        while not (run_dir / "checkpoints" / "8" / "checksums.json").is_file():
            assert all(p.poll() is None for p in procs), (tmp_path / "first-0.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "checkpoint 8 never landed"
            time.sleep(0.01)
    finally:
        kill(procs)
    assert len(log_records(run_dir)) < STEPS, "killed before the end"

    finish(start_pair(config, tmp_path, "resumed"), tmp_path, "resumed")
    resumed_err = (tmp_path / "resumed-0.err").read_text()
    assert "process 0 of 2, 1 local / 2 global devices" in resumed_err
    assert "resumed from the checkpoint of step" in resumed_err
    # exactly one W&B run: process 0 opened it in each session (the resumed one continues it), process 1 never did
    folders = sorted(p for p in (run_dir / "wandb").rglob("offline-run-*") if p.is_dir())
    assert len(folders) == 2 and len({run_id_of(p) for p in folders}) == 1, folders
    for session in ("first", "resumed"):
        assert "W&B run " in (tmp_path / f"{session}-0.err").read_text()
        assert "W&B run " not in (tmp_path / f"{session}-1.err").read_text()

    records, reference = log_records(run_dir), log_records(single.parent / "runs" / "tiny")
    assert [r["train/step"] for r in records] == [r["train/step"] for r in reference] == list(range(1, STEPS + 1))
    assert [r["train/lr"] for r in records] == [r["train/lr"] for r in reference]
    np.testing.assert_allclose([r["train/loss"] for r in records], [r["train/loss"] for r in reference], rtol=1e-5)

    arrays, items = checkpoint_contents(run_dir, STEPS)
    want, want_items = checkpoint_contents(single.parent / "runs" / "tiny", STEPS)
    assert sorted(arrays) == sorted(want)
    assert items["loader"]["next_global_batch"] == want_items["loader"]["next_global_batch"] == STEPS
    assert (items["loader"]["process_count"], want_items["loader"]["process_count"]) == (2, 1)
    # the NaN guard's measured losses are the step losses above, summed over other devices: equal to rounding
    assert ({k: v for k, v in items["meta"].items() if k not in ("wandb_run_id", "guard")}
            == {k: v for k, v in want_items["meta"].items() if k not in ("wandb_run_id", "guard")})
    measured, want_measured = items["meta"]["guard"]["measured"], want_items["meta"]["guard"]["measured"]
    assert sorted(measured) == sorted(want_measured)
    np.testing.assert_allclose([measured[s] for s in sorted(measured)], [want_measured[s] for s in sorted(measured)],
                               rtol=1e-5)
    for name in ("train['step']", "train['rng']"):
        assert arrays[name].tobytes() == want[name].tobytes(), name
    worst = {}
    for name, value in arrays.items():
        np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-6, err_msg=name)
        if value.dtype.kind == "f":
            worst[name] = float(np.max(np.abs(value - want[name])))
    print("largest absolute difference from one process:", max(worst.values()), max(worst, key=worst.get))
