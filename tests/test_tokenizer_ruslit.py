"""Recipe 02 on real Russian literature (../shared/data): round-trip, HF parity, byte lengths."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from data_prep.corpus.normalize import normalize_text
from experiment.split import is_validation
from tests.test_tokenizer import run_stage
from tokenizer.spm import load_tokenizer, piece_byte_lengths

WORKS = ["Дубровский.txt", "Капитанская дочка.txt"]
PARAGRAPHS_PER_DOC = 25


def pushkin_documents(shared: Path) -> list[dict[str, str]]:
    """Documents as recipe 01 leaves them (``normalize_text``), each with its ``raw`` text as printed."""
    docs = []
    for name in WORKS:
        text = unicodedata.normalize("NFC", (shared / "text/ruslit/prose/Pushkin" / name).read_text(encoding="utf-8"))
        paragraphs = [p.strip() for p in text.split("\n") if p.strip()]
        for start in range(0, len(paragraphs), PARAGRAPHS_PER_DOC):
            raw = "\n\n".join(paragraphs[start:start + PARAGRAPHS_PER_DOC])
            docs.append({"id": f"pushkin/{name}#{start}", "source": "prose", "text": normalize_text(raw), "raw": raw})
    return docs


@pytest.mark.shared_data
@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_real_prose_roundtrips_and_export_matches(shared_data: Path, tmp_path: Path, model_type: str) -> None:
    docs = pushkin_documents(shared_data)
    folder, _ = run_stage(tmp_path, docs, vocab_size=2000, model_type=model_type, baseline_hf_bpe=False,
                          report_max_docs=1000)
    sp, _ = load_tokenizer(folder.tokenizer)
    report = json.loads((folder.tokenizer / "report.json").read_text(encoding="utf-8"))
    overall = report["tokenizers"]["sentencepiece"]["overall"]
    heldout = [d for d in docs if is_validation(d["id"], 10.0)]
    assert overall["documents"] == len(heldout) > 0
    assert overall["roundtrip_exact"] == 1.0
    assert overall["chars_per_token"] > 2.5  # even 2k pieces compress literary Russian well past characters
    hf = Tokenizer.from_file(str(folder.tokenizer / "hf" / "tokenizer.json"))
    lengths = piece_byte_lengths(sp)
    for doc in heldout:
        ids = sp.encode(doc["text"])
        assert hf.encode(doc["text"], add_special_tokens=False).ids == ids, doc["id"]
        assert int(lengths[ids].sum()) == len(doc["text"].encode("utf-8")), doc["id"]
    # the printed text, no-break spaces and all (70 in the held-out part), is the corpus text to the model
    raw_ids = [sp.encode(doc["raw"]) for doc in heldout]
    assert sum(doc["raw"].count("\u00a0") for doc in heldout) > 50
    assert raw_ids == [sp.encode(doc["text"]) for doc in heldout]
    assert [hf.encode(doc["raw"], add_special_tokens=False).ids for doc in heldout] == raw_ids
    fallback = sum(sp.is_byte(i) for ids in raw_ids for i in ids) / sum(len(ids) for ids in raw_ids)
    assert fallback <= 0.001
