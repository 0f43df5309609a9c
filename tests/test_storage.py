"""The storage layer against the real GCS and S3 APIs on loopback (fake-gcs-server, moto), and locally."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from experiment.errors import ConfigError, DataError
from experiment.files import atomic_dir, atomic_open, atomic_write_json, read_json_object, sha256_file
from experiment.storage import BucketPath, RunPath, backends, create_exclusive, location, read_range, remove_tree
from experiment.storage.mounts import bucket_mount_of


@pytest.mark.parametrize("text, fragment", [
    ("s3:/bucket/runs", "did you mean s3://bucket/runs"),
    ("gs:bucket", "did you mean gs://bucket"),
    ("S3://bucket/x", "did you mean s3://bucket/x"),
    ("gs://", "is not a bucket name"),
    ("gs://Bad_Bucket/x", "is not a bucket name"),
    ("s3://bucket/a/../b", "'..'"),
    ("az://container/x", "the scheme 'az:' is not one"),
    ("https://host/x", "the scheme 'https:' is not one"),
])
def test_a_malformed_bucket_url_is_one_line_naming_the_key(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        location(text, "experiment.run_root")
    message = str(caught.value)
    assert "experiment.run_root" in message and fragment in message and "\n" not in message


def test_local_paths_stay_pathlib_and_urls_become_bucket_paths() -> None:
    assert location("runs") == Path("runs")
    assert location("C:/runs") == Path("C:/runs")  # a drive letter is no scheme
    run = location("gs://my-bucket/runs/") / "demo"
    assert isinstance(run, BucketPath) and str(run) == "gs://my-bucket/runs/demo"
    assert (run / "shards" / "train-0.tfrecord").with_suffix(".index").name == "train-0.index"
    assert run.parent == location("gs://my-bucket/runs") and run.relative_to("gs://my-bucket").as_posix() == "runs/demo"
    with pytest.raises(TypeError):
        open(run)  # type: ignore[call-overload]  # noqa: SIM115  # no __fspath__: never a local folder named gs:


def test_files_read_write_list_and_range(bucket: BucketPath) -> None:
    folder = bucket / "run" / "eval"
    atomic_write_json(folder / "step_6.json", {"ppl": "низкая"})
    (folder / "nested" / "a.txt").write_text("привет")
    assert read_json_object(folder / "step_6.json") == {"ppl": "низкая"}
    assert folder.is_dir() and not folder.is_file() and (folder / "step_6.json").is_file()
    assert not (folder / "missing").is_dir() and not (bucket / "elsewhere").is_dir()  # no such prefix: as pathlib
    assert [p.name for p in folder.iterdir()] == ["nested", "step_6.json"]
    assert [p.name for p in folder.glob("*.json")] == ["step_6.json"]
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*.txt")) == ["nested/a.txt"]
    data = "привет".encode()
    assert read_range(folder / "nested" / "a.txt", 2, 6) == data[2:6]
    assert (folder / "nested" / "a.txt").stat().st_size == len(data)
    assert sha256_file(folder / "nested" / "a.txt") == __import__("hashlib").sha256(data).hexdigest()
    moved = (folder / "nested").rename(bucket / "run" / "aside")
    assert not (folder / "nested").exists() and (moved / "a.txt").read_text() == "привет"
    remove_tree(bucket / "run")
    assert not (bucket / "run").exists()


def test_a_write_that_raises_publishes_nothing(bucket: BucketPath) -> None:
    target = bucket / "shards" / "train-00000.tfrecord"
    with pytest.raises(RuntimeError), atomic_open(target, "wb") as handle:
        handle.write(b"x" * (6 << 20))  # past fsspec's first upload part
        raise RuntimeError("killed mid-shard")
    assert not target.exists()
    with pytest.raises(RuntimeError), atomic_open(bucket / "report.md", "w") as text:
        text.write("# half")
        raise RuntimeError("boom")
    assert not (bucket / "report.md").exists()
    with atomic_open(target, "wb") as handle:
        handle.write(b"whole")
    assert target.read_bytes() == b"whole"


def test_atomic_dir_publishes_the_commit_file_last(bucket: BucketPath) -> None:
    out = bucket / "export" / "step_6"
    (out / "stale.bin").write_bytes(b"old")
    (out / "config.json").write_text("{}")
    with atomic_dir(out) as staging:
        (staging / "model.safetensors").write_bytes(b"w")
        (staging / "config.json").write_text('{"new": 1}')
    assert sorted(out.list_objects()) == ["config.json", "model.safetensors"]
    assert read_json_object(out / "config.json") == {"new": 1}


def test_exclusive_create_has_one_winner_among_racing_writers(any_root: RunPath) -> None:
    target = any_root / ".locks" / "pretrain.lock"
    winners: list[int] = []

    def race(number: int) -> None:
        try:
            create_exclusive(target, f"{number}".encode())
            winners.append(number)
        except FileExistsError:
            pass

    threads = [threading.Thread(target=race, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1 and target.read_text() == str(winners[0])


def test_conditional_replace_and_delete_follow_the_generation(bucket: BucketPath) -> None:
    path = bucket / "lock"
    first = backends.create(path.url, b"holder 1")
    second = backends.replace_if(path.url, b"holder 1 renewed", first.generation)
    assert second.generation != first.generation and path.read_bytes() == b"holder 1 renewed"
    with pytest.raises(backends.PreconditionFailed):
        backends.replace_if(path.url, b"stale writer", first.generation)
    assert not backends.delete_if(path.url, first.generation) and path.exists()
    assert backends.delete_if(path.url, second.generation) and not path.exists()


def test_a_run_folder_on_a_bucket_fuse_mount_is_recognised(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        f"90 22 0:50 / {tmp_path}/mnt\\040gcs rw,nosuid - fuse.gcsfuse my-bucket rw,user_id=0\n")
    (tmp_path / "mnt gcs" / "runs").mkdir(parents=True)
    found = bucket_mount_of(tmp_path / "mnt gcs" / "runs" / "demo", str(mountinfo))
    assert found is not None and found.fstype == "fuse.gcsfuse" and found.source == "my-bucket"
    assert bucket_mount_of(tmp_path, str(mountinfo)) is None


def test_a_bucket_folder_copied_for_a_local_only_library_fetches_only_what_changed(
        bucket: BucketPath, tmp_path: Path) -> None:
    """``local_folder`` (a Hugging Face model folder named by ``model.init_from=gs://...``): a local copy, then on
    the next call only the objects whose size or generation changed are downloaded again."""
    from experiment.storage.download import local_copy

    model = bucket / "models" / "base"
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"w" * 1000)
    first = local_copy(model, "model.init_from", tmp_path / "downloads")
    assert (first / "config.json").read_text() == '{"model_type": "llama"}'
    assert (first / "model.safetensors").read_bytes() == b"w" * 1000
    (first / "model.safetensors").write_bytes(b"tampered locally")  # a size the listing does not give: fetched again
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    again = local_copy(model, "model.init_from", tmp_path / "downloads")
    assert again == first and (again / "config.json").read_text() == '{"model_type": "qwen3"}'
    assert (again / "model.safetensors").read_bytes() == b"w" * 1000
    with pytest.raises(DataError, match="holds no files"):
        local_copy(bucket / "nothing-here", "model.init_from", tmp_path / "downloads")
