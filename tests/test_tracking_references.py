"""Large outputs (corpus, shards) go to W&B as file:// references with checksums, never as copies."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from experiment.runfolder import RunFolder
from tests.test_tracking import offline_cfg
from tracking.artifacts import log_reference
from tracking.wandb_run import open_run


def test_an_offline_run_references_the_shards_without_a_copy(tmp_path: Path, restore_wandb_env: None) -> None:
    cfg = offline_cfg(tmp_path)
    folder = RunFolder.for_config(cfg)
    shards = folder.shards
    shards.mkdir(parents=True)
    data = os.urandom(1 << 20)
    (shards / "train-00000.tfrecord").write_bytes(data)
    (shards / "manifest.json").write_text("{}")
    with open_run(cfg, folder, job_type="shards") as run:
        artifact = log_reference(run, "trk-shards", "shards", shards, {"records": 1})
        entries = {name: entry for name, entry in artifact.manifest.entries.items()}
    entry = entries["train-00000.tfrecord"]
    assert entry.ref == (shards / "train-00000.tfrecord").resolve().as_uri()
    assert entry.size == len(data) and entry.digest == base64.b64encode(hashlib.md5(data).digest()).decode()
    assert set(entries) == {"train-00000.tfrecord", "manifest.json"}
    # nothing W&B wrote (run folder, staging, cache: all under the run's wandb/ folder) holds the bytes
    written = [p for p in tmp_path.rglob("*") if p.is_file() and shards not in p.parents]
    assert any(folder.wandb in p.parents for p in written)
    probe = data[500_000:504_096]
    assert not [p for p in written if probe in p.read_bytes()]


def test_measured_files_local_as_given_bucket_through_the_stores_handler(tmp_path: Path,
                                                                        restore_wandb_env: None) -> None:
    """Beam workers' measured files: a local one is entered with the writer's MD5; one in a bucket goes through
    W&B's own handler (the store's digest, which download checks), its MD5 kept in the metadata."""
    cfg = offline_cfg(tmp_path)
    folder = RunFolder.for_config(cfg)
    corpus = folder.corpus
    corpus.mkdir(parents=True)
    (corpus / "docs-00000.jsonl").write_bytes(b"local shard")
    md5 = base64.b64encode(hashlib.md5(b"local shard").digest()).decode()
    remote_md5 = base64.b64encode(hashlib.md5(b"remote shard").digest()).decode()
    files = [{"name": "docs-00000.jsonl", "uri": str(corpus / "docs-00000.jsonl"), "size": 11, "md5": md5},
             {"name": "docs-00001.jsonl", "uri": "testfs://bucket/corpus/docs-00001.jsonl", "size": 12,
              "md5": remote_md5}]
    with open_run(cfg, folder, job_type="corpus") as run:
        artifact = log_reference(run, "trk-corpus", "corpus", corpus, {"documents": 2}, files=files)
        entries = dict(artifact.manifest.entries)
    assert entries["docs-00000.jsonl"].digest == md5 and entries["docs-00000.jsonl"].size == 11
    remote = entries["docs-00001.jsonl"]
    assert remote.ref == "testfs://bucket/corpus/docs-00001.jsonl" and remote.digest != remote_md5
    assert artifact.metadata == {"documents": 2, "writer_md5": {"docs-00001.jsonl": remote_md5}}
