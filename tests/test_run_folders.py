"""A run folder nobody else can damage: one writer per stage (experiment/lock.py), linked stages read-only
(experiment/links.py), ``experiment.data_from`` for any run, and the inputs a stage trusts verified."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from experiment.errors import ConfigError, DataError
from experiment.lock import BusyError, hold, lock_path, stage_lock
from experiment.runfolder import RunFolder
from experiment.stages import CORPUS, EVAL, PRETRAIN, SHARDS

REPO = Path(__file__).resolve().parents[1]


def holder_record(host: str, pid: int, renewed: float) -> str:
    return json.dumps({"host": host, "pid": pid, "since": "2026-01-01T00:00:00+00:00", "renewed": renewed,
                       "stage": "shards"})


# ---- locks (unit: no recipe) ----

def test_a_second_writer_or_a_reader_of_a_stage_being_written_is_one_line_naming_the_holder(tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "x")
    with stage_lock(run, SHARDS):
        for stage, doing in ((SHARDS, "writing"), (PRETRAIN, "reading")):
            with pytest.raises(BusyError) as caught, stage_lock(run, stage):
                pass
            assert str(caught.value) == (
                f"{run.root} is already running recipes/03_shard.py (host {socket.gethostname()}, pid {os.getpid()}, "
                f"since {json.loads(lock_path(run, 'shards').read_text())['since']}): wait for it to finish or stop "
                f"it before {doing} its shards output")
    with stage_lock(run, PRETRAIN), pytest.raises(BusyError, match="a running stage reads its shards output"), \
            stage_lock(run, SHARDS):
        pass  # recipe 03 never rewrites the shards recipe 04 trains on
    assert lock_path(run, "shards").read_text() == "", "a released lock names no holder"
    with stage_lock(run, PRETRAIN), stage_lock(run, EVAL):
        pass  # recipe 05 evaluates the checkpoints recipe 04 is saving: both only read the shards


@pytest.mark.integration
def test_a_lock_of_another_live_process_holds_and_is_taken_over_with_a_warning_once_it_died(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "x" / ".locks" / "shards.lock"
    holder = subprocess.Popen(  # a process that holds the lock and is then SIGKILLed: no cleanup of its own
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from experiment.lock import hold
            with hold(Path({str(path)!r}), "shards"):
                print("held", flush=True)
                time.sleep(60)
        """)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(BusyError, match=f"pid {holder.pid}, since "), hold(path, "shards"):
            pass
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with caplog.at_level(logging.WARNING, "experiment.lock"), hold(path, "shards"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"pid {holder.pid}" in caplog.text and "that process is gone" in caplog.text


@pytest.mark.parametrize("flock_stuck", [True, False])
def test_a_lock_of_another_host_is_taken_over_only_when_its_lease_ran_out(tmp_path: Path, flock_stuck: bool) -> None:
    """Over NFS the OS lock of a dead host may stand (``flock_stuck``), or an flock may hold only within one host
    (a record whose flock is free): either way the record's lease tells, measured by the filesystem's clock (the
    file's modification time), not by the holder's own ``renewed`` time: a holder whose clock is an hour behind
    (``renewed`` an hour ago, file written just now) is live; one that stopped writing an hour ago is gone."""
    import fcntl
    import time

    path = tmp_path / ".locks" / "shards.lock"
    path.parent.mkdir(parents=True)
    for skewed, idle_s, taken in ((0, 0, False), (-3600, 0, False), (0, 3600, True)):
        path.write_text(holder_record("other-host", 1, time.time() + skewed))
        os.utime(path, (time.time() - idle_s, time.time() - idle_s))
        with contextlib.ExitStack() as stack:
            if flock_stuck:  # the lock the other host's process still holds
                fcntl.flock(stack.enter_context(open(path, "rb")), fcntl.LOCK_EX)
            if taken:
                with hold(path, "shards"):
                    assert json.loads(path.read_text())["host"] == socket.gethostname()
            else:
                with pytest.raises(BusyError, match="host other-host, pid 1"), hold(path, "shards"):
                    pass
                assert json.loads(path.read_text())["host"] == "other-host", "a live lease is left as it was"


def test_two_hosts_sharing_a_bucket_one_holds_the_other_stops_and_a_lapsed_lease_is_taken_over(
        bucket: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket lock: a second holder is refused with one line naming the first; a reader is refused while a
    writer holds it and a writer while a reader does; a record whose lease lapsed by the bucket's clock (the
    holder's host is elsewhere, its renewals stopped) is taken over with a warning, and the old holder, should it
    come back, finds the lock gone from under it (``lost_lease``) instead of writing on."""
    from experiment import lock
    from experiment.storage import backends

    run = RunFolder(bucket / "runs" / "x")
    path = lock_path(run, "shards")
    path.write_bytes(b"")  # a disk's released lock file, copied into the bucket with its run folder: no holder
    with stage_lock(run, PRETRAIN):
        pass
    with stage_lock(run, SHARDS):
        holder = json.loads(path.read_text())
        assert holder["pid"] == os.getpid()
        for stage, doing in ((SHARDS, "writing"), (PRETRAIN, "reading")):
            with pytest.raises(BusyError) as caught, stage_lock(run, stage):
                pass
            assert str(caught.value) == (
                f"{run.root} is already running recipes/03_shard.py (host {socket.gethostname()}, pid {os.getpid()}, "
                f"since {holder['since']}): wait for it to finish or stop it before {doing} its shards output")
    assert not path.exists(), "a released bucket lock leaves no object"
    with stage_lock(run, PRETRAIN), pytest.raises(BusyError, match="a running stage reads its shards output"), \
            stage_lock(run, SHARDS):
        pass
    with stage_lock(run, PRETRAIN), stage_lock(run, EVAL):
        pass  # two readers
    # another host's holder that stopped renewing: only the bucket's clock tells it lapsed
    written = backends.create(path.url, holder_record("other-host", 7, 0.0).encode())
    with pytest.raises(BusyError, match="host other-host, pid 7"), hold(path, "shards"):
        pass
    monkeypatch.setattr(lock, "LEASE_S", -1.0)  # every lease has lapsed
    with caplog.at_level(logging.WARNING, "experiment.lock"), hold(path, "shards"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert "taking over the lock" in caplog.text and "pid 7" in caplog.text
    with pytest.raises(backends.PreconditionFailed):
        backends.replace_if(path.url, b"the old holder renews", written.generation)


def test_a_bucket_lease_taken_over_is_reported_lost_to_its_old_holder(
        bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from experiment import lock

    monkeypatch.setattr(lock, "RENEW_S", 0.05)
    monkeypatch.setattr(lock, "_lost", [])
    path = lock_path(RunFolder(bucket / "x"), "pretrain")
    with hold(path, "pretrain"):
        # another process takes the lock over (as after this holder's lease lapsed in a storage outage)
        path.write_bytes(holder_record("other-host", 9, time.time()).encode())
        deadline = time.monotonic() + 20
        while lock.lost_lease() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(lock.LeaseLost, match="was taken over by host other-host, pid 9"):
            lock.check_lease()
    assert json.loads(path.read_text())["host"] == "other-host", "releasing a lost lock leaves the new holder's"


def test_a_holder_renews_its_lease_while_it_holds_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from experiment import lock

    monkeypatch.setattr(lock, "RENEW_S", 0.02)
    path = tmp_path / "shards.lock"
    with hold(path, "shards"):
        first = lock._read_holder(path)
        deadline = time.monotonic() + 10
        while (now := lock._read_holder(path)) in (None, first) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first is not None and now is not None and now.renewed > first.renewed


# ---- names and manifests (unit) ----

@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "a/b", "..", ""])
def test_experiment_name_is_a_plain_name(name: str) -> None:
    from experiment.config import load_config

    with pytest.raises(ConfigError, match=r"config key 'experiment\.name': .* is not a plain name"):
        load_config(REPO / "tests" / "configs" / "tiny.yaml", [f"experiment.name={name}"])


@pytest.mark.parametrize("entry", ["/etc/hostname", "../other/docs-00000.jsonl"])
def test_a_manifest_entry_outside_its_folder_is_one_error_line(tmp_path: Path, entry: str) -> None:
    CORPUS.write_manifest(tmp_path, {"documents": 1, "shards": [{"file": entry, "bytes": 1}]})
    with pytest.raises(DataError) as caught:
        CORPUS.read_manifest(tmp_path)
    assert str(caught.value) == (f"{tmp_path / 'manifest.json'}: entry 'shards[0].file' is {entry!r}, not a file "
                                 f"name inside {tmp_path}: a manifest lists only files of its own folder")


def test_invalidate_never_clears_a_stage_folder_through_a_link_into_another_run(tmp_path: Path) -> None:
    from experiment.manifest import invalidate

    parent = tmp_path / "parent"
    CORPUS.write_manifest(parent / "corpus", {"documents": 0, "shards": []})
    (parent / "config.resolved.yaml").write_text("{}\n")
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "corpus").symlink_to(parent / "corpus")
    with pytest.raises(DataError, match="its data is read-only here; remove the link to build this run's own"):
        invalidate(tmp_path / "child" / "corpus")
    assert (parent / "corpus" / "manifest.json").is_file()


# ---- recipes (integration) ----

def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and ".locks" not in p.parts}


@pytest.fixture
def data_run(fixture_stages: Path, tmp_path: Path) -> Path:
    """runs/tiny of a fresh run root: a copy of the fixture's run folder (stages 01-03 and its resolved config)."""
    shutil.copytree(fixture_stages / "runs" / "tiny", tmp_path / "runs" / "tiny",
                    ignore=shutil.ignore_patterns("wandb"))
    return tmp_path / "runs" / "tiny"


def test_recipe_03_takes_the_stage_lock(data_run: Path) -> None:
    from tests.fixture_run import fixture_config
    from tests.recipe_runner import error_line, run_recipe

    before = hashes(data_run / "shards")
    with hold(lock_path(RunFolder(data_run), "shards"), "shards"):
        proc = run_recipe("03_shard.py", fixture_config(data_run.parent.parent), check=False)
    assert proc.returncode == 2 and error_line(proc).startswith(
        f"error: {data_run} is already running recipes/03_shard.py (host {socket.gethostname()}, pid {os.getpid()}"), \
        proc.stderr[-2000:]
    assert hashes(data_run / "shards") == before


def test_stage_recipes_in_a_branch_or_a_variant_leave_the_linked_data_alone(data_run: Path) -> None:
    from experiment.links import BRANCH_DATA, link_stages
    from tests.fixture_run import fixture_config
    from tests.recipe_runner import error_line, run_recipe
    from tracking.sweep import link_data

    root = data_run.parent.parent
    before = hashes(data_run)
    config = fixture_config(root, experiment={"name": "tiny", "grid": {"train.learning_rate": [1e-3]}})
    link_stages(RunFolder(root / "runs" / "branch"), RunFolder(data_run), BRANCH_DATA, "branch")
    link_data(RunFolder(root / "runs" / "tiny-learning_rate-0.001"), RunFolder(data_run))
    cases = [(script, ("experiment.name=branch", "train.branch_from=tiny", "train.branch_step=3"), stage,
              "train.branch_from=tiny", "branch") for script, stage in (("02_train_tokenizer.py", "tokenizer"),
                                                                         ("03_shard.py", "shards"))]
    cases += [(script, ("experiment.variant=learning_rate-0.001",), stage,
               "the data sweep 'tiny' shares with its variants", "tiny-learning_rate-0.001")
              for script, stage in (("01_build_corpus.py", "corpus"), ("02_train_tokenizer.py", "tokenizer"),
                                    ("03_shard.py", "shards"))]
    for script, overrides, stage, reason, run in cases:
        proc = run_recipe(script, config, *overrides, check=False)
        link = root / "runs" / run / stage
        assert proc.returncode == 2 and error_line(proc) == (
            f"error: {link} is a link to {data_run / stage} ({reason}): its data is read-only here; remove the "
            "link to build this run's own"), proc.stderr[-2000:]
    assert hashes(data_run) == before


def test_data_from_trains_on_another_experiments_shards_read_only(data_run: Path) -> None:
    from tests.fixture_run import fixture_config
    from tests.recipe_runner import error_line, run_recipe

    root = data_run.parent.parent
    before = hashes(data_run)
    config = fixture_config(root, experiment={"name": "cpt", "data_from": "tiny"},
                            train={"steps": 2, "checkpoint_every": 2, "warmup_steps": 1}, wandb={"mode": "disabled"})
    run_recipe("04_pretrain.py", config)
    cpt = root / "runs" / "cpt"
    assert all((cpt / stage).resolve() == data_run / stage for stage in ("corpus", "tokenizer", "shards"))
    assert (cpt / "checkpoints" / "2").is_dir()
    proc = run_recipe("03_shard.py", config, check=False)
    assert proc.returncode == 2 and error_line(proc) == (
        "error: config key 'experiment.data_from': this run reads the shards of experiment 'tiny': run "
        "recipes/03_shard.py with experiment.name=tiny to build it, or leave experiment.data_from unset")
    assert hashes(data_run) == before


def test_recipe_03_checks_the_corpus_against_its_sha256_before_replacing_the_shards(data_run: Path) -> None:
    from data_prep.shards.build import shard_corpus
    from experiment.config import load_config
    from tests.fixture_run import fixture_config

    shard = data_run / "corpus" / "docs-00000.jsonl"
    text = shard.read_bytes()
    index = text.index("о".encode())  # one Cyrillic letter for another of the same size: the sizes still match
    shard.write_bytes(text[:index] + "а".encode() + text[index + 2:])
    before = hashes(data_run / "shards")
    cfg = load_config(fixture_config(data_run.parent.parent))
    with pytest.raises(DataError, match=f"corpus shard {shard} does not match its manifest: sha256 "):
        shard_corpus(cfg, RunFolder(data_run), None)
    assert hashes(data_run / "shards") == before


def test_two_recipe_04_of_one_run_one_trains_the_other_stops_at_once(fixture_stages: Path, tmp_path: Path) -> None:
    """A double submit: the second run exits 2 with one line naming the first; the first's steps, ledger
    and checkpoints are those of a run alone."""
    from cost.ledger_pricing import summarize_ledger
    from tests.fixture_run import run_copy
    from tests.recipe_runner import error_line, logged_steps, run_recipe, start_pretrain, wait_until
    from trainer.resume import finished_steps

    config = run_copy(fixture_stages, tmp_path, train={"steps": 6, "checkpoint_every": 3, "warmup_steps": 1,
                                                       "log_every": 1}, wandb={"mode": "disabled"})
    run = tmp_path / "runs" / "tiny"
    lock = run / ".locks" / "pretrain.lock"
    first = start_pretrain(config, tmp_path / "first.log")
    try:
        wait_until(first, lambda: lock.is_file() and lock.stat().st_size > 0, output=tmp_path / "first.log")
        os.kill(first.pid, signal.SIGSTOP)  # it holds the lock: the second starts while it is mid-run
        second = run_recipe("04_pretrain.py", config, check=False, subprocess_=True)
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
            first.wait(timeout=30)
    assert second.returncode == 2, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert error_line(second).startswith(f"error: {run} is already running recipes/04_pretrain.py (host "
                                         f"{socket.gethostname()}, pid {first.pid}, since ")
    assert logged_steps(run) == [1, 2, 3, 4, 5, 6]
    assert summarize_ledger(run / "ledger").tokens == 6 * 8 * 64  # steps x batch_size x max_seq_len, booked once
    assert finished_steps(run / "checkpoints") == [3, 6]


def test_the_fit_check_of_a_config_with_data_from_needs_no_data_yet(tmp_path: Path) -> None:
    """A shipped sweep config names its data's experiment (experiment.data_from): recipe 04b checks it before any
    data exists (from the config's vocabulary and length), while recipe 04 still needs the shards."""
    from experiment.config import load_config
    from experiment.errors import ConfigError
    from experiment.links import link_data_from
    from experiment.stages import FIT_CHECK, PRETRAIN
    from tests.fixture_run import fixture_config

    cfg = load_config(fixture_config(tmp_path, experiment={"name": "sw", "data_from": "not-built"}))
    run_folder = RunFolder.for_config(cfg)
    link_data_from(cfg, run_folder, FIT_CHECK)
    assert not run_folder.shards.exists() and not run_folder.shards.is_symlink()
    with pytest.raises(ConfigError, match="holds no shards/ folder"):
        link_data_from(cfg, run_folder, PRETRAIN)
