"""Recipe 3 on a fixture corpus: manifest per CONTRACTS.md section 3, the split rule, round trip
back to the text, determinism, crash safety and the one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import sentencepiece as spm
import yaml

from data_prep.shards.build import shard_corpus
from data_prep.shards.packing import Packer, segments_and_positions
from data_prep.shards.tfrecord import decode_example, index_path, read_index
from experiment.errors import DataError, MissingStageError
from experiment.files import sha256_file
from experiment.split import is_validation
from tests.test_shards_common import (  # noqa: F401
    DisabledRun,
    built_shards,
    make_documents,
    make_run,
    write_tokenizer,
)
from tests.tfrecord_scan import iter_records

REPO = Path(__file__).resolve().parents[1]


def split_rows(shards_dir: Path, manifest: dict, split: str) -> list[dict[str, np.ndarray]]:
    rows = []
    for shard in manifest["splits"][split]["shards"]:
        rows.extend(decode_example(payload) for _offset, payload in iter_records(shards_dir / shard["file"]))
    return rows


def split_docs(docs: list[dict], split: str, percent: float) -> list[dict]:
    return [d for d in docs if is_validation(d["id"], percent) == (split == "validation")]


def test_manifest_follows_the_contract(built_shards: SimpleNamespace) -> None:  # noqa: F811
    shards_dir, manifest = built_shards.run_folder.shards, built_shards.manifest
    on_disk = json.loads((shards_dir / "manifest.json").read_text(encoding="utf-8"))
    assert on_disk["stage"] == "shards"
    for key in ("tokenizer_sha256", "seq_len", "packing", "feature_schema", "validation_percent", "splits", "config"):
        assert key in on_disk, key
    assert on_disk["tokenizer_sha256"] == sha256_file(built_shards.run_folder.tokenizer / "spm.model")
    assert on_disk["seq_len"] == built_shards.cfg.model.max_seq_len == 32  # the model's one length, by construction
    assert on_disk["feature_schema"]["features"] == {"input_ids": {"dtype": "int64", "shape": [33]}}
    for split in ("train", "validation"):
        info = manifest["splits"][split]
        assert info["records"] == sum(s["records"] for s in info["shards"]) > 0
        for number, shard in enumerate(info["shards"]):
            path = shards_dir / shard["file"]
            assert shard["file"] == f"{split}-{number:05d}.tfrecord"
            assert shard["sha256"] == sha256_file(path)
            assert read_index(path).size == shard["records"] <= 16
            assert shard["tokens"] == shard["records"] * 33
    assert not [p for p in shards_dir.iterdir() if p.name.endswith(".tmp")]
    (artifact,) = built_shards.wandb.artifacts  # the shards folder, naming the tokenizer it was made with
    assert artifact.type == "shards" and artifact.name == "t-shards"
    assert artifact.metadata["tokenizer_sha256"] == on_disk["tokenizer_sha256"]
    assert artifact.metadata["tokenizer_artifact"] == "t-tokenizer"
    assert built_shards.wandb.summary["shards/train_records"] == manifest["splits"]["train"]["records"]


def test_concat_round_trip_gives_the_text_back(built_shards: SimpleNamespace) -> None:  # noqa: F811
    """The decoded token stream is the split's documents joined by EOS, up to the dropped tail."""
    sp = spm.SentencePieceProcessor(model_file=str(built_shards.run_folder.tokenizer / "spm.model"))
    for split in ("train", "validation"):
        stream = np.concatenate([r["input_ids"] for r in split_rows(built_shards.run_folder.shards,
                                                                    built_shards.manifest, split)])
        docs = split_docs(built_shards.docs, split, 10.0)
        expected = np.concatenate([sp.encode(d["text"]) + [3] for d in docs])
        dropped = built_shards.manifest["splits"][split]["dropped_tokens"]
        assert 0 <= dropped < 33 and stream.size + dropped == expected.size
        assert np.array_equal(stream, expected[:stream.size])
        texts = [sp.decode(piece.tolist()) for piece in np.split(stream, np.flatnonzero(stream == 3) + 1)]
        assert texts[:-1] == [d["text"] for d in docs][:len(texts) - 1]


def test_document_packing_round_trip_is_exact(tmp_path: Path) -> None:
    run = make_run(tmp_path, packing="document")
    manifest = shard_corpus(run.cfg, run.run_folder, DisabledRun())
    sp = spm.SentencePieceProcessor(model_file=str(run.run_folder.tokenizer / "spm.model"))
    assert set(manifest["feature_schema"]["features"]) == {"input_ids", "segment_ids", "positions"}
    for split in ("train", "validation"):
        rows = split_rows(run.run_folder.shards, manifest, split)
        tokens = np.concatenate([r["input_ids"][r["segment_ids"] > 0] for r in rows])
        texts = [sp.decode(piece.tolist()) for piece in np.split(tokens, np.flatnonzero(tokens == 3) + 1)[:-1]]
        assert texts == [d["text"] for d in split_docs(run.docs, split, 10.0)]
        assert manifest["splits"][split]["tokens"] == tokens.size
        assert manifest["splits"][split]["dropped_tokens"] == 0
        for row in rows:  # positions restart where a segment starts; segments count up inside the row
            seg, pos = row["segment_ids"], row["positions"]
            real = seg > 0
            assert np.all(np.diff(seg[real]) >= 0) and seg[real][0] == 1
            starts = np.flatnonzero(np.diff(np.concatenate(([0], seg))) != 0)
            assert np.all(pos[starts[seg[starts] > 0]] == 0)


def test_packer_marks_documents_and_padding() -> None:
    packer = Packer(seq_len=5, mode="document", pad_id=0)
    rows = packer.add([[7, 7, 3], [8, 3], [9, 9, 9, 9, 9, 3]])
    assert rows["input_ids"].tolist() == [[7, 7, 3, 8, 3, 9]]
    assert rows["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 3]]
    assert rows["positions"].tolist() == [[0, 1, 2, 0, 1, 0]]
    last = packer.finish()
    assert last["input_ids"].tolist() == [[9, 9, 9, 9, 3, 0]]
    assert last["segment_ids"].tolist() == [[1, 1, 1, 1, 1, 0]]
    assert last["positions"].tolist() == [[0, 1, 2, 3, 4, 0]]
    assert packer.stats.padding_tokens == 1 and packer.stats.tokens == 11
    concat = Packer(seq_len=5, mode="concat")
    assert concat.add([[1, 2, 3, 4], [5, 6, 7]])["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6]]
    assert concat.finish()["input_ids"].shape == (0, 6) and concat.stats.dropped_tokens == 1
    seg, pos = segments_and_positions(np.array([4, 4, 5, 6, 6, 6]))
    assert seg.tolist() == [1, 1, 2, 3, 3, 3] and pos.tolist() == [0, 1, 0, 0, 1, 2]


def test_split_is_by_document_hash_and_stable_when_the_corpus_grows(tmp_path: Path) -> None:
    docs = make_documents(80)
    small = make_run(tmp_path / "small", docs=docs[:40], packing="document")
    grown = make_run(tmp_path / "grown", docs=docs, packing="document")
    manifests = [shard_corpus(r.cfg, r.run_folder, DisabledRun()) for r in (small, grown)]
    for run, manifest in zip((small, grown), manifests, strict=True):
        assert manifest["splits"]["validation"]["documents"] == len(split_docs(run.docs, "validation", 10.0))
    assert {d["id"] for d in split_docs(docs[:40], "validation", 10.0)} <= {
        d["id"] for d in split_docs(docs, "validation", 10.0)}


def test_output_does_not_depend_on_threads_or_batching(tmp_path: Path) -> None:
    run = make_run(tmp_path, docs=make_documents(40), num_threads=1, encode_batch_documents=3)
    digests = []
    for threads, batch in ((1, 3), (2, 64)):
        run.cfg.shards.num_threads, run.cfg.shards.encode_batch_documents = threads, batch
        manifest = shard_corpus(run.cfg, run.run_folder, DisabledRun())
        digests.append([(s["file"], s["sha256"]) for split in manifest["splits"].values() for s in split["shards"]])
    assert digests[0] == digests[1] and len(digests[0]) > 2


def test_crash_leaves_no_manifest_and_no_partial_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path)
    shard_corpus(run.cfg, run.run_folder, DisabledRun())
    import data_prep.shards.build as shards_build

    real_iter = shards_build.iter_documents

    def dying_documents(*args: object, **kwargs: object):
        for number, doc in enumerate(real_iter(*args, **kwargs)):
            if number == 30:
                raise OSError("disk went away")
            yield doc

    monkeypatch.setattr(shards_build, "iter_documents", dying_documents)
    with pytest.raises(OSError, match="disk went away"):
        shard_corpus(run.cfg, run.run_folder, DisabledRun())
    assert not (run.run_folder.shards / "manifest.json").exists()
    for path in run.run_folder.shards.glob("*.tfrecord"):  # completed shards only, each with its index
        assert index_path(path).is_file() and read_index(path).size == 16
    assert not list(run.run_folder.shards.glob(".*tmp"))


def test_missing_tokenizer_is_one_clear_error(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run.run_folder.tokenizer / "manifest.json").unlink()
    with pytest.raises(MissingStageError, match=r"run recipes/02_train_tokenizer.py first"):
        shard_corpus(run.cfg, run.run_folder, DisabledRun())


def test_a_tokenizer_without_padding_pads_with_eos_in_shards_and_eval(tmp_path: Path) -> None:
    from eval.run import load_run_tokenizer

    run = make_run(tmp_path, packing="document")
    write_tokenizer(run.run_folder.tokenizer, run.docs, special={"pad": -1, "unk": 0, "bos": 1, "eos": 2})
    manifest = shard_corpus(run.cfg, run.run_folder, DisabledRun())
    bits = load_run_tokenizer(run.run_folder.tokenizer)
    assert manifest["special_ids"] == {"eos": 2, "pad": 2}
    assert (bits.eos_id, bits.pad_id) == (2, 2)


def test_corpus_too_small_for_one_row(tmp_path: Path) -> None:
    run = make_run(tmp_path, seq_len=100_000)
    with pytest.raises(DataError, match="no full training row of 100001 tokens: lower model.max_seq_len"):
        shard_corpus(run.cfg, run.run_folder, DisabledRun())
    assert not (run.run_folder.shards / "manifest.json").exists()


@pytest.mark.integration
def test_recipe_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({"experiment": {"name": "x", "run_root": str(tmp_path / "runs")},
                                      "wandb": {"mode": "disabled"}}), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(REPO / "recipes" / "03_shard.py"), "--config", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "WANDB_MODE": "disabled", "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("error: tokenizer output not found") and "recipes/02_train_tokenizer.py" in last


def test_bad_config_values_name_the_key() -> None:
    from experiment.errors import ConfigError
    from experiment.sections.shards import ShardsConfig

    with pytest.raises(ConfigError, match="'shards.records_per_shard'"):
        ShardsConfig(records_per_shard=0).validate("shards")
    with pytest.raises(ConfigError, match="'shards.validation_percent'"):
        ShardsConfig(validation_percent=100.0).validate("shards")


def test_beam_runner_without_beam_is_one_clear_error(tmp_path: Path) -> None:
    try:
        import apache_beam  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("Apache Beam is installed here; tests/test_shard_beam.py covers the runner")
    from experiment.errors import ConfigError

    run = make_run(tmp_path, runner="beam")
    with pytest.raises(ConfigError, match=r"'shards.runner': 'beam' needs the beam extra"):
        shard_corpus(run.cfg, run.run_folder, DisabledRun())


@pytest.mark.shared_data
def test_round_trip_on_real_russian_prose(tmp_path: Path, shared_data: Path) -> None:
    """Pushkin's prose (ё, dashes, quotes, rare characters through byte fallback) comes back exactly."""
    text = (shared_data / "text" / "ruslit" / "prose" / "Pushkin" / "Дубровский.txt").read_text(encoding="utf-8")
    lines = text.split("\n")
    docs = [{"id": f"dubrovsky-{i}", "source": "ruslit", "text": "\n".join(lines[i:i + 10])}
            for i in range(0, len(lines), 10)]
    assert split_docs(docs, "validation", 10.0), "the fixture needs a few validation documents"
    run = make_run(tmp_path, docs=docs, packing="document", seq_len=256, records_per_shard=64)
    manifest = shard_corpus(run.cfg, run.run_folder, DisabledRun())
    sp = spm.SentencePieceProcessor(model_file=str(run.run_folder.tokenizer / "spm.model"))
    for split in ("train", "validation"):
        rows = split_rows(run.run_folder.shards, manifest, split)
        tokens = np.concatenate([r["input_ids"][r["segment_ids"] > 0] for r in rows])
        texts = [sp.decode(piece.tolist()) for piece in np.split(tokens, np.flatnonzero(tokens == 3) + 1)[:-1]]
        assert texts == [d["text"] for d in split_docs(docs, split, 10.0)]


def test_online_run_declares_the_tokenizer_artifact_as_input(tmp_path: Path) -> None:
    class RecordingRun(DisabledRun):
        def __init__(self) -> None:
            super().__init__()
            self.used: list[object] = []

        def use_artifact(self, artifact: object) -> None:
            self.used.append(artifact)

    run = make_run(tmp_path, docs=make_documents(20))
    wandb_run = RecordingRun()
    shard_corpus(run.cfg, run.run_folder, wandb_run)
    (used,) = wandb_run.used
    assert used.type == "tokenizer" and used.name == "t-tokenizer"
    assert "spm.model" in used.manifest.entries and len(wandb_run.artifacts) == 1
