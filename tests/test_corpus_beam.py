"""The Beam path gives the same corpus as the local pool (needs the beam extra; skipped without it).

Run it in a venv with the extra: ``pip install -e '.[beam,test]'`` (Beam pins protobuf below 7, so
keep it out of the main environment), then ``pytest tests/test_corpus_beam.py``.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from data_prep.corpus.beam import bucket_matches, exact_group_outcomes
from data_prep.corpus.cleaning import CleanDocument
from experiment.sections.corpus import DedupConfig
from tests.conftest import import_extra
from tests.test_corpus_build import inputs, make_cfg, run, sources_for  # noqa: F401  (inputs is a fixture)


def _doc(order: int) -> CleanDocument:
    return CleanDocument(order, f"s:{order:09d}:x", "s", "o", 10, text="t")


def test_exact_group_keeps_the_lowest_order() -> None:
    outcomes = list(exact_group_outcomes([_doc(7), _doc(3), _doc(5)]))
    assert [(d.order, kind, earlier) for d, kind, earlier in outcomes] == [
        (3, None, None), (5, "exact", "s:000000003:x"), (7, "exact", "s:000000003:x")]


def test_bucket_matches_compare_with_lower_orders_only() -> None:
    a, b, c = np.zeros(4, np.uint32), np.zeros(4, np.uint32), np.arange(4, dtype=np.uint32)
    members = [(2, "b", b), (1, "a", a), (3, "c", c)]
    assert sorted(bucket_matches(members, DedupConfig(min_jaccard=0.0))) == [(2, "a"), (3, "a"), (3, "b")]
    assert sorted(bucket_matches(members, DedupConfig(min_jaccard=0.9))) == [(2, "a")]


def test_beam_direct_runner_equals_local_pool(tmp_path: Path, inputs: Path) -> None:  # noqa: F811
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
    local = run(make_cfg(tmp_path / "local", sources_for(inputs), workers=1))
    beam = run(make_cfg(tmp_path / "beam", sources_for(inputs), runner="beam",
                        beam_options=["--runner=DirectRunner", "--direct_num_workers=1"]))
    assert beam[1] == local[1]
    assert beam[0]["counts"] == local[0]["counts"]
    assert beam[0]["counts"]["duplicates"]["near"] >= 4
    assert beam[0]["runner"] == "beam" and local[0]["runner"] == "local"
    assert [s["sha256"] for s in beam[0]["shards"]] == [s["sha256"] for s in local[0]["shards"]]
