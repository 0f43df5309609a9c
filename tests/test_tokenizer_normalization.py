"""One text normalization: each decision, the rules compiled into the model and its HF export, the corpus
path (recipes 01 -> 03) and the evaluation path (recipe 05's held-out files and task items) agreeing."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from data_prep.corpus.normalize import normalize_text
from eval.bpb import read_text_files
from eval.harness import PairEncoder
from tests.test_tokenizer import fixture_documents, run_stage
from tokenizer.hf_export import build_hf_tokenizer
from tokenizer.loaded import load_run_tokenizer
from tokenizer.normalization import NORMALIZATION_NAME, apply_rules, normalize_characters, rules_sha256
from tokenizer.texts import split_corpus, training_texts

NBSP = "\u00a0"
# A typeset paragraph as it comes from a book or a web page: no-break spaces after initials, in numbers,
# before dashes; a narrow no-break space; a stress mark; curly single quotes; a soft hyphen.
TYPESET = (f"В 1812{NBSP}г. А.{NBSP}С.{NBSP}Пушкин писал:{NBSP}— Москва\u0301 и т.{NBSP}д. — «ёлка» стоила "
           f"1\u202f000{NBSP}руб.; it\u2019s pa\u00adrt of the ‘book’.")
TORTURE = (TYPESET + " е\u0308ж и\u0306од Ѐ ѐ\u0301 e\u0301 A\u030a \u212b u\u0308\u0304 ‐‑−‒― "
           "\u200b\ufeff x\r\ny\rz\u2028")


@pytest.mark.parametrize(("raw", "normalized"), [
    (f"1{NBSP}000\u2007р.\u202fи\u2009т.\u3000д.", "1 000 р. и т. д."),  # special spaces -> space
    ("«ёлочки» „лапки“ ”", "«ёлочки» „лапки“ ”"),  # Russian quotes kept
    ("‘so’ ‚so‛ ‟q", "'so' 'so' \"q"),  # rare quote variants folded
    ("а – б — в", "а – б — в"),  # en and em dash kept
    ("‐‑− ‒ ―", "--- – —"),  # hyphens and minus -> '-', figure dash -> en, horizontal bar -> em
    ("Москва\u0301 за\u0300мок ѐ Ѝ е\u0300", "Москва замок е И е"),  # stress marks dropped
    ("ёж Ёлка е\u0308ж и\u0306од", "ёж Ёлка ёж йод"),  # ё kept, decomposed ё and й composed
    ("e\u0301te\u0301 A\u030a \u212b", "été Å Å"),  # Latin accents kept (NFC)
    ("a\u00adb\u200bc\u200dd\ufeffe\x07f\ue000g", "abcdefg"),  # format, control, private use dropped
    ("a\r\nb\rc\u2028d\te", "a\nb\nc\nd\te"),  # line breaks unified, the tab kept
])
def test_each_decision(raw: str, normalized: str) -> None:
    assert normalize_characters(raw) == normalized


def test_normalization_is_idempotent_and_matches_the_corpus_characters() -> None:
    once = normalize_characters(TORTURE)
    assert normalize_characters(once) == once
    # corpus building applies the same rules, then lays out whitespace
    assert normalize_text(TORTURE) == normalize_text(once)
    assert normalize_characters(normalize_text(TORTURE)) == normalize_text(TORTURE)


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Any:
    docs = [{**d, "text": normalize_text(d["text"])} for d in fixture_documents(120)]
    return run_stage(tmp_path_factory.mktemp("norm"), docs, vocab_size=500, baseline_hf_bpe=False)[0]


def test_model_carries_the_rules_and_applies_them_to_raw_text(stage: Any) -> None:
    tok = load_run_tokenizer(stage.tokenizer)
    assert tok.manifest["normalization"] == {"name": NORMALIZATION_NAME, "rules_sha256": rules_sha256()}
    proto = model_pb2.ModelProto()
    proto.ParseFromString(tok.model_file.read_bytes())
    assert proto.normalizer_spec.name == NORMALIZATION_NAME and proto.normalizer_spec.precompiled_charsmap
    assert not proto.normalizer_spec.normalization_rule_tsv  # the trainer's temporary file is not kept
    # SentencePiece's compiled rules and the Python ones are the same function
    assert tok.sp.normalize(TORTURE).replace("\u2581", " ") == apply_rules(TORTURE)
    assert tok.encode(TORTURE) == tok.encode(normalize_characters(TORTURE))
    assert tok.decode(tok.encode(normalize_characters(TORTURE))) == normalize_characters(TORTURE)
    # no-break spaces are spaces to the model: no byte pieces for them
    assert not any(tok.sp.is_byte(i) for i in tok.encode(f"Пушкин{NBSP}писал{NBSP}— и т.{NBSP}д."))


def test_hf_export_reproduces_the_normalization(stage: Any) -> None:
    tok = load_run_tokenizer(stage.tokenizer)
    hf = build_hf_tokenizer(tok.sp)
    # HF's Precompiled takes a grapheme at a time: a letter with two decomposed marks (Pinyin u\u0308\u0304)
    # composes differently there, so that one is left out here
    for text in (TORTURE.replace("u\u0308\u0304", ""), TYPESET, "Москва\u0301"):
        assert hf.encode(text, add_special_tokens=False).ids == tok.encode(text)
    saved = json.loads((stage.tokenizer / "hf" / "tokenizer.json").read_text(encoding="utf-8"))
    assert "Precompiled" in json.dumps(saved["normalizer"])


def test_identity_normalization_is_still_available(tmp_path: Path) -> None:
    docs = fixture_documents(60)
    folder, _ = run_stage(tmp_path, docs, vocab_size=500, baseline_hf_bpe=False, hf_export=False,
                          normalization="identity")
    tok = load_run_tokenizer(folder.tokenizer)
    assert tok.manifest["normalization"] == {"name": "identity"}
    assert tok.decode(tok.encode(TYPESET)) == TYPESET  # nothing mapped: the raw text comes back


def test_nbsp_paragraph_tokenizes_alike_through_sharding_and_heldout_eval(stage: Any, tmp_path: Path) -> None:
    """Recipe 01 normalizes the corpus and recipe 03 encodes it; recipe 05 reads a held-out file and task
    items: the same paragraph gives the same ids and the same byte count either way."""
    tok = load_run_tokenizer(stage.tokenizer)
    paragraph = " ".join([TYPESET] * 3)
    assert paragraph.count(NBSP) >= 15
    sharded = tok.encode_batch([normalize_text(paragraph)])[0].tolist()  # recipe 03: corpus text, encode_batch
    path = tmp_path / "heldout.txt"
    path.write_text(paragraph, encoding="utf-8")
    [(_, text)] = read_text_files([path])
    heldout = tok.encode(tok.normalize(text))  # recipe 05's held-out path (eval/run.py)
    assert heldout == sharded
    assert len(tok.normalize(text).encode("utf-8")) == int(tok.piece_byte_lengths()[heldout].sum())
    # task items: the pair encoder normalizes before splitting context and continuation
    request = PairEncoder(tok.encode, tok.eos_id, tok.normalize)(f"Вопрос:{NBSP}", f"Москва\u0301{NBSP}— да")
    assert request.continuation == tok.encode(" Москва — да")


def test_heldout_sources_are_never_trained_on_and_are_reported(tmp_path: Path) -> None:
    docs = fixture_documents(90)
    docs += [{"id": f"wiki/{i}", "source": "wiki", "text": f"Статья {i}: {NBSP}Пушкин родился в 1799 году."}
             for i in range(5)]
    assert not any("Статья" in t for t in training_texts(docs, 10.0, ["wiki"]))
    folder, _ = run_stage(tmp_path, docs, vocab_size=500, hf_export=False, heldout_sources=["wiki"])
    split = split_corpus(folder.corpus, 10.0, 50, ["wiki"])
    assert len(split.heldout["wiki"]) == 5
    report = json.loads((folder.tokenizer / "report.json").read_text(encoding="utf-8"))
    assert report["heldout"]["unseen_sources"] == ["wiki"]
    for result in report["tokenizers"].values():
        wiki = result["by_source"]["wiki"]
        assert wiki["documents"] == 5 and 0 < wiki["words_within_two_tokens"] <= 1
    assert "wiki (never trained on)" in (folder.tokenizer / "report.md").read_text(encoding="utf-8")


def test_bad_normalization_keys_name_the_key(tmp_path: Path) -> None:
    from experiment.errors import ConfigError
    from tests.test_tokenizer import make_config

    with pytest.raises(ConfigError, match=r"tokenizer\.heldout_sources\[1\]"):
        make_config(tmp_path, heldout_sources=["wiki", ""])
    with pytest.raises(ConfigError, match=r"tokenizer\.normalization"):
        make_config(tmp_path, normalization="nfkc")


def test_stress_marked_word_counts_as_the_plain_word() -> None:
    assert normalize_characters(unicodedata.normalize("NFD", "Ёлка́")) == "Ёлка"
