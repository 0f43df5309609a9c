"""Recipe 01 end to end on small local inputs: sources, bad input, accounting, pool, crash safety."""

from __future__ import annotations

import gzip
import json
import os
import random
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from data_prep.corpus import build as corpus_module
from data_prep.corpus import sources
from data_prep.corpus.build import build_corpus
from data_prep.corpus.documents import DocumentNumberer
from data_prep.corpus.normalize import normalize_text
from data_prep.corpus.sources import SOURCE_READERS, _read_txt, iter_raw_documents, split_text
from experiment.config import build_dataclass
from experiment.corpus_format import iter_documents, read_corpus_manifest
from experiment.errors import ConfigError, DataError, MissingStageError
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig, SourceConfig
from experiment.sections.corpus import SourceKind
from tests.conftest import optional_import

FIXTURES = Path(__file__).parent / "fixtures" / "corpus"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def make_cfg(tmp_path: Path, sources: list[dict[str, Any]], **corpus: Any) -> Any:
    return build_dataclass(ExperimentConfig, {
        "experiment": {"name": "t", "run_root": str(tmp_path / "runs")},
        "corpus": {"sources": sources, **corpus},
    })


def run(cfg: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    folder = RunFolder.for_config(cfg)
    build_corpus(cfg, folder, None)
    return read_corpus_manifest(folder.corpus), list(iter_documents(folder.corpus))


def near_copy(text: str) -> str:
    words = text.split(" ")
    del words[17]
    words[40], words[41] = words[41], words[40]
    return " ".join(words)


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    """A folder of every kind of input, good and bad; the expected outcome of each is in the test."""
    root = tmp_path / "in"
    (root / "txt").mkdir(parents=True)
    for name in ("ru_prose.txt", "ru_news.txt", "uk.txt", "en.txt"):
        (root / "txt" / name).write_text(fixture(name), encoding="utf-8")
    (root / "txt" / "z_copy_of_prose.txt").write_text(fixture("ru_prose.txt"), encoding="utf-8")
    (root / "txt" / "z_near_copy_of_news.txt").write_text(near_copy(fixture("ru_news.txt")), encoding="utf-8")
    (root / "txt" / "cp1251.txt").write_bytes(fixture("ru_letter.txt").encode("cp1251"))
    (root / "txt" / "empty.txt").write_bytes(b"\n \n")
    (root / "txt" / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 8)
    (root / "txt" / "latin_garbage.txt").write_bytes(bytes(range(0xA0, 0x100)) * 10)
    lines = [json.dumps({"text": fixture("ru_science.txt")}, ensure_ascii=False), "{not json",
             json.dumps({"body": "нет поля text"})]
    (root / "records.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(root / "more.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"text": fixture("be.txt")}, ensure_ascii=False) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": [fixture("bg.txt"), fixture("ru_recipe.txt")]})
    pq.write_table(table, root / "rows.parquet")
    return root


def sources_for(root: Path) -> list[dict[str, Any]]:
    return [
        {"kind": "files", "name": "books", "paths": [str(root / "txt")]},
        {"kind": "files", "name": "records", "paths": [str(root / "*.jsonl"), str(root / "*.jsonl.gz"),
                                                       str(root / "*.parquet")]},
    ]


EXPECTED_REJECTED = {
    "language_uk": 1, "language_be": 1, "language_bg": 1, "low_cyrillic": 1, "empty_input": 1, "binary": 1,
    "invalid_utf8": 1, "bad_record": 2,
}


def test_build_counts_every_input_document(tmp_path: Path, inputs: Path) -> None:
    cfg = make_cfg(tmp_path, sources_for(inputs), workers=1, docs_per_shard=2)
    manifest, docs = run(cfg)
    counts = manifest["counts"]
    assert counts["rejected"] == EXPECTED_REJECTED
    assert counts["duplicates"] == {"exact": 1, "near": 1}
    assert counts["kept"] == len(docs) == manifest["documents"] == 5
    assert counts["in"] == counts["kept"] + sum(counts["rejected"].values()) + sum(counts["duplicates"].values())
    assert counts["in"] == 16
    # shards: two documents each, sizes and hashes match the files
    assert [s["documents"] for s in manifest["shards"]] == [2, 2, 1]
    corpus_dir = RunFolder.for_config(cfg).corpus
    for shard in manifest["shards"]:
        import hashlib

        data = (corpus_dir / shard["file"]).read_bytes()
        assert len(data) == shard["bytes"] and hashlib.sha256(data).hexdigest() == shard["sha256"]
    kept_sources = {d["id"].split(":")[0] for d in docs}
    assert kept_sources == {"books", "records"}
    assert any("Дорогая Анна Петровна!" in d["text"] for d in docs), "the cp1251 file is decoded and kept"
    assert all(d["text"] == normalize_text(d["text"]) for d in docs)
    assert {s["name"]: s["documents_in"] for s in manifest["sources"]} == {"books": 10, "records": 6}
    assert manifest["input_bytes"]["in"] == sum(s["bytes_in"] for s in manifest["sources"])
    report = (corpus_dir / "report.md").read_text(encoding="utf-8")
    assert "language_uk" in report and "duplicate_near" in report


def test_ids_are_stable_and_the_run_repeats_exactly(tmp_path: Path, inputs: Path) -> None:
    cfg = make_cfg(tmp_path, sources_for(inputs), workers=1)
    first = run(cfg)[1]
    second = run(cfg)[1]
    assert first == second
    assert all(d["id"].count(":") == 2 for d in first)


def test_worker_pool_gives_the_same_corpus_as_one_process(tmp_path: Path, inputs: Path) -> None:
    serial = run(make_cfg(tmp_path / "a", sources_for(inputs), workers=1))
    pooled = run(make_cfg(tmp_path / "b", sources_for(inputs), workers=2))
    assert pooled[1] == serial[1]
    assert pooled[0]["counts"] == serial[0]["counts"]
    assert pooled[0]["workers"] == 2


def test_crash_mid_run_leaves_nothing_trusted_and_rerun_completes(
        tmp_path: Path, inputs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_cfg(tmp_path, sources_for(inputs), workers=1, docs_per_shard=1)
    good_manifest, good_docs = run(cfg)
    corpus_dir = RunFolder.for_config(cfg).corpus
    real = corpus_module.clean_document
    calls = {"n": 0}

    def crash_after_some(raw: Any, corpus_cfg: Any, *benchmarks: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 12:
            raise RuntimeError("simulated crash")
        return real(raw, corpus_cfg, *benchmarks)

    monkeypatch.setattr(corpus_module, "clean_document", crash_after_some)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_corpus(cfg, RunFolder.for_config(cfg), None)
    assert not (corpus_dir / "manifest.json").exists()
    with pytest.raises(MissingStageError, match="01_build_corpus.py"):
        list(iter_documents(corpus_dir))
    assert not list(corpus_dir.glob(".*.tmp"))
    monkeypatch.setattr(corpus_module, "clean_document", real)
    manifest, docs = run(cfg)
    assert docs == good_docs and manifest["shards"] == good_manifest["shards"]
    assert sorted(p.name for p in corpus_dir.glob("docs-*.jsonl")) == [s["file"] for s in manifest["shards"]]


def test_empty_corpus_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "en.txt").write_text(fixture("en.txt"), encoding="utf-8")
    cfg = make_cfg(tmp_path, [{"kind": "files", "paths": [str(tmp_path / "en.txt")]}], workers=1)
    with pytest.raises(DataError, match="corpus is empty after filtering.*low_cyrillic 1"):
        build_corpus(cfg, RunFolder.for_config(cfg), None)
    assert not (RunFolder.for_config(cfg).corpus / "manifest.json").exists()


def test_missing_local_path_is_one_clear_error(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, [{"kind": "files", "paths": [str(tmp_path / "nowhere" / "*.txt")]}], workers=1)
    with pytest.raises(DataError, match=r"corpus.sources\[0\].paths: .*nowhere.* matches no files"):
        build_corpus(cfg, RunFolder.for_config(cfg), None)
    cfg = make_cfg(tmp_path, [{"kind": "files", "paths": [str(tmp_path / "missing.jsonl")]}], workers=1)
    with pytest.raises(DataError, match="missing.jsonl does not exist"):
        build_corpus(cfg, RunFolder.for_config(cfg), None)


def test_unreadable_file_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "locked.txt"
    path.write_text(fixture("ru_prose.txt"), encoding="utf-8")

    def refuse(path: object) -> bytes:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(sources, "open_input", refuse)  # every reader opens local paths and URLs through it
    numberer = DocumentNumberer(SourceConfig(kind="files", paths=[str(path)]), 0)
    [doc] = list(_read_txt(path, numberer))
    assert doc.reject == "unreadable" and doc.text is None


def test_unknown_source_kind_is_one_config_error(tmp_path: Path) -> None:
    # built in code, past the config loader's check: the reader must not fall through to another kind
    good = SourceConfig(kind="files", paths=[str(FIXTURES / "ru_prose.txt")])
    odd = SourceConfig(kind="ftp", paths=[])  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        next(iter_raw_documents([good, odd], tmp_path))  # before the first source is read
    message = str(err.value)
    assert "\n" not in message and "corpus.sources[1].kind" in message and "'ftp'" in message
    assert "debian, files, hub" in message


def test_every_configurable_source_kind_has_a_reader() -> None:
    assert set(SOURCE_READERS) == set(get_args(SourceKind))


def test_split_rules_for_long_works() -> None:
    text = "\n\n".join(f"Строфа {i}\nвторая строка\nтретья строка" for i in range(10))
    assert split_text(text, "file", 100) == [text]
    assert len(split_text(text, "paragraph", 100)) == 10
    chunks = split_text(text, "chunk", 100)
    assert all(len(c) <= 100 for c in chunks) and len(chunks) == 5
    assert "\n\n".join(chunks) == text
    long_block = "\n".join(f"строка прозы номер {i}" for i in range(100))
    assert all(len(c) <= 300 for c in split_text(long_block, "chunk", 300))


def test_mixture_weight_and_caps(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    rng = random.Random(0)
    words = fixture("ru_prose.txt").split()
    for i in range(40):
        rng.shuffle(words)
        (folder / f"{i:02d}.txt").write_text(" ".join(words), encoding="utf-8")
    weighted = SourceConfig(kind="files", name="w", paths=[str(folder)], weight=0.5)
    docs = list(iter_raw_documents([weighted], tmp_path))
    sampled_out = [d for d in docs if d.reject == "mixture_weight"]
    assert len(docs) == 40 and 8 <= len(sampled_out) <= 32
    assert [d.id for d in docs] == [d.id for d in iter_raw_documents([weighted], tmp_path)]
    capped = SourceConfig(kind="files", name="c", paths=[str(folder)], max_documents=7)
    by_bytes = SourceConfig(kind="files", name="b", paths=[str(folder)], max_bytes=3000)
    docs = list(iter_raw_documents([capped, by_bytes], tmp_path))
    assert sum(d.source == "c" for d in docs) == 7
    assert 1 <= sum(d.source == "b" for d in docs) < 40
    assert [d.order for d in docs] == list(range(len(docs)))


def test_hub_source_reads_local_files_of_the_same_schema(tmp_path: Path, inputs: Path) -> None:
    cfg = make_cfg(tmp_path, [{"kind": "hub", "name": "hubjson", "dataset": "json",
                               "paths": [str(inputs / "more.jsonl.gz")], "text_field": "text"}],
                   workers=1)
    with pytest.raises(DataError, match="corpus is empty.*language_be 1"):  # the one record is Belarusian
        build_corpus(cfg, RunFolder.for_config(cfg), None)
    (tmp_path / "ru.jsonl").write_text(json.dumps({"text": fixture("ru_prose.txt")}, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    cfg.corpus.sources[0].paths = [str(tmp_path / "ru.jsonl")]
    manifest, docs = run(cfg)
    assert manifest["counts"]["kept"] == 1 and docs[0]["id"].startswith("hubjson:000000000:")


def test_unreachable_hub_id_fails_fast_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = make_cfg(tmp_path, [{"kind": "hub", "dataset": "no-such-org/no-such-russian-corpus"}], workers=1)
    import time

    started = time.perf_counter()
    with pytest.raises(DataError) as info:
        build_corpus(cfg, RunFolder.for_config(cfg), None)
    assert time.perf_counter() - started < 20
    message = str(info.value)
    assert "\n" not in message and "no-such-org/no-such-russian-corpus" in message and "kind: files" in message


@pytest.mark.skipif(sys.platform != "linux", reason="the recipe CLI test runs the Linux demo path")
@pytest.mark.integration
def test_recipe_cli_reports_data_errors_in_one_line(tmp_path: Path) -> None:
    import subprocess

    config = tmp_path / "c.yaml"
    config.write_text(
        f"experiment: {{name: cli, run_root: {tmp_path / 'runs'}}}\n"
        f"corpus: {{sources: [{{kind: files, paths: ['{tmp_path / 'none' / '*.txt'}']}}]}}\n"
        "wandb: {mode: disabled}\n", encoding="utf-8")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, str(root / "recipes" / "01_build_corpus.py"), "--config", str(config)],
                            capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: corpus.sources[0].paths:")
    assert "Traceback" not in result.stderr


def test_report_tables_reach_an_offline_wandb_run(
        tmp_path: Path, inputs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracking.wandb_run import open_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = make_cfg(tmp_path, sources_for(inputs), workers=1)
    folder = RunFolder.for_config(cfg)
    with open_run(cfg, folder, job_type="corpus") as wandb_run:
        build_corpus(cfg, folder, wandb_run)
        assert wandb_run.summary["corpus/documents_kept"] == 5
        assert wandb_run.summary["corpus/rejected/language_uk"] == 1
    tables = [p.name for p in folder.wandb.rglob("*.table.json")]
    assert any(name.startswith("outcomes") for name in tables) and any(name.startswith("examples") for name in tables)
    outcomes = json.loads(next(folder.wandb.rglob("outcomes*.table.json")).read_text(encoding="utf-8"))
    assert outcomes["columns"] == ["outcome", "documents", "input_bytes"]
    assert outcomes["data"][0][:2] == ["kept", 5]


def test_zstd_jsonl_is_read_or_needs_the_extra(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl.zst"
    line = (json.dumps({"text": fixture("ru_letter.txt")}, ensure_ascii=False) + "\n").encode("utf-8")
    cfg = SourceConfig(kind="files", name="z", paths=[str(path)])
    zstandard = optional_import("zstandard", "zstd")  # the beam venv installs it: the .zst path runs there
    if zstandard is None:
        path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 16)  # a zstd frame header; never decoded
        with pytest.raises(DataError, match=r"docs.jsonl.zst: reading .zst needs the zstd extra"):
            list(iter_raw_documents([cfg], tmp_path))
        return
    path.write_bytes(zstandard.ZstdCompressor().compress(line * 2))
    docs = list(iter_raw_documents([cfg], tmp_path))
    assert [d.text for d in docs] == [fixture("ru_letter.txt")] * 2
