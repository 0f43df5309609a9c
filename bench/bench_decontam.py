"""Benchmark of recipe 01's decontamination (corpus.decontamination): MB/s per core of the per-document check
against the benchmark index, beside the per-document work of two other recipe-01 stages measured in the same run
(the peers): the MinHash signature of near-dedup and the quality filters. Prints one JSON object.

The index is what recipe 01 builds from the benchmark files in ../shared/data/bench (every benchmark with a
local file; eval/decontam.py); the documents are ruslit in 3,000-character chunks, normalized as recipe 01
normalizes them before its filters. One process, so MB/s is per core; the stages run once per round in
``--rounds`` interleaved rounds (bench/interleave.py), and ratios are medians of the per-round ratios.

    python bench/bench_decontam.py --mb 4 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from interleave import cpu_model, interleaved_rounds, median_ratio, medians  # noqa: E402

from data_prep.corpus.decontam import decontaminate  # noqa: E402
from data_prep.corpus.dedup import minhash_signature  # noqa: E402
from data_prep.corpus.normalize import normalize_text  # noqa: E402
from data_prep.corpus.quality import quality_rejection  # noqa: E402
from data_prep.corpus.sources import iter_raw_documents  # noqa: E402
from eval.decontam import benchmark_index  # noqa: E402
from experiment.config import build_dataclass  # noqa: E402
from experiment.schema import ExperimentConfig, SourceConfig  # noqa: E402

SHARED = Path(os.environ.get("RU_SHARED_DATA", ROOT.parent / "shared" / "data"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=4.0, help="MB of ruslit text")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cfg = build_dataclass(ExperimentConfig, {"experiment": {"name": "bench", "run_root": tempfile.gettempdir()},
                                             "eval": {"bench_dir": str(SHARED / "bench")}})
    started = time.perf_counter()
    index = benchmark_index(cfg)
    index_seconds = time.perf_counter() - started
    assert index is not None
    source = SourceConfig(kind="files", name="ruslit", paths=[str(SHARED / "text" / "ruslit")], split_rule="chunk",
                          chunk_chars=3000, max_bytes=int(args.mb * 1e6))
    texts = [normalize_text(doc.text, True) for doc in iter_raw_documents([source], Path(tempfile.gettempdir()))
             if doc.text]
    mb = sum(len(text.encode("utf-8")) for text in texts) / 1e6

    def timed(step: Callable[[str], Any]) -> Callable[[], float]:
        def run() -> float:
            began = time.perf_counter()
            for text in texts:
                step(text)
            return time.perf_counter() - began
        return run

    stages = {
        "decontamination (remove)": timed(lambda text: decontaminate(text, index, "remove")),
        "decontamination (cut)": timed(lambda text: decontaminate(text, index, "cut")),
        "near-dedup MinHash signature (peer)": timed(lambda text: minhash_signature(text, cfg.corpus.dedup)),
        "quality filters (peer)": timed(lambda text: quality_rejection(text, cfg.corpus.quality)),
    }
    rounds = interleaved_rounds(stages, args.rounds)
    peer = rounds["near-dedup MinHash signature (peer)"]
    seconds = medians(rounds, digits=3)
    overlapping = sum(bool(decontaminate(text, index, "remove").benchmarks) for text in texts)
    print(json.dumps({
        "bench": "decontamination throughput", "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2), "documents": len(texts), "mb": round(mb, 2),
        "rounds": args.rounds, "index": {
            "seconds_to_build": round(index_seconds, 1), "ngram": index.ngram, "min_words": index.min_words,
            "benchmarks": {name: s.items_indexed for name, s in index.summaries.items()},
            "grams": int(sum(len(h) for h in index.hashes.values())), "words": len(index.vocab)},
        "documents_overlapping": overlapping,
        "results": [{"stage": name, "seconds": seconds[name], "seconds_rounds": [round(s, 3) for s in rounds[name]],
                     "mb_per_s_per_core": round(mb / seconds[name], 2),
                     "speed_vs_minhash": median_ratio(peer, rounds[name], 2)} for name in stages],
    }, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
