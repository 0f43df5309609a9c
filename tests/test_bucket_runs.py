"""Whole runs whose folder is a bucket (gs:// on fake-gcs-server, s3:// on moto, both on loopback): the recipe
chain with nothing written under the local run root, two trainers of one run, another run's data read through link
files, corpus sources in a bucket, a run folder on a real FUSE mount refused. Compared with the same run on a disk,
bit for bit. Kills, two hosts and storage faults: tests/test_bucket_resume.py."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cost.ledger_format import read_sessions
from experiment.files import publish_dir
from experiment.storage import BucketPath, location
from tests.bucket_run import bucket_run, files_under, same_log
from tests.fixture_run import FIXTURE_TEXTS, PRETRAINED_TRAIN, fixture_config, log_records
from tests.recipe_runner import error_line, run_recipe, start_pretrain

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHAIN = ("01_build_corpus.py", "02_train_tokenizer.py", "03_shard.py", "04_pretrain.py", "05_evaluate.py",
         "06_compare_costs.py", "07_plan_costs.py", "09_generate.py")


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
    for name in ("corpus/manifest.json", "tokenizer/manifest.json", "shards/manifest.json",
                 "checkpoints/6/checksums.json", "eval/manifest.json", "eval/step_0000006.json", "reports/costs.csv",
                 "reports/plan.csv", "config.resolved.yaml", "checkpoints/wandb_run.json"):
        assert name in objects, name
    assert any(name.startswith("generate/") and name.endswith(".jsonl") for name in objects)
    assert any(name.startswith("ledger/ledger.jsonl.segments/") for name in objects), "the ledger's segments"
    sessions = read_sessions(run / "ledger")
    assert sum(batch.tokens for s in sessions for batch in s.tokens) == PRETRAINED_TRAIN["steps"] * 8 * 64
    assert (tmp_path / "host" / scheme).is_dir(), "W&B's offline files stay on the host's disk"


def test_a_second_trainer_of_a_run_in_a_bucket_stops_with_one_line_and_a_killed_ones_lock_is_taken_over(
        storage_servers: Any, fixture_stages: Path, tmp_path: Path) -> None:
    root, run = bucket_run(storage_servers, "gs", fixture_stages)
    # runs until killed
    config = fixture_config(tmp_path / "config", train={"steps": 100_000, "checkpoint_every": 100_000})
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
            f"error: {run} is already running recipes/04_pretrain.py "
            f"(host {json.loads((run / '.locks' / 'pretrain.lock').read_text())['host']}, "
            f"pid {first.pid}, since {json.loads((run / '.locks' / 'pretrain.lock').read_text())['since']}): wait "
            "for it to finish or stop it before writing its pretrain output")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert (run / ".locks" / "pretrain.lock").is_file(), "a killed holder leaves its lock object"
    taken = run_recipe("04_pretrain.py", config, f"experiment.run_root={root}", "train.steps=2", "train.warmup_steps=1")
    assert "taking over the lock" in taken.stderr and f"pid {first.pid}" in taken.stderr
    assert not (run / ".locks" / "pretrain.lock").exists(), "released at the end"


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



def test_a_trained_run_in_a_bucket_is_exported_and_submitted_to_mera_from_there(
        storage_servers: Any, fixture_pretrained: Path, shared_data: Path, tmp_path: Path) -> None:
    """A trained run uploaded to a bucket: recipe 05b exports its checkpoint there as a Hugging Face folder, and
    recipe 05c reads MERA's test inputs from a bucket prefix (``eval.mera_dir=s3://...``) and writes the archive
    the site takes into the run folder, which the site's schema reads back."""
    import zipfile

    from eval.mera import validate_submission
    from tests.test_mera_submission import mera_inputs

    bucket = location(storage_servers.new_bucket("s3"))
    publish_dir(fixture_pretrained.parent / "runs" / "tiny", bucket / "runs" / "tiny")
    sizes = mera_inputs(tmp_path / "mera", shared_data)
    publish_dir(tmp_path / "mera", bucket / "mera-inputs")
    config = fixture_config(tmp_path / "config", train=PRETRAINED_TRAIN)
    root = f"experiment.run_root={bucket}/runs"
    run_recipe("05b_export_hf.py", config, root)
    run = bucket / "runs" / "tiny"
    exported = run.list_objects()
    assert {"export/hf/step_0000006/config.json", "export/hf/step_0000006/model.safetensors",
            "export/hf/step_0000006/tokenizer.json"} <= set(exported)
    run_recipe("05c_mera_submission.py", config, root, f"eval.mera_dir={bucket}/mera-inputs",
               "eval.mera_tasks=[rcb,simplear,use]", "eval.mera_fewshot=zero")  # the inputs hold no train splits
    (name,) = [n for n in run.list_objects() if n.startswith("mera/submission_step_") and n.endswith(".zip")]
    archive = tmp_path / "submission.zip"
    archive.write_bytes((run / name).read_bytes())
    metas = {"RCB.json": [{"id": i} for i in range(sizes["rcb"])],
             "SimpleAr.json": [{"id": i} for i in range(sizes["simplear"])],
             "USE.json": [{"id": i, "id_task": str(i % 3), "variant": 1} for i in range(sizes["use"])]}
    assert validate_submission(archive, metas) == {"RCB.json": 9, "SimpleAr.json": 7, "USE.json": 4}
    with zipfile.ZipFile(archive) as z:
        assert all(row["outputs"] in ("1", "2", "3") for row in json.loads(z.read("RCB.json"))["data"]["test"])
