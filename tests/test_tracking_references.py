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
