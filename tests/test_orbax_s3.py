"""Orbax checkpoints straight to ``s3://`` and ``gs://`` (trainer.orbax_s3), against the real S3 and GCS APIs on
loopback (moto, fake-gcs-server): saves, rotation, bitwise restores, and steps whose save never committed."""

from __future__ import annotations

import os

# before gcsfs is first imported (it reads this then): etils.epath's gs:// filesystem would otherwise be gcsfs's
# ExtendedGcsFileSystem, which asks the storage control API (Google credentials, gRPC) for the bucket's type
# on every file it opens and, against the emulator, logs a warning and falls back each time (~1.5 s a test)
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from orbax.checkpoint.checkpoint_managers import preservation_policy

from experiment.storage import BucketPath
from trainer import orbax_s3

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMIT = "commit_success.txt"  # Orbax's commit marker (atomicity.COMMIT_SUCCESS_FILE)


def tree(step: int) -> dict[str, Any]:
    """A small pytree whose every leaf differs per step: several dtypes, a scalar, a nested dict."""
    rng = np.random.default_rng(step)
    return {"dense": {"kernel": jnp.asarray(rng.standard_normal((64, 32), dtype=np.float32)),
                      "bias": jnp.asarray(rng.standard_normal(32).astype(jnp.bfloat16))},
            "embed": jnp.asarray(rng.integers(-2**31, 2**31 - 1, size=(16, 8), dtype=np.int32)),
            "step": jnp.asarray(step, dtype=jnp.int32)}


def meta(step: int) -> dict[str, Any]:
    return {"step": step, "family": "тест", "nested": {"seq_len": 128, "ids": [step, step + 1]}}


def open_manager(directory: str, keep: int | None = None, **options: Any) -> ocp.CheckpointManager:
    """A manager as trainer.checkpoint opens one: LatestN rotation when writing, the bucket's options from
    ``checkpoint_options_for``; async saves."""
    return ocp.CheckpointManager(directory, item_names=("params", "meta"), options=ocp.CheckpointManagerOptions(
        preservation_policy=preservation_policy.LatestN(keep) if keep else None, enable_async_checkpointing=True,
        create=keep is not None, **{**orbax_s3.checkpoint_options_for(directory), **options}))


def save(manager: ocp.CheckpointManager, step: int) -> None:
    manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(tree(step)),
                                               meta=ocp.args.JsonSave(meta(step))))


def restore(manager: ocp.CheckpointManager, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree(step))
    got = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract),
                                                        meta=ocp.args.JsonRestore()))
    return got["params"], got["meta"]


def assert_bitwise_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def step_names(directory: BucketPath) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ------------------------------------------------------------------------------------ without servers


def test_s3_paths_become_tensorstore_s3_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(var, raising=False)
    orbax_s3.enable_s3()
    orbax_s3.enable_s3()  # idempotent: the wrappers are not stacked
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

    assert orbax_s3.s3_enabled()
    assert ts_utils._normalize_path("s3://bkt/a//b/./c/") == "s3://bkt/a/b/c"
    assert ts_utils._normalize_path("s3:/bkt/a") == "s3://bkt/a"  # what os.path.normpath made of it upstream
    assert ts_utils._normalize_path("gs://bkt/a/") == "gs://bkt/a" and ts_utils._normalize_path("/x/y/") == "/x/y"
    base = ts_utils.build_kvstore_tspec("s3://bkt/run/ckpt/7/params", "w.kernel")["base"]
    assert base == {"driver": "s3", "bucket": "bkt", "path": "run/ckpt/7/params", "aws_region": "us-east-1"}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://other:1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://storage.example.ru/")  # the S3-specific one wins
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ru-central1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    spec = ts_utils.build_kvstore_tspec("s3://bkt/ckpt", "x", use_ocdbt=False)
    assert spec == {"driver": "s3", "bucket": "bkt", "path": "ckpt/x", "aws_region": "ru-central1",
                    "endpoint": "https://storage.example.ru", "aws_credentials": {"type": "environment"}}
    # gs:// and local paths are Orbax's own specs, untouched
    assert ts_utils.build_kvstore_tspec("gs://bkt/ckpt", "x", use_ocdbt=False) == {"driver": "gcs", "bucket": "bkt",
                                                                                    "path": "ckpt/x"}
    assert ts_utils.build_kvstore_tspec("/ckpt", "x", use_ocdbt=False)["path"] == "/ckpt/x"
    with pytest.raises(ValueError, match="absolute"):
        ts_utils.build_kvstore_tspec("relative/ckpt")


def test_buckets_commit_with_a_marker_file_and_local_folders_by_rename() -> None:
    from etils import epath
    from orbax.checkpoint._src.path import atomicity, atomicity_defaults

    orbax_s3.enable_s3()
    commit_file = {"atomicity_options": ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)}
    assert orbax_s3.checkpoint_options_for("s3://bkt/ckpt") == commit_file
    assert orbax_s3.checkpoint_options_for(BucketPath("gs://bkt/ckpt")) == commit_file
    assert orbax_s3.checkpoint_options_for(Path("/runs/x/checkpoints")) == {}
    for function in (atomicity_defaults.get_default_temporary_path_class,
                     atomicity_defaults.get_item_default_temporary_path_class):
        assert function(epath.Path("s3://bkt/ckpt/3")) is atomicity.CommitFileTemporaryPath
        assert function(epath.Path("gs://bkt/ckpt/3")) is atomicity.CommitFileTemporaryPath
        assert function(epath.Path("/ckpt/3")) is atomicity.AtomicRenameTemporaryPath
        rename = ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.ATOMIC_RENAME)
        assert function(epath.Path("s3://bkt/ckpt"), atomicity_options=rename) is atomicity.AtomicRenameTemporaryPath


def test_another_orbax_release_is_refused_with_the_reason() -> None:
    orbax_s3.check_orbax_version("0.12.8")
    for version in ("0.13.0", "0.11.9", "1.0.0"):
        with pytest.raises(orbax_s3.OrbaxVersionError, match=rf"0\.12\.x; this is {version}.*marin#8120"):
            orbax_s3.check_orbax_version(version)


# ------------------------------------------------------------------------------------ against the servers


def test_async_saves_rotate_and_restore_bitwise(bucket: BucketPath) -> None:
    folder = bucket / "run" / "checkpoints"
    manager = open_manager(str(folder), keep=2)
    for step in (1, 2, 3):
        save(manager, step)
    manager.wait_until_finished()
    assert manager.all_steps() == [2, 3] and manager.latest_step() == 3
    manager.close()
    # in place, committed by a marker: no temporary folder was renamed, step 1 is gone from the bucket
    assert step_names(folder) == ["2", "3"]
    for step in (2, 3):
        assert (folder / str(step) / COMMIT).is_file()
        assert {p.name for p in (folder / str(step)).iterdir()} >= {"params", "meta", COMMIT}
    assert not list(folder.rglob("*orbax-checkpoint-tmp*"))

    reader = open_manager(str(folder))  # a fresh manager, as resume and eval open one: read-only
    assert reader.all_steps() == [2, 3]
    for step in (2, 3):
        params, saved_meta = restore(reader, step)
        assert_bitwise_equal(params, tree(step))
        assert saved_meta == meta(step)
    reader.close()


def test_a_step_without_its_commit_marker_is_never_trusted(bucket: BucketPath) -> None:
    folder = bucket / "checkpoints"
    manager = open_manager(str(folder), keep=5)
    for step in (1, 2, 3):
        save(manager, step)
    manager.close()
    (folder / "3" / COMMIT).unlink()  # step 3 was written but its save never reached the commit
    (folder / "4" / "params" / "manifest.ocdbt").write_bytes(b"cut off")  # a save killed after its first object
    assert step_names(folder) == ["1", "2", "3", "4"]

    for options in ({}, {"atomicity_options": None}):  # with the manager's options, and with Orbax's defaults
        reader = open_manager(str(folder), **options)
        assert reader.all_steps() == [1, 2] and reader.latest_step() == 2, options
        assert_bitwise_equal(restore(reader, 2)[0], tree(2))
        reader.close()


ANOTHER_WRITER = """
import os, signal, sys, time
import numpy as np, orbax.checkpoint as ocp
from experiment.storage import location
from trainer import orbax_s3

directory = sys.argv[1]
options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, **orbax_s3.checkpoint_options_for(directory))
manager = ocp.CheckpointManager(directory, item_names=("params", "meta"), options=options)
big = {"w": np.random.default_rng(0).standard_normal((2048, 4096), dtype=np.float32)}  # 32 MB: a save that lasts
manager.save(2, args=ocp.args.Composite(params=ocp.args.StandardSave(big), meta=ocp.args.JsonSave({"step": 2})))
manager.wait_until_finished()
manager.save(3, args=ocp.args.Composite(params=ocp.args.StandardSave(big), meta=ocp.args.JsonSave({"step": 3})))
step = location(directory) / "3"
while not any(step.rglob("*")):  # killed once step 3 has objects in the bucket, before its commit
    time.sleep(0.005)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_reader_sees_what_another_process_committed_and_not_a_save_killed_mid_way(bucket: BucketPath,
                                                                                     tmp_path: Path) -> None:
    folder = bucket / "checkpoints"
    writer = open_manager(str(folder), keep=5)
    save(writer, 1)
    writer.close()
    reader = open_manager(str(folder))  # eval beside training: opened before the other process saves
    assert reader.all_steps() == [1]
    script = tmp_path / "another_writer.py"
    script.write_text(textwrap.dedent(ANOTHER_WRITER))
    done = subprocess.run([sys.executable, str(script), str(folder)], cwd=REPO_ROOT, env={**os.environ},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert (folder / "2" / COMMIT).is_file() and any((folder / "3").rglob("*"))
    assert not (folder / "3" / COMMIT).exists()  # the kill came before step 3's commit
    reader.reload()
    assert reader.all_steps() == [1, 2] and reader.latest_step() == 2  # no stale listing, no half-written step
    assert reader.restore(2, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"] == {"step": 2}
    reader.close()
    fresh = open_manager(str(folder))
    assert fresh.all_steps() == [1, 2]
    fresh.close()
