"""Whole runs whose folder is a bucket (gs:// on fake-gcs-server, s3:// on moto, both on loopback): the recipe
chain with nothing written under the local run root, two JAX processes sharing nothing but the bucket killed and
resumed, two trainers of one run, a kill during a checkpoint save. Each is compared with the same run on a disk,
bit for bit."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cost.ledger_format import read_sessions
from cost.ledger_pricing import summarize_ledger
from experiment.files import publish_dir
from experiment.storage import BucketPath, location
from tests.fault_proxy import FaultProxy
from tests.fixture_run import DETERMINISTIC_KEYS, FIXTURE_TEXTS, PRETRAINED_TRAIN, fixture_config, log_records, run_copy
from tests.recipe_runner import (
    error_line,
    in_process_devices,
    recipe_env,
    run_recipe,
    signal_when,
    start_pretrain,
    wait_until,
)
from tests.test_train_multiprocess_recipe import env_for, finish, free_port, kill
from tracking.readback import run_id_of

pytestmark = pytest.mark.integration

CHAIN = ("01_build_corpus.py", "02_train_tokenizer.py", "03_shard.py", "04_pretrain.py", "05_evaluate.py",
         "06_compare_costs.py", "07_plan_costs.py", "09_generate.py")


def same_log(records: list[dict[str, Any]], reference: list[dict[str, Any]], steps: int) -> None:
    assert [r["train/step"] for r in records] == list(range(1, steps + 1)), "each step logged once, in order"
    for key in DETERMINISTIC_KEYS:
        assert [r[key] for r in records] == [r[key] for r in reference], key


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def bucket_run(storage_servers: Any, scheme: str, fixture_stages: Path, name: str = "tiny") -> tuple[str, BucketPath]:
    """A fresh bucket's run root, and its run ``name`` holding the prepared stages, uploaded as recipes 01-03 would
    write them."""
    root = f"{storage_servers.new_bucket(scheme)}/runs"
    run = location(root) / name
    assert isinstance(run, BucketPath)
    for stage in ("corpus", "tokenizer", "shards"):
        publish_dir(fixture_stages / "runs" / "tiny" / stage, run / stage)
    return root, run


def through(proxy: FaultProxy, scheme: str, config: Path) -> dict[str, str]:
    """A recipe's environment pointing its storage clients at ``proxy``, with as many devices as the runs of this
    process (the reference runs it is compared with bit for bit)."""
    endpoint_var = "STORAGE_EMULATOR_HOST" if scheme == "gs" else "AWS_ENDPOINT_URL"
    return {**recipe_env(config.parent, devices=in_process_devices()), endpoint_var: proxy.url,
            "TENSORSTORE_GCS_HTTP_URL": proxy.url}


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_the_chain_in_a_bucket_leaves_the_local_run_root_empty_and_trains_as_on_disk(
        scheme: str, storage_servers: Any, fixture_pretrained: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Recipes 01-07 and 09 with ``experiment.run_root`` a bucket URL: every output is in the bucket, the
    config's own folder gets nothing (W&B's files go to the host's local root), and the losses are those of the
    same run on a disk (``fixture_pretrained``), bit for bit."""
    monkeypatch.setenv("RU_PRETRAIN_LOCAL", str(tmp_path / "host"))
    config = fixture_config(tmp_path / "config", train=PRETRAINED_TRAIN)
    root = f"{storage_servers.new_bucket(scheme)}/runs"
    for script in CHAIN:
        run_recipe(script, config, f"experiment.run_root={root}")
    assert files_under(config.parent) == ["tiny.yaml"], "nothing under the local run root"
    run = location(root) / "tiny"
    assert isinstance(run, BucketPath)
    same_log(log_records(run), log_records(fixture_pretrained.parent / "runs" / "tiny"), PRETRAINED_TRAIN["steps"])
    objects = run.list_objects()
    for name in ("corpus/manifest.json", "tokenizer/manifest.json", "shards/manifest.json", "checkpoints/6/checksums.json",
                 "eval/manifest.json", "eval/step_0000006.json", "reports/costs.csv", "reports/plan.csv",
                 "config.resolved.yaml", "checkpoints/wandb_run.json"):
        assert name in objects, name
    assert any(name.startswith("generate/") and name.endswith(".jsonl") for name in objects)
    assert any(name.startswith("ledger/ledger.jsonl.segments/") for name in objects), "the ledger's segments"
    sessions = read_sessions(run / "ledger")
    assert sum(batch.tokens for s in sessions for batch in s.tokens) == PRETRAINED_TRAIN["steps"] * 8 * 64
    assert (tmp_path / "host" / scheme).is_dir(), "W&B's offline files stay on the host's disk"


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


def test_a_second_trainer_of_a_run_in_a_bucket_stops_with_one_line_and_a_killed_ones_lock_is_taken_over(
        storage_servers: Any, fixture_stages: Path, tmp_path: Path) -> None:
    root, run = bucket_run(storage_servers, "gs", fixture_stages)
    config = fixture_config(tmp_path / "config", train={"steps": 100_000, "checkpoint_every": 100_000})  # runs until killed
    first = start_pretrain(config, tmp_path / "first.err", f"experiment.run_root={root}")
    try:
        deadline = time.monotonic() + 300
        while not log_records(run):
            assert first.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = run_recipe("04_pretrain.py", config, f"experiment.run_root={root}", check=False)
        assert second.returncode == 2
        assert error_line(second) == (
            f"error: {run} is already running recipes/04_pretrain.py (host {json.loads((run / '.locks' / 'pretrain.lock').read_text())['host']}, "
            f"pid {first.pid}, since {json.loads((run / '.locks' / 'pretrain.lock').read_text())['since']}): wait "
            "for it to finish or stop it before writing its pretrain output")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert (run / ".locks" / "pretrain.lock").is_file(), "a killed holder leaves its lock object"
    taken = run_recipe("04_pretrain.py", config, f"experiment.run_root={root}", "train.steps=2", "train.warmup_steps=1")
    assert "taking over the lock" in taken.stderr and f"pid {first.pid}" in taken.stderr
    assert not (run / ".locks" / "pretrain.lock").exists(), "released at the end"


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
    assert injected >= 10, f"only {injected} faults reached the run"
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


def test_another_experiments_data_in_a_bucket_is_read_through_link_files_and_left_untouched(
        storage_servers: Any, fixture_stages: Path, tmp_path: Path) -> None:
    """``experiment.data_from`` in a bucket: the run's corpus/tokenizer/shards are link files naming the other
    run's folders (a bucket has no symlinks), recipe 04 trains on them, recipe 03 refuses to write through them,
    and not one object of the other run changes."""
    root = f"{storage_servers.new_bucket('s3')}/runs"
    data = location(root) / "tiny"
    for stage in ("corpus", "tokenizer", "shards"):
        publish_dir(fixture_stages / "runs" / "tiny" / stage, data / stage)
    (data / "config.resolved.yaml").write_text("{}\n")  # what marks a run folder
    before = {name: found.checksum for name, found in data.list_objects().items()}
    config = fixture_config(tmp_path / "config", train={"steps": 2, "warmup_steps": 1, "checkpoint_every": 2})
    reader = [f"experiment.run_root={root}", "experiment.name=reader", "experiment.data_from=tiny"]
    run_recipe("04_pretrain.py", config, *reader)
    run = location(root) / "reader"
    for stage in ("corpus", "tokenizer", "shards"):
        assert json.loads((run / f"{stage}.link").read_text()) == {"target": str(data / stage)}
    assert log_records(run) and (run / "checkpoints" / "2" / "checksums.json").is_file()
    refused = run_recipe("03_shard.py", config, f"experiment.run_root={root}", "experiment.name=reader", check=False)
    assert refused.returncode == 2 and "is a link to" in error_line(refused) and "read-only" in error_line(refused)
    after = {name: found.checksum for name, found in data.list_objects().items() if not name.startswith(".locks/")}
    assert after == before, "the other run's folder is as it was"


@pytest.mark.tools("s3fs", "fusermount")
def test_a_run_folder_on_a_fuse_mount_of_a_bucket_is_refused_in_one_line_and_inputs_through_it_are_read(
        storage_servers: Any, tmp_path: Path) -> None:
    """A real s3fs-fuse mount of a bucket on moto: a run folder there would look like a disk and break its
    guarantees (locks per mount, renames copying objects), so recipe 01 refuses it with one line naming the mount
    and what to use instead, writing nothing; the same mount as a corpus source (read only) is fine."""
    bucket = storage_servers.new_bucket("s3")
    texts = sorted(FIXTURE_TEXTS.glob("ru_*.txt"))
    for text in texts:
        (location(bucket) / "texts" / text.name).write_bytes(text.read_bytes())
    mount = tmp_path / "mnt"
    mount.mkdir()
    passwd = tmp_path / "s3fs-passwd"
    passwd.write_text("test-key:test-secret\n")
    passwd.chmod(0o600)
    subprocess.run(["s3fs", bucket.removeprefix("s3://"), str(mount), "-o", f"passwd_file={passwd}",
                    "-o", f"url={storage_servers.s3_endpoint}", "-o", "use_path_request_style"], check=True, timeout=60)
    try:
        deadline = time.monotonic() + 30
        while not (mount / "texts" / texts[0].name).is_file():
            assert time.monotonic() < deadline, "the s3fs mount never showed the bucket"
            time.sleep(0.2)
        config = fixture_config(tmp_path / "config")
        refused = run_recipe("01_build_corpus.py", config, f"experiment.run_root={mount}/runs", check=False)
        assert refused.returncode == 2
        assert error_line(refused) == (
            f"error: {mount}/runs/tiny is on a s3fs mount of s3fs ({mount}): a run folder there breaks locks, "
            "renames and durable appends; set experiment.run_root to the bucket's URL (gs://bucket/prefix or "
            "s3://bucket/prefix) instead (docs/launch.md, buckets and mounts)")
        assert not (mount / "runs").exists(), "nothing written"
        source = [f"corpus.sources=[{{kind: files, name: mounted, paths: ['{mount}/texts/*.txt']}}]",
                  f"experiment.run_root={tmp_path / 'runs'}"]
        run_recipe("01_build_corpus.py", config, *source)
        assert json.loads((tmp_path / "runs" / "tiny" / "corpus" / "manifest.json").read_text())["documents"] > 0
    finally:
        subprocess.run(["fusermount", "-u", str(mount)], check=False, timeout=60)


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_corpus_sources_in_a_bucket_are_listed_and_read_by_the_local_runner(
        scheme: str, storage_servers: Any, tmp_path: Path) -> None:
    """``corpus.sources[].paths`` as a bucket glob, and as a prefix of .txt objects: the same documents as the
    same files on a disk."""
    bucket = location(storage_servers.new_bucket(scheme))
    for text in sorted(FIXTURE_TEXTS.glob("ru_*.txt")):
        (bucket / "texts" / text.name).write_bytes(text.read_bytes())
    config = fixture_config(tmp_path / "config")
    run_recipe("01_build_corpus.py", config, f"experiment.run_root={tmp_path / 'disk'}")
    for paths, name in ((f"{bucket}/texts/ru_*.txt", "glob"), (f"{bucket}/texts", "prefix")):
        run_recipe("01_build_corpus.py", config, f"experiment.run_root={tmp_path / name}",
                   f"corpus.sources=[{{kind: files, name: fixture, paths: ['{paths}']}}]")
        got = json.loads((tmp_path / name / "tiny" / "corpus" / "manifest.json").read_text())
        want = json.loads((tmp_path / "disk" / "tiny" / "corpus" / "manifest.json").read_text())
        assert got["documents"] == want["documents"] > 0
        assert [s["sha256"] for s in got["shards"]] == [s["sha256"] for s in want["shards"]], name
