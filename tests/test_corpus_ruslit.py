"""Recipe 01 on real Russian literature (../shared/data/text/ruslit) with planted near-duplicates.

The full measurement (all of ruslit plus the Debian demo text, 500 planted copies) is
``python bench/bench_corpus.py planted``; this test runs the same code on a 4 MB slice in under a minute.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from data_prep.corpus.sources import iter_raw_documents
from experiment.runfolder import RunFolder
from experiment.schema import SourceConfig
from tests.dedup_eval import measure_planted_levels, planted_rates, write_planted_source
from tests.test_corpus_build import make_cfg, run

ROOT = Path(__file__).resolve().parents[1]
RUSLIT = Path(os.environ.get("RU_SHARED_DATA", ROOT.parent / "shared" / "data")) / "text" / "ruslit"
EDIT_RATES = (0.02, 0.05, 0.10)

pytestmark = [
    pytest.mark.shared_data,
    pytest.mark.integration,
    pytest.mark.shared_data(RUSLIT),
]


def test_planted_near_duplicates_are_caught_on_ruslit(tmp_path: Path) -> None:
    ruslit = {"kind": "files", "name": "ruslit", "split_rule": "chunk", "chunk_chars": 3000,
              "paths": [str(RUSLIT / "poems" / "Pushkin"), str(RUSLIT / "prose" / "Pushkin"),
                        str(RUSLIT / "publicism" / "Tolstoy")]}
    raw = list(iter_raw_documents([SourceConfig(**ruslit)], tmp_path))
    write_planted_source(raw, 200, tmp_path / "planted.jsonl", seed=1)
    planted = {"kind": "files", "name": "planted", "paths": [str(tmp_path / "planted.jsonl")]}
    manifest, docs = run(make_cfg(tmp_path, [ruslit, planted], workers=2))
    counts = manifest["counts"]
    assert counts["in"] == len(raw) + 200
    assert counts["in"] == counts["kept"] + sum(counts["rejected"].values()) + sum(counts["duplicates"].values())
    assert counts["kept"] == len(docs) > 0.8 * len(raw), f"filters removed too much real literature: {counts}"
    rates = planted_rates(manifest, "planted")
    assert rates["planted_past_filters"] >= 190
    assert rates["caught_share"] >= 0.95, rates
    assert rates["clean_removed_share"] <= 0.01, rates


def test_each_planted_copy_is_matched_to_its_own_original(tmp_path: Path) -> None:
    """Bryusov's prose (31 works, ~1,100 documents of one author: one style, one vocabulary) and 100 copies of
    other originals at each of 2%, 5% and 10% word edits, through recipe 01's cleaning and dedup.

    - No document of the clean text is flagged (false positives among distinct texts of one author).
    - Every caught copy is matched to its own original, never to another text.
    - At each edit rate the caught share is what MinHash LSH promises at the copies' true shingle Jaccard
      (bands x rows S-curve, within 4 sigma): ~98% at 2% edits, about half at 5%, a few at 10%; 2% edits
      must be caught at 95% or more.
    """
    bryusov = {"kind": "files", "name": "ruslit", "split_rule": "chunk", "chunk_chars": 3000,
               "paths": [str(RUSLIT / "prose" / "Bryusov")]}
    report = measure_planted_levels(make_cfg(tmp_path, [bryusov]).corpus, 100, EDIT_RATES, tmp_path, seed=3)
    assert report["clean_judged"] > 1000 and report["clean_flagged"] == [], report["clean_flagged"]
    for rate, level in report["levels"].items():
        assert level["judged"] >= 95 and level["wrong_match"] == [], (rate, level)
        assert abs(level["own_original"] - level["expected_by_lsh"]) <= 4 * level["sigma_by_lsh"] + 1, (rate, level)
    assert report["levels"]["0.02"]["caught_share"] >= 0.95, report["levels"]


def write_jsonl_with_bad_bytes(path: Path, lines: int = 200, bad_line: int = 10) -> None:
    """``lines`` records of Tolstoy's prose (a paragraph of 400 characters or more each), with bytes that are
    no UTF-8 (0xC3 0x28: a lead byte without its continuation, then a 0xFF) planted in line ``bad_line``'s text."""
    paragraphs = (line.strip() for p in sorted((RUSLIT / "prose" / "Tolstoy").glob("*.txt"))
                  for line in p.read_text(encoding="utf-8").splitlines())
    pieces = list(itertools.islice((p for p in paragraphs if len(p) >= 400 and p[-1] in ".!?"), lines))
    rows = [json.dumps({"text": piece}, ensure_ascii=False).encode("utf-8") for piece in pieces]
    rows[bad_line - 1] = rows[bad_line - 1][:40] + b"\xc3\x28\xff" + rows[bad_line - 1][40:]
    path.write_bytes(b"\n".join(rows) + b"\n")


def test_invalid_utf8_in_a_last_line_without_a_newline_is_rejected_and_a_cut_one_dropped(tmp_path: Path) -> None:
    """The file's last line, with no newline after it: bad bytes inside a complete record are that record's
    rejection as anywhere else (it became a document of U+FFFD), and a character cut at the very end is a torn
    tail (a copy cut short), dropped with a warning as before."""
    bad_last = tmp_path / "bad-last.jsonl"
    write_jsonl_with_bad_bytes(bad_last, lines=20, bad_line=20)
    bad_last.write_bytes(bad_last.read_bytes().rstrip(b"\n"))
    raw = list(iter_raw_documents([SourceConfig(kind="files", name="t", paths=[str(bad_last)])], tmp_path))
    assert [(d.origin, d.reject) for d in raw if d.reject] == [(f"{bad_last}:20", "invalid_utf8")]
    assert len([d for d in raw if not d.reject]) == 19 and not any("\ufffd" in (d.text or "") for d in raw)
    cut = tmp_path / "cut.jsonl"
    write_jsonl_with_bad_bytes(cut, lines=20, bad_line=1)
    whole = cut.read_bytes().rstrip(b"\n")
    cut.write_bytes(whole[:whole.rindex("а".encode()) + 1])  # the last line cut inside its last letter
    raw = list(iter_raw_documents([SourceConfig(kind="files", name="t", paths=[str(cut)])], tmp_path))
    assert [(d.origin, d.reject) for d in raw if d.reject] == [(f"{cut}:1", "invalid_utf8")]
    assert [d.origin for d in raw if not d.reject] == [f"{cut}:{n}" for n in range(2, 20)]


def test_invalid_utf8_in_one_jsonl_line_rejects_that_line_alone(tmp_path: Path) -> None:
    path = tmp_path / "tolstoy.jsonl"
    write_jsonl_with_bad_bytes(path)
    raw = list(iter_raw_documents([SourceConfig(kind="files", name="tolstoy", paths=[str(path)])], tmp_path))
    assert len(raw) == 200
    assert [(d.origin, d.reject) for d in raw if d.reject] == [(f"{path}:10", "invalid_utf8")]
    assert [d.origin for d in raw if not d.reject] == [f"{path}:{n}" for n in range(1, 201) if n != 10]
    cfg = make_cfg(tmp_path, [{"kind": "files", "name": "tolstoy", "paths": [str(path)]}])
    manifest, docs = run(cfg)
    counts = manifest["counts"]
    assert counts["in"] == 200 and counts["rejected"].get("invalid_utf8") == 1
    assert counts["rejected"] == {"invalid_utf8": 1} and counts["kept"] == len(docs) == 199
    report = (RunFolder.for_config(cfg).corpus / "report.md").read_text(encoding="utf-8")
    assert f"from `{path}:10`" in report
