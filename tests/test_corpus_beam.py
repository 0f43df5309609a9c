"""The Beam path gives the same corpus as the local pool, with the data work on the workers
(needs the beam extra: ``make test-extra-beam``, or its venv with RU_REQUIRE_EXTRAS=beam)."""

from __future__ import annotations

import json
import os
import posixpath
import random
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from data_prep.corpus.beam import bucket_matches, cluster_extras, copy_rows, exact_group_outcomes, rank_offsets
from data_prep.corpus.build import build_corpus
from data_prep.corpus.cleaning import CleanDocument
from data_prep.corpus.sources import select_parquet_files
from experiment.corpus_format import iter_documents, read_corpus_manifest
from experiment.errors import ConfigError, DataError
from experiment.runfolder import RunFolder
from experiment.sections.corpus import DedupConfig
from tests.conftest import import_extra
from tests.test_corpus_build import inputs, make_cfg, run, sources_for  # noqa: F401  (inputs is a fixture)
from tests.test_corpus_decontam import BENCH, CLEAN_TEXT, build, planted_items, write_sources
from tests.test_corpus_decontam import make_cfg as make_decontam_cfg
from tests.test_corpus_ruslit import RUSLIT, write_jsonl_with_bad_bytes

TWO_WORKERS = ["--runner=DirectRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
_opened: list[str] | None = None  # files this process opens while a guard is on (an audit hook stays for good)


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], str | bytes | Path):
        _opened.append(str(args[0]))


@contextmanager
def opened_files() -> Iterator[list[str]]:
    """Every path this process opens inside the block (Python's ``open`` audit event)."""
    global _opened
    if _audit not in getattr(sys, "_ru_audit_hooks", []):
        sys.addaudithook(_audit)
        sys._ru_audit_hooks = [*getattr(sys, "_ru_audit_hooks", []), _audit]  # type: ignore[attr-defined]
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


class RecordingRun:
    """Stands in for a W&B run: keeps the artifacts logged (and accepts the corpus tables)."""

    def __init__(self) -> None:
        self.summary: dict[str, object] = {}
        self.artifacts: list[Any] = []

    def log(self, data: dict[str, Any], step: int | None = None) -> None:
        pass

    def log_artifact(self, artifact: Any, aliases: list[str] | None = None) -> None:
        self.artifacts.append(artifact)

    def use_artifact(self, artifact: Any) -> None:
        raise TypeError("Cannot use artifact when in offline mode.")


def assert_same_entries_as_wandb_reads(artifact: Any, folder: Path) -> None:
    """The reference built from the workers' measurements equals W&B's own reference of the folder,
    which reads every file for its MD5 (done here, outside the guard)."""
    from tracking.artifacts import _reference_artifact

    def entries(art: Any) -> dict[str, tuple[Any, ...]]:
        return {str(e.path): (e.ref, e.digest, e.size) for e in art.manifest.entries.values()}

    expected = entries(_reference_artifact("x", "x", folder, None, checksum=True))
    assert entries(artifact) == expected and len(expected) > 3


def _doc(order: int) -> CleanDocument:
    return CleanDocument(order, f"s:{order:09d}:x", "s", "o", 10, text="t")


def test_exact_group_keeps_the_lowest_order() -> None:
    outcomes = list(exact_group_outcomes([_doc(7), _doc(3), _doc(5)]))
    assert [(d.order, kind, earlier) for d, kind, earlier in outcomes] == [
        (3, None, None), (5, "exact", "s:000000003:x"), (7, "exact", "s:000000003:x")]


def test_bucket_matches_compare_with_lower_orders_only() -> None:
    a, b, c = np.zeros(4, np.uint32), np.zeros(4, np.uint32), np.arange(4, dtype=np.uint32)
    members = [(2, "b", b), (1, "a", a), (3, "c", c)]
    assert sorted(bucket_matches(members, DedupConfig(min_jaccard=0.0))) == [(2, "a", 1), (3, "a", 1), (3, "b", 2)]
    assert sorted(bucket_matches(members, DedupConfig(min_jaccard=0.9))) == [(2, "a", 1)]


def test_rehydration_clusters_follow_chains_and_copies_continue_the_shards() -> None:
    # 5 -> 3 -> 1 is one cluster of 3 (3 copies: 2 extra), 9 -> 7 a cluster of 2 (1 extra)
    assert sorted(cluster_extras([(5, 3), (9, 7), (3, 1)])) == [(1, 2), (7, 1)]
    rows = list(copy_rows((0, [(4, 1, (4, "b", "s", "B")), (0, 2, (0, "a", "s", "A"))]), {}, kept_total=5,
                          docs_per_shard=2))  # 5 kept documents fill shards 0-2: copies start in shard 3
    assert rows == [(3, (5, "a", "s", "A")), (3, (6, "a", "s", "A")), (4, (7, "b", "s", "B"))]


def test_rank_offsets_and_hub_parquet_selection() -> None:
    assert rank_offsets([(3, 5), (0, 2), (1, 0)]) == {0: 0, 1: 2, 3: 2}
    names = ["README.md", "data/rus_Cyrl/train/000_00001.parquet", "data/rus_Cyrl/train/000_00000.parquet",
             "data/rus_Cyrl/test/000_00000.parquet", "data/ukr_Cyrl/train/000_00000.parquet",
             "default/train-00000-of-00002.parquet"]
    assert select_parquet_files(names, "rus_Cyrl", "train") == [
        "data/rus_Cyrl/train/000_00000.parquet", "data/rus_Cyrl/train/000_00001.parquet"]
    assert select_parquet_files(names, "default", "train") == ["default/train-00000-of-00002.parquet"]


def test_beam_on_two_worker_processes_equals_local_and_driver_opens_no_data(tmp_path: Path, inputs: Path) -> None:  # noqa: F811
    import_extra("apache_beam", "beam")
    # plant near-copies of the same text so dedup chains and buckets with several members are exercised
    words = (Path(__file__).parent / "fixtures" / "corpus" / "ru_letter.txt").read_text(encoding="utf-8").split(" ")
    rng = random.Random(3)
    for i in range(4):
        copy = list(words)
        for _ in range(2):
            j = rng.randrange(1, len(copy) - 1)
            copy[j], copy[j + 1] = copy[j + 1], copy[j]
        (inputs / "txt" / f"y_letter_{i}.txt").write_text(" ".join(copy), encoding="utf-8")
    sources = sources_for(inputs)
    sources[0]["max_bytes"] = 14_000  # a cap that stops the source before its last file
    sources[1]["max_documents"] = 5
    # tiny shards: several workers write several shards, whose names and bytes must still match
    # rehydration too: the copies of each cluster's kept document follow the deduplicated shards
    local = run(make_cfg(tmp_path / "local", sources, workers=1, docs_per_shard=2, dedup={"rehydrate": True}))
    beam_cfg = make_cfg(tmp_path / "beam", sources, runner="beam", beam_options=TWO_WORKERS, docs_per_shard=2,
                        dedup={"rehydrate": True})
    wandb_run = RecordingRun()
    with opened_files() as opened:  # W&B too: its corpus reference takes the workers' checksums
        build_corpus(beam_cfg, RunFolder.for_config(beam_cfg), wandb_run)
    beam = (read_corpus_manifest(RunFolder.for_config(beam_cfg).corpus),
            list(iter_documents(RunFolder.for_config(beam_cfg).corpus)))
    beam_corpus = RunFolder.for_config(beam_cfg).corpus
    assert beam[1] == local[1]
    assert beam[0]["counts"] == local[0]["counts"] and beam[0]["sources"] == local[0]["sources"]
    assert beam[0]["counts"]["duplicates"]["near"] >= 2 and len(beam[0]["shards"]) >= 2
    assert local[0]["counts"]["in"] < 20  # the caps cut both sources
    assert beam[0]["runner"] == "beam" and local[0]["runner"] == "local"
    assert beam[0]["shards"] == local[0]["shards"]
    assert beam[0]["rehydrated_copies"] == local[0]["rehydrated_copies"] >= 3
    report = (beam_corpus / "report.md").read_text(encoding="utf-8")
    local_report = (RunFolder.for_config(make_cfg(tmp_path / "local", sources)).corpus / "report.md").read_text("utf-8")
    def untimed(text: str) -> str:  # the one runner-dependent figure: the wall time and the rate it gives
        return re.sub(r", \d+ s \([\d.]+ MB/s\)\.\n", ".\n", text, count=1)

    assert untimed(report) == untimed(local_report) != report  # the same counts, sources and examples
    data_opens = [p for p in opened if p.startswith(str(inputs)) or Path(p).name.startswith("docs-")]
    assert data_opens == [], f"the driver opened data files: {data_opens}"
    assert any("report.md" in p for p in opened)  # the guard sees what this process opens
    assert_same_entries_as_wandb_reads(wandb_run.artifacts[-1], beam_corpus)


def test_atomic_create_puts_a_file_in_place_only_when_complete(tmp_path: Path) -> None:
    import_extra("apache_beam", "beam")
    import base64
    import hashlib

    from data_prep.beam_common import atomic_create, file_reference

    target = str(tmp_path / "out" / "docs-00000.jsonl")
    with pytest.raises(RuntimeError), atomic_create(target) as handle:
        handle.write(b"half")
        raise RuntimeError("worker died")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())  # no file, no temporary
    for data in (b"first", b"second"):  # a retried bundle rewrites the same name
        with atomic_create(target) as handle:
            handle.write(data)
    assert Path(target).read_bytes() == b"second" and [p.name for p in (tmp_path / "out").iterdir()] == [
        "docs-00000.jsonl"]
    assert file_reference(target, handle) == {"name": "docs-00000.jsonl", "uri": target, "size": 6,
                                              "md5": base64.b64encode(hashlib.md5(b"second").digest()).decode()}


def test_a_data_error_on_a_worker_comes_back_as_one_line(tmp_path: Path) -> None:
    import_extra("apache_beam", "beam")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["текст"]}), tmp_path / "rows.parquet")
    cfg = make_cfg(tmp_path, [{"kind": "files", "paths": [str(tmp_path / "rows.parquet")]}], runner="beam")
    with pytest.raises(DataError,
                       match=r"rows.parquet: no column 'text' \(columns: body\); set the source's text_field$"):
        build_corpus(cfg, RunFolder.for_config(cfg), None)


def local_folder_filesystem(root: Path) -> type:
    """A Beam FileSystem for the scheme ``testfs://`` over a local folder: a non-local scheme, as gs://
    is to the pipelines, without a network. Registered by being defined (Beam finds subclasses)."""
    from apache_beam.io.filesystem import FileMetadata
    from apache_beam.io.localfilesystem import LocalFileSystem

    prefix = "testfs://"

    def local(uri: str) -> str:  # the base class calls its own methods with local paths too
        return str(root / uri[len(prefix):]) if uri.startswith(prefix) else uri

    def remote(metadata: Any) -> Any:
        return FileMetadata(prefix + os.path.relpath(metadata.path, root), metadata.size_in_bytes,
                            metadata.last_updated_in_seconds)

    class LocalFolderFileSystem(LocalFileSystem):  # type: ignore[misc]
        @classmethod
        def scheme(cls) -> str:
            return "testfs"

        def join(self, basepath: str, *paths: str) -> str:  # the local one makes the base absolute
            return posixpath.join(basepath, *paths)

        def split(self, path: str) -> tuple[str, str]:
            return posixpath.split(path)

        def mkdirs(self, path: str) -> None:
            super().mkdirs(local(path))

        def _list(self, dir_or_prefix: str) -> Iterator[Any]:
            return (remote(m) for m in super()._list(local(dir_or_prefix)))

        def create(self, path: str, *args: Any, **kwargs: Any) -> Any:
            return super().create(local(path), *args, **kwargs)

        def open(self, path: str, *args: Any, **kwargs: Any) -> Any:
            return super().open(local(path), *args, **kwargs)

        def copy(self, sources: list[str], destinations: list[str]) -> None:
            super().copy([local(p) for p in sources], [local(p) for p in destinations])

        def rename(self, sources: list[str], destinations: list[str]) -> None:
            super().rename([local(p) for p in sources], [local(p) for p in destinations])

        def exists(self, path: str) -> bool:
            return bool(super().exists(local(path)))

        def size(self, path: str) -> int:
            return int(super().size(local(path)))

        def metadata(self, path: str) -> Any:
            return remote(super().metadata(local(path)))

        def delete(self, paths: list[str]) -> None:
            for path in map(local, paths):
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    return LocalFolderFileSystem


def test_recipes_01_and_03_on_beam_read_and_write_a_remote_scheme_like_local(tmp_path: Path, inputs: Path) -> None:  # noqa: F811
    """Inputs (with a .zst) and outputs of both Beam paths on ``testfs://`` give the local runner's corpus
    and shards, byte for byte; the run folders keep only manifests and reports."""
    import_extra("apache_beam", "beam")
    zstandard = import_extra("zstandard", "zstd")
    from data_prep.shards.build import shard_corpus
    from data_prep.shards.loader import iter_eval_batches
    from model.llama.config import LlamaConfig
    from tests.test_corpus_build import fixture
    from tests.test_shards_common import DisabledRun, shards_cfg, write_tokenizer

    with pytest.raises(ConfigError, match="corpus.output_uri': is written by Beam workers"):
        make_cfg(tmp_path, sources_for(inputs), output_uri="testfs://bucket/corpus")  # the local runner
    with pytest.raises(ConfigError, match="shards.output_uri': is written by Beam workers"):
        shards_cfg(output_uri="testfs://bucket/shards").validate("shards")
    lines = [json.dumps({"text": fixture("ru_recipe.txt")[::-1]}, ensure_ascii=False), "{not json"]
    (inputs / "packed.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    filesystem = local_folder_filesystem(tmp_path)
    try:
        def on_testfs(sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{**s, "paths": [f"testfs://{Path(p).relative_to(tmp_path)}" for p in s["paths"]]} for s in sources]

        sources = sources_for(inputs)
        sources[1]["paths"].append(str(inputs / "*.jsonl.zst"))
        local_cfg = make_cfg(tmp_path / "local", sources, workers=1, docs_per_shard=2)
        local = run(local_cfg)
        beam_cfg = make_cfg(tmp_path / "beam", on_testfs(sources), runner="beam", docs_per_shard=2,
                            beam_options=["--direct_num_workers=2", "--direct_running_mode=multi_threading"],
                            output_uri="testfs://bucket/corpus")
        beam_folder = RunFolder.for_config(beam_cfg)
        build_corpus(beam_cfg, beam_folder, None)
        manifest = read_corpus_manifest(beam_folder.corpus)
        assert manifest["data_uri"] == "testfs://bucket/corpus" and not list(beam_folder.corpus.glob("docs-*"))
        written = {p.name: p.read_bytes() for p in (tmp_path / "bucket" / "corpus").glob("docs-*.jsonl")}
        local_folder = RunFolder.for_config(local_cfg)
        assert written == {p.name: p.read_bytes() for p in local_folder.corpus.glob("docs-*.jsonl")}
        assert manifest["shards"] == local[0]["shards"] and manifest["counts"] == local[0]["counts"]
        assert local[0]["counts"]["rejected"]["bad_record"] == 3  # the .zst's bad line was read too
        with pytest.raises(DataError, match="is in testfs://bucket/corpus, not in"):
            next(iter_documents(beam_folder.corpus))

        # recipe 03: the local runner on the local corpus, Beam reading the testfs corpus, writing to testfs
        write_tokenizer(local_folder.tokenizer, local[1])
        shutil.copytree(local_folder.tokenizer, beam_folder.tokenizer)
        shards = {"packing": "document", "records_per_shard": 3, "validation_percent": 40.0}
        cfg = SimpleNamespace(experiment=SimpleNamespace(name="t"), shards=shards_cfg(**shards),
                              model=LlamaConfig(max_seq_len=32))
        local_shards = shard_corpus(cfg, local_folder, DisabledRun())
        cfg.shards = shards_cfg(**shards, runner="beam", output_uri="testfs://bucket/shards")
        beam_shards = shard_corpus(cfg, beam_folder, DisabledRun())
        assert beam_shards["splits"] == local_shards["splits"] and beam_shards["data_uri"] == "testfs://bucket/shards"
        local_bytes = {p.name: p.read_bytes() for p in local_folder.shards.glob("*.tfrecord*")}
        assert len(local_bytes) >= 4 and not list(beam_folder.shards.glob("*.tfrecord*"))
        assert {p.name: p.read_bytes() for p in (tmp_path / "bucket" / "shards").glob("*.tfrecord*")} == local_bytes
        assert not [p for p in (tmp_path / "bucket").rglob(".*")]  # no temporary files or summaries left
        with pytest.raises(DataError, match="is in testfs://bucket/shards .shards.output_uri., not in"):
            next(iter_eval_batches(beam_folder.shards, "train", 2))
        for path in (tmp_path / "bucket" / "shards").iterdir():  # copied next to the manifest, the loader reads them
            shutil.copy(path, beam_folder.shards)
        beam_batch, local_batch = (next(iter_eval_batches(f.shards, "train", 2)) for f in (beam_folder, local_folder))
        assert all(np.array_equal(beam_batch[k], local_batch[k]) for k in local_batch)
    finally:
        filesystem.scheme = classmethod(lambda cls: "testfs-retired")  # unregister for later tests


@pytest.mark.integration
def test_recipe_02_trains_the_tokenizer_in_the_beam_venv(tmp_path: Path) -> None:
    """Recipe 02 runs in the venv docs/corpus.md has Beam users build (Beam pins protobuf below 7): SentencePiece's
    generated model module, made by a newer protobuf, refused that runtime at import (a VersionError traceback)."""
    import_extra("apache_beam", "beam")
    from tests.fixture_run import fixture_config
    from tests.recipe_runner import run_recipe
    from tokenizer.model_proto import read_model
    from tokenizer.normalization import NORMALIZATION_NAME

    config = fixture_config(tmp_path)
    run_recipe("01_build_corpus.py", config)
    run_recipe("02_train_tokenizer.py", config, subprocess_=True)  # a fresh interpreter of this venv
    model = read_model((tmp_path / "runs" / "tiny" / "tokenizer" / "spm.model").read_bytes())
    assert model.normalizer_spec.name == NORMALIZATION_NAME and len(model.pieces) == 600


@pytest.mark.shared_data(RUSLIT)
def test_invalid_utf8_in_one_jsonl_line_rejects_that_line_alone_on_beam(tmp_path: Path) -> None:
    import_extra("apache_beam", "beam")
    path = tmp_path / "tolstoy.jsonl"
    write_jsonl_with_bad_bytes(path)
    source = [{"kind": "files", "name": "tolstoy", "paths": [str(path)]}]
    local = run(make_cfg(tmp_path / "local", source, workers=1))
    beam_cfg = make_cfg(tmp_path / "beam", source, runner="beam", beam_options=TWO_WORKERS)
    manifest, docs = run(beam_cfg)
    assert manifest["counts"] == local[0]["counts"] and docs == local[1]
    assert manifest["counts"]["rejected"] == {"invalid_utf8": 1} and manifest["counts"]["kept"] == len(docs) == 199
    report = (RunFolder.for_config(beam_cfg).corpus / "report.md").read_text(encoding="utf-8")
    assert f"from `{path}:10`" in report


@pytest.mark.shared_data(BENCH)
@pytest.mark.parametrize("action", ["remove", "cut"])
def test_beam_decontaminates_as_the_local_runner_does(tmp_path: Path, action: str) -> None:
    import_extra("apache_beam", "beam")
    lines = [line.strip() for path in CLEAN_TEXT for line in path.read_text(encoding="utf-8").splitlines()]
    sources = write_sources(tmp_path, [line for line in lines if len(line) > 300][:30], planted_items())
    local_cfg = make_decontam_cfg(tmp_path / "local", sources, action=action)
    local_cfg.corpus.workers = 2  # the index travels to spawned pool workers as it does to Beam's
    local = build(local_cfg)
    beam = build(make_decontam_cfg(tmp_path / "beam", sources, runner="beam", action=action))
    assert beam[1] == local[1] and beam[0]["counts"] == local[0]["counts"] and beam[0]["shards"] == local[0]["shards"]
    assert beam[0]["decontamination"] == local[0]["decontamination"]
    # removed: each item whole and inside a paragraph; cut: the whole ones (nothing is left of them)
    assert beam[0]["counts"]["rejected"] == {f"benchmark:{name}": 2 if action == "remove" else 1
                                             for name in planted_items()}
    assert beam[2].split("## Decontamination")[1] == local[2].split("## Decontamination")[1]
