"""Runs in a bucket that are interrupted: two JAX processes sharing nothing but the bucket, killed and resumed; a
kill during a checkpoint save; a storage server failing now and then, and an outage. Each resumed run's log equals an
undisturbed run's bit for bit."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cost.ledger_pricing import summarize_ledger
from experiment.files import publish_dir
from experiment.storage import location
from tests.bucket_run import bucket_run, same_log, through
from tests.fault_proxy import FaultProxy
from tests.fixture_run import fixture_config, log_records, run_copy
from tests.recipe_runner import run_recipe, signal_when, start_pretrain, wait_until
from tests.test_train_multiprocess_recipe import env_for, finish, free_port, kill
from tracking.readback import run_id_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a quarter of the base suite's work


SECTIONS = {"train": {"steps": 16, "log_every": 1, "checkpoint_every": 4, "keep_checkpoints": 3, "warmup_steps": 2},
            "wandb": {"mode": "offline"}}


def start_hosts(config: Path, root: str, logs: Path, session: str) -> list[subprocess.Popen[bytes]]:
    """Two processes of one jax.distributed job, each as on a VM of its own: an empty home, an empty host-local
    root, nothing shared but the bucket (and the coordinator's port)."""
    port = free_port()
    procs = []
    for index in range(2):
        home = logs / f"{session}-host-{index}"
        home.mkdir(parents=True)
        env = env_for(config, 1, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                      JAX_PROCESS_ID=str(index), HOME=str(home), RU_PRETRAIN_LOCAL=str(home / "local"))
        procs.append(start_pretrain(config, logs / f"{session}-{index}.err", "train.distributed=true",
                                    f"experiment.run_root={root}", env=env))
    return procs


@pytest.fixture(scope="module")
def pair_on_disk(fixture_stages: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted two-process run on a disk: the reference a bucket pair must match bit for bit (the same
    rows on the same devices, summed in the same order)."""
    root = tmp_path_factory.mktemp("pair-on-disk")
    config = run_copy(fixture_stages, root, **SECTIONS)
    port = free_port()
    procs = [start_pretrain(config, root / f"ref-{i}.err", "train.distributed=true",
                            env=env_for(config, 1, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                        JAX_PROCESS_ID=str(i))) for i in range(2)]
    finish(procs, root, "ref")
    return root / "runs" / "tiny"


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_two_hosts_sharing_only_a_bucket_resume_after_a_kill_bit_for_bit(
        scheme: str, storage_servers: Any, fixture_stages: Path, pair_on_disk: Path, tmp_path: Path) -> None:
    root = f"{storage_servers.new_bucket(scheme)}/runs"
    run = location(root) / "tiny"
    for stage in ("corpus", "tokenizer", "shards"):  # the prepared stages, uploaded as recipes 01-03 would write them
        publish_dir(fixture_stages / "runs" / "tiny" / stage, run / stage)
    config = fixture_config(tmp_path / "config", **SECTIONS)
    procs = start_hosts(config, root, tmp_path, "first")
    deadline = time.monotonic() + 300
    try:
        while not (run / "checkpoints" / "8" / "checksums.json").is_file():
            assert all(p.poll() is None for p in procs), (tmp_path / "first-0.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "checkpoint 8 never landed"
            time.sleep(0.05)
    finally:
        kill(procs)  # SIGKILL: no cleanup, no flush
    assert len(log_records(run)) < SECTIONS["train"]["steps"], "killed before the end"
    finish(start_hosts(config, root, tmp_path, "resumed"), tmp_path, "resumed")
    assert "resumed from the checkpoint of step" in (tmp_path / "resumed-0.err").read_text()

    same_log(log_records(run), log_records(pair_on_disk), SECTIONS["train"]["steps"])
    summary = json.loads((run / "checkpoints" / "wandb_run.json").read_text())
    folders = sorted(p for p in tmp_path.glob("*-host-0/local/**/offline-run-*") if p.is_dir())
    assert len(folders) == 2 and {run_id_of(p) for p in folders} == {summary["run_id"]}, folders
    assert not list(tmp_path.glob("*-host-1/local/**/offline-run-*")), "process 1 opens no W&B run"
    # the killed session's steps after its last checkpoint were trained again: counted once
    assert summarize_ledger(run / "ledger").tokens == SECTIONS["train"]["steps"] * 8 * 64, "the ledger's tokens exact"


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_a_kill_during_a_checkpoint_save_in_a_bucket_leaves_nothing_a_restore_trusts(
        scheme: str, storage_servers: Any, fixture_stages: Path, tmp_path: Path) -> None:
    """SIGKILL while step 8 is being written (its objects appear, its commit marker not yet): the resumed run
    restores step 4, trains again, and its log equals an uninterrupted run's."""
    sections = {"train": {"steps": 12, "checkpoint_every": 4, "log_every": 1, "warmup_steps": 1,
                          "async_checkpointing": False}}
    reference = run_copy(fixture_stages, tmp_path / "disk", **sections)
    run_recipe("04_pretrain.py", reference)
    root, run = bucket_run(storage_servers, scheme, fixture_stages)
    config = fixture_config(tmp_path / "config", **sections)

    def saving_step_8() -> bool:
        names = (run / "checkpoints").list_objects()
        return any(n.startswith("8/") for n in names) and "8/commit_success.txt" not in names

    # the killed run talks to the storage through a proxy adding 50 ms per request: a save of step 8 takes seconds,
    # so the kill lands inside it, not before or after it
    with FaultProxy(storage_servers.endpoint(scheme), flavor="gcs" if scheme == "gs" else "s3", latency=0.05) as slow:
        proc = start_pretrain(config, tmp_path / "killed.err", f"experiment.run_root={root}",
                              env=through(slow, scheme, config))
        signal_when(proc, saving_step_8, poll_s=0.01, output=tmp_path / "killed.err")
    names = (run / "checkpoints").list_objects()
    assert any(n.startswith("8/") for n in names) and "8/commit_success.txt" not in names, "killed mid-save"
    resumed = run_recipe("04_pretrain.py", config, f"experiment.run_root={root}")
    assert "resumed from the checkpoint of step 4" in resumed.stderr, resumed.stderr[-3000:]
    same_log(log_records(run), log_records(reference.parent / "runs" / "tiny"), sections["train"]["steps"])


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_a_storage_server_failing_now_and_then_costs_retries_not_data(
        scheme: str, storage_servers: Any, fixture_stages: Path, tmp_path: Path) -> None:
    """Recipe 04 through a proxy that keeps injecting faults (503s, 429s, connections dropped after the server
    acted, answers cut mid-body) for the whole run: it finishes, and its log equals an undisturbed run's."""
    sections = {"train": {"steps": 12, "checkpoint_every": 4, "log_every": 1, "warmup_steps": 1}}
    reference = run_copy(fixture_stages, tmp_path / "disk", **sections)
    run_recipe("04_pretrain.py", reference)
    root, run = bucket_run(storage_servers, scheme, fixture_stages)
    config = fixture_config(tmp_path / "config", **sections)
    with FaultProxy(storage_servers.endpoint(scheme), flavor="gcs" if scheme == "gs" else "s3") as flaky:
        stop = threading.Event()

        # fake-gcs-server answers 404 to a resumable upload's chunk sent again after its answer was lost (GCS
        # answers 200: tests/test_storage_faults.py): answers of those requests are not dropped on gs
        lossy = r"^(?!.*upload_id=)" if scheme == "gs" else None

        def storms() -> None:
            # every 2 s, for half a second, the next few requests meet one fault each (a storm that never ends is
            # an outage: below); rules last half a second, so faults never pile up on a quiet spell
            while not stop.wait(2.0):
                flaky.fail(503, count=2, seconds=0.5)
                flaky.fail(429, count=1, seconds=0.5)
                flaky.drop(when="response", count=1, seconds=0.5, path=lossy)
                flaky.cut(at=0.5, count=1, method="GET", seconds=0.5)

        thread = threading.Thread(target=storms, daemon=True)
        thread.start()
        try:
            proc = start_pretrain(config, tmp_path / "flaky.err", f"experiment.run_root={root}",
                                  env=through(flaky, scheme, config))
            assert proc.wait(timeout=600) == 0, (tmp_path / "flaky.err").read_text()[-4000:]
        finally:
            stop.set()
            thread.join()
        injected = flaky.injected
    # faults did reach the run (storms come every 2 s: a dozen-second run on a fast machine meets 5-15 of them; a
    # storm that never ends is an outage, a test of its own below)
    assert injected >= 5, f"only {injected} faults reached the run"
    same_log(log_records(run), log_records(reference.parent / "runs" / "tiny"), sections["train"]["steps"])
    assert summarize_ledger(run / "ledger").tokens == sections["train"]["steps"] * 8 * 64


def test_a_storage_outage_stops_the_run_with_one_line_and_a_rerun_resumes_exactly(
        storage_servers: Any, fixture_stages: Path, tmp_path: Path) -> None:
    """Once checkpoint 4 is in the bucket, every request fails (503) until the run gives up: it stops with one
    line naming the storage; the same command, once the storage answers, resumes and gives an undisturbed run's
    log."""
    # a constant schedule: the run that stops (10,000 steps planned) and the reference (12) train at the same rates
    sections = {"train": {"steps": 10_000, "checkpoint_every": 4, "log_every": 1, "warmup_steps": 1,
                          "schedule": "constant"}}
    reference = run_copy(fixture_stages, tmp_path / "disk", train={**sections["train"], "steps": 12})
    run_recipe("04_pretrain.py", reference)
    root, run = bucket_run(storage_servers, "gs", fixture_stages)
    config = fixture_config(tmp_path / "config", **sections)
    with FaultProxy(storage_servers.endpoint("gs"), flavor="gcs") as proxy:
        proc = start_pretrain(config, tmp_path / "outage.err", f"experiment.run_root={root}",
                              env=through(proxy, "gs", config))
        wait_until(proc, lambda: (run / "checkpoints" / "4" / "checksums.json").is_file(),
                   output=tmp_path / "outage.err")
        proxy.fail(503, seconds=900)
        started = time.monotonic()
        code = proc.wait(timeout=600)
        gave_up_after = time.monotonic() - started
    err = (tmp_path / "outage.err").read_text()
    assert code == 2, err[-3000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith(f"error: storage at {run} (at http://127.0.0.1:") and "failed after retries" in last, last
    print(f"gave up {gave_up_after:.0f} s into the outage")
    resumed = run_recipe("04_pretrain.py", config, f"experiment.run_root={root}", "train.steps=12")
    assert "resumed from the checkpoint of step" in resumed.stderr
    same_log(log_records(run), log_records(reference.parent / "runs" / "tiny"), 12)
