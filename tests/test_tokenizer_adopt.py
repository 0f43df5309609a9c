"""Adopting a base model's tokenizer (recipe 02 ``tokenizer.adopt_from``) and sharding with it (recipe 03).

The base model's tokenizer here is a tiny byte-level BPE ``tokenizer.json`` trained in the test with
the ``tokenizers`` library, in a folder laid out as a Hugging Face model (tokenizer_config.json,
config.json), and the fixture run's own SentencePiece model saved as a base model's ``tokenizer.model``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from data_prep.shards.tfrecord import decode_record
from experiment.corpus_format import iter_documents
from experiment.split import is_validation
from tests.fixture_run import run_copy
from tests.recipe_runner import error_line, run_recipe
from tests.tfrecord_scan import iter_records

MODEL_VOCAB = 512  # the base model's embedding rows: more than its tokenizer has, as Qwen's


def train_split_documents(corpus_dir: Path, validation_percent: float) -> list[dict[str, Any]]:
    return [doc for doc in iter_documents(corpus_dir) if not is_validation(doc["id"], validation_percent)]


def shard_stream(shards_dir: Path, split: str) -> np.ndarray:
    """Every token of a split's shards, in file and record order (concat packing: the corpus stream)."""
    rows = [np.asarray(decode_record(payload, path, offset)["input_ids"], dtype=np.int64)
            for path in sorted(shards_dir.glob(f"{split}-*.tfrecord"))
            for offset, payload in iter_records(path)]
    assert rows, f"no {split} records in {shards_dir}"
    return np.concatenate(rows)


def byte_level_base_model(folder: Path, corpus_dir: Path) -> Path:
    """A Hugging Face-style folder with a byte-level BPE tokenizer.json trained on the corpus."""
    from tokenizer.baselines import train_bytelevel_bpe

    folder.mkdir(parents=True)
    texts = [doc["text"] for doc in iter_documents(corpus_dir)]
    tokenizer = train_bytelevel_bpe(texts, 400)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "bos_token": {"content": "<s>"},
         "pad_token": None}), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "llama", "vocab_size": MODEL_VOCAB, "eos_token_id": 3, "pad_token_id": None}), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def adopted_run(fixture_stages: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Recipes 02 (adopting the byte-level BPE) and 03 on the fixture corpus; (run folder, base folder)."""
    root = tmp_path_factory.mktemp("adopt")
    base = byte_level_base_model(root / "base-model", fixture_stages / "runs" / "tiny" / "corpus")
    config = run_copy(fixture_stages, root / "run")
    # 30% held out: two of the fixture's seven documents, for the report to measure
    overrides = (f"tokenizer.adopt_from={base}", "shards.validation_percent=30")
    run_recipe("02_train_tokenizer.py", config, *overrides)
    run_recipe("03_shard.py", config, *overrides)
    return root / "run" / "runs" / "tiny", base


def test_adopted_manifest_names_kind_hash_vocabulary_and_special_ids(adopted_run: tuple[Path, Path]) -> None:
    from tokenizers import Tokenizer

    from experiment.files import sha256_file
    from experiment.stages import TOKENIZER

    run, base = adopted_run
    manifest = TOKENIZER.read_manifest(run / "tokenizer")
    hf = Tokenizer.from_file(str(base / "tokenizer.json"))
    assert manifest["kind"] == "hf_tokenizer_json"
    assert manifest["sha256"] == sha256_file(base / "tokenizer.json") == sha256_file(
        run / "tokenizer" / "tokenizer.json")
    assert manifest["tokenizer_vocab_size"] == hf.get_vocab_size(with_added_tokens=True) < MODEL_VOCAB
    # the model's rows: config.json's vocab_size, so continuing the base model keeps its embedding table
    assert manifest["vocab_size"] == manifest["model_vocab_size"] == MODEL_VOCAB
    # tokenizer_config.json names the tokens; config.json fills nothing they name; no pad anywhere
    assert manifest["special_ids"] == {"eos": hf.token_to_id("</s>"), "bos": hf.token_to_id("<s>"), "pad": None,
                                       "unk": None}
    assert not (run / "tokenizer" / "spm.model").exists()
    # the HF files travel unchanged for the export
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (run / "tokenizer" / "hf" / name).read_bytes() == (base / name).read_bytes()


def test_report_measures_the_adopted_tokenizer_beside_the_baseline(adopted_run: tuple[Path, Path]) -> None:
    run, _ = adopted_run
    report = json.loads((run / "tokenizer" / "report.json").read_text(encoding="utf-8"))
    assert list(report["tokenizers"]) == ["adopted", "hf_bytelevel_bpe"]
    adopted = report["tokenizers"]["adopted"]["overall"]
    assert adopted["documents"] == 2
    assert adopted["chars_per_token"] == pytest.approx(adopted["chars"] / adopted["tokens"], abs=1e-4)
    assert adopted["roundtrip_exact"] == 1.0  # byte-level BPE decodes back exactly
    assert adopted["byte_fallback_share"] is None  # byte-level: no fallback
    assert "| chars_per_token |" in (run / "tokenizer" / "report.md").read_text(encoding="utf-8")


def test_shards_decode_back_to_the_corpus_through_the_adopted_tokenizer(adopted_run: tuple[Path, Path]) -> None:
    from experiment.stages import SHARDS
    from tokenizer.loaded import load_run_tokenizer

    run, _ = adopted_run
    tokenizer = load_run_tokenizer(run / "tokenizer")
    manifest = SHARDS.read_manifest(run / "shards")
    assert manifest["tokenizer_kind"] == "hf_tokenizer_json"
    assert manifest["special_ids"] == {"eos": tokenizer.eos_id, "pad": tokenizer.eos_id}  # no pad: EOS pads
    stream = shard_stream(run / "shards", "train")
    documents = train_split_documents(run / "corpus", manifest["validation_percent"])
    cuts = np.flatnonzero(stream == tokenizer.eos_id)
    pieces = np.split(stream, cuts + 1)[:-1]  # the last piece is a document cut by the final partial row
    assert len(pieces) >= 2
    assert [tokenizer.decode(piece[:-1]) for piece in pieces] == [doc["text"] for doc in documents[:len(pieces)]]
    # bits per byte counts the text's bytes exactly: the per-id byte lengths add up to each document's size
    lengths = tokenizer.piece_byte_lengths()
    assert lengths.shape == (MODEL_VOCAB,) and lengths[-1] == 0  # a padding row
    for piece, doc in zip(pieces, documents, strict=False):
        assert int(lengths[piece].sum()) == len(doc["text"].encode("utf-8"))


def test_eval_reads_the_adopted_tokenizer(adopted_run: tuple[Path, Path]) -> None:
    from eval.run import load_run_tokenizer  # what recipe 05 encodes and counts bytes with
    from experiment.runfolder import RunFolder

    run, _ = adopted_run
    bits = load_run_tokenizer(RunFolder(run).tokenizer)
    text = "Капитанская дочка, глава I.\n\nСержант гвардии."
    ids = bits.encode(text)
    assert int(bits.piece_byte_lengths()[ids].sum()) == len(text.encode("utf-8"))
    assert bits.piece_byte_lengths()[bits.eos_id] == 0


def test_hf_export_ships_the_adopted_tokenizer_starting_texts_with_eos(adopted_run: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """The base's vocabulary and pipeline as they are; only the post-processor changes: EOS first, as trained."""
    from eval.hf_export import write_export
    from model.llama.config import LlamaConfig
    from model.registry import get_family

    run, base = adopted_run
    cfg = LlamaConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32)
    model = get_family("llama").init(cfg, MODEL_VOCAB, seed=0)
    out = write_export(model, cfg, MODEL_VOCAB, tmp_path / "hf", tokenizer_files=run / "tokenizer" / "hf",
                       special_ids={"eos": 3})
    ours, theirs = (json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")) for folder in (out, base))
    assert ours.pop("post_processor")["type"] == "TemplateProcessing"
    assert ours == {k: v for k, v in theirs.items() if k != "post_processor"}
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 3


def test_a_broken_tokenizer_json_is_one_error_line_naming_it(fixture_stages: Path, tmp_path: Path) -> None:
    base = tmp_path / "base-model"
    base.mkdir()
    (base / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ', encoding="utf-8")
    config = run_copy(fixture_stages, tmp_path / "run")
    proc = run_recipe("02_train_tokenizer.py", config, f"tokenizer.adopt_from={base}", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = error_line(proc)
    assert line.startswith("error: ") and str(base / "tokenizer.json") in line and "tokenizer.json" in line, line
    # the finished tokenizer the copy started with is left as it was
    assert (tmp_path / "run" / "runs" / "tiny" / "tokenizer" / "manifest.json").is_file()


def test_a_missing_source_names_the_key(tmp_path: Path) -> None:
    from experiment.errors import ConfigError
    from tokenizer.adopt import locate_source

    with pytest.raises(ConfigError, match=r"config key 'tokenizer.adopt_from': .*nowhere does not exist"):
        locate_source(str(tmp_path / "nowhere"))
    (tmp_path / "model").mkdir()
    with pytest.raises(ConfigError, match="has neither tokenizer.json nor tokenizer.model"):
        locate_source(str(tmp_path / "model"))
    (tmp_path / "model" / "tokenizer.model").write_bytes(b"")
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    assert locate_source(str(tmp_path / "model")) == ("hf_tokenizer_json", tmp_path / "model" / "tokenizer.json")
    assert locate_source(str(tmp_path / "model" / "tokenizer.model"))[0] == "sentencepiece"


def test_sentencepiece_shards_hold_exactly_what_sentencepiece_encodes(fixture_stages: Path) -> None:
    """Recipe 03 through the tokenizer interface writes, for a trained SentencePiece model, the stream of
    SentencePiece's own ids (+ EOS per document) in corpus order: the shards of before, byte for byte."""
    import sentencepiece as spm

    from experiment.stages import SHARDS, TOKENIZER

    run = fixture_stages / "runs" / "tiny"
    tok_manifest = TOKENIZER.read_manifest(run / "tokenizer")
    assert tok_manifest.get("kind", "sentencepiece") == "sentencepiece"
    sp = spm.SentencePieceProcessor(model_file=str(run / "tokenizer" / "spm.model"))
    manifest = SHARDS.read_manifest(run / "shards")
    assert manifest["packing"] == "concat"
    documents = train_split_documents(run / "corpus", manifest["validation_percent"])
    expected = np.concatenate([np.array([*sp.encode(doc["text"]), sp.eos_id()]) for doc in documents])
    stream = shard_stream(run / "shards", "train")
    assert stream.size == manifest["splits"]["train"]["records"] * (manifest["seq_len"] + 1)
    np.testing.assert_array_equal(stream, expected[:stream.size])


def test_an_adopted_sentencepiece_model_shards_like_the_trained_one(fixture_stages: Path, tmp_path: Path) -> None:
    """A base model folder with a SentencePiece tokenizer.model (here the fixture's own model under that
    name, in a folder whose config.json has more embedding rows) is adopted as kind sentencepiece, and recipe 03
    writes the very shards the trained one gave."""
    base = tmp_path / "base-model"
    base.mkdir()
    shutil.copyfile(fixture_stages / "runs" / "tiny" / "tokenizer" / "spm.model", base / "tokenizer.model")
    (base / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 640}), encoding="utf-8")
    config = run_copy(fixture_stages, tmp_path / "run")
    run_recipe("02_train_tokenizer.py", config, f"tokenizer.adopt_from={base}")
    run_recipe("03_shard.py", config, f"tokenizer.adopt_from={base}")
    run = tmp_path / "run" / "runs" / "tiny"
    manifest = json.loads((run / "tokenizer" / "manifest.json").read_text(encoding="utf-8"))
    assert (manifest["kind"], manifest["model_file"]) == ("sentencepiece", "tokenizer.model")
    assert (manifest["vocab_size"], manifest["tokenizer_vocab_size"]) == (640, 600)  # config.json's rows, its pieces
    assert manifest["special_ids"]["eos"] == 3  # SentencePiece's own ids when no HF file names them
    for shard in sorted((fixture_stages / "runs" / "tiny" / "shards").glob("*.tfrecord*")):
        assert (run / "shards" / shard.name).read_bytes() == shard.read_bytes(), shard.name


def test_special_ids_follow_the_folders_files_in_order(tmp_path: Path) -> None:
    from experiment.errors import DataError
    from tokenizer.adopt import special_ids_from_folder

    vocab = {"<|end_of_text|>": 7, "<|begin_of_text|>": 6, "<pad>": 0}
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [9, 7], "bos_token_id": 6, "pad_token_id": 5}))
    # config.json alone: its ids (the first of several EOS ids ends documents)
    assert special_ids_from_folder(tmp_path, vocab.get, {}) == {"eos": 9, "bos": 6, "pad": 5, "unk": None}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|end_of_text|>"}}))
    assert special_ids_from_folder(tmp_path, vocab.get, {"unk": 1})["eos"] == 7  # the named token wins
    assert special_ids_from_folder(tmp_path, vocab.get, {"unk": 1})["unk"] == 1  # the tokenizer's own, last
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(DataError, match=r"tokenizer_config.json: eos_token '<\|im_end\|>' is not in the"):
        special_ids_from_folder(tmp_path, vocab.get, {})
