"""Benchmarks of recipe 01 (corpus building); each prints one JSON object.

``throughput``: the per-document work plus dedup on a slice of ruslit, timed for a plain
single-process loop (the peer), the local pool at 1 and 2 workers, and Beam's DirectRunner when the
beam extra is importable, in ``--rounds`` interleaved rounds (``bench/interleave.py``). Ratios against
the plain loop are medians of the per-round ratios.

``planted``: the whole recipe on all of ruslit plus the Debian demo text plus 500 planted
near-duplicates; reports the caught share, the clean documents lost, and the accounting.

``levels``: one author's prose plus copies at several word-edit rates (different originals per rate):
per rate, copies matched to their own original / to anything else / missed, against the LSH S-curve's
prediction; and the author's own documents flagged as duplicates (false positives on distinct texts).

    python bench/bench_corpus.py throughput --mb 6 --rounds 3
    python bench/bench_corpus.py planted --planted 500
    python bench/bench_corpus.py levels --author Bryusov --copies 100 [corpus.dedup.bands=20 corpus.dedup.rows=4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from interleave import interleaved_rounds, median_ratio, medians  # noqa: E402

from data_prep.corpus.build import build_corpus, clean_serial, clean_with_pool, dedup_in_order  # noqa: E402
from data_prep.corpus.documents import RawDocument  # noqa: E402
from data_prep.corpus.sources import iter_raw_documents  # noqa: E402
from experiment.config import build_dataclass  # noqa: E402
from experiment.corpus_format import read_corpus_manifest  # noqa: E402
from experiment.runfolder import RunFolder  # noqa: E402
from experiment.schema import ExperimentConfig, SourceConfig  # noqa: E402
from experiment.sections.corpus import CorpusConfig  # noqa: E402
from tests.dedup_eval import measure_planted_levels, planted_rates, write_planted_source  # noqa: E402

RUSLIT = Path(os.environ.get("RU_SHARED_DATA", ROOT.parent / "shared" / "data")) / "text" / "ruslit"


def ruslit_source(**overrides: Any) -> SourceConfig:
    return SourceConfig(kind="files", name="ruslit", paths=[str(RUSLIT)], split_rule="chunk", chunk_chars=3000,
                        **overrides)


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (pool workers are reaped when the pool closes)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(run: Any, docs: list[RawDocument]) -> dict[str, float]:
    """Wall time (what a user waits) and CPU time (what the work costs, whatever else the machine runs)."""
    started, cpu_started = time.perf_counter(), cpu_seconds()
    first_result = None
    outcomes = 0
    for _ in run():
        outcomes += 1
        first_result = first_result or time.perf_counter() - started
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
    assert outcomes == len(docs)
    return {"seconds": seconds, "seconds_to_first_result": first_result or 0.0, "cpu_seconds": cpu}


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Every runner once per round, the order rotating (bench/interleave.py); medians and per-round ratios."""
    cfg = CorpusConfig(sources=[ruslit_source(max_bytes=int(args.mb * 1e6))])
    docs = list(iter_raw_documents(cfg.sources, Path(tempfile.gettempdir())))
    runners: dict[str, tuple[int, Any]] = {"plain loop": (1, lambda: dedup_in_order(clean_serial(docs, cfg), cfg))}
    for workers in (1, 2):
        runners[f"pool x{workers}"] = (workers, lambda w=workers: dedup_in_order(clean_with_pool(docs, cfg, w), cfg))
    # Beam runs whole pipelines (read, clean, dedup, write): bench/bench_beam.py measures it against this pool
    rounds = interleaved_rounds({name: lambda run=run: timed(run, docs) for name, (_, run) in runners.items()},
                                args.rounds)
    mb = sum(d.raw_bytes for d in docs) / 1e6
    plain = rounds["plain loop"]
    results = []
    for name, (cores, _) in runners.items():
        row = medians({key: [r[key] for r in rounds[name]] for key in ("seconds", "seconds_to_first_result",
                                                                        "cpu_seconds")}, digits=2)
        results.append({
            "runner": name, "cores": cores, **row, "seconds_rounds": [round(r["seconds"], 2) for r in rounds[name]],
            "docs_per_s": round(len(docs) / row["seconds"], 1),
            "mb_per_s_per_core": round(mb / row["seconds"] / cores, 3),
            "mb_per_cpu_s": round(mb / row["cpu_seconds"], 3),
            "speed_vs_plain_loop": median_ratio([r["seconds"] for r in plain], [r["seconds"] for r in rounds[name]], 2),
            "cpu_efficiency_vs_plain_loop": median_ratio([r["cpu_seconds"] for r in plain],
                                                         [r["cpu_seconds"] for r in rounds[name]], 2)})
    return {"bench": "corpus throughput", "documents": len(docs), "mb": round(mb, 2), "rounds": args.rounds,
            "cpu_count": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2),
            "results": results}


def planted(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-corpus-"))
    sources = [ruslit_source()]
    if not args.no_debian:
        sources.append(SourceConfig(kind="debian", name="debian-ru", cache_dir=args.debian_cache))
    raw = list(iter_raw_documents(sources, work / ".cache"))
    write_planted_source(raw, args.planted, work / "planted.jsonl", seed=args.seed)
    sources.append(SourceConfig(kind="files", name="planted", paths=[str(work / "planted.jsonl")]))
    cfg = build_dataclass(ExperimentConfig, {"experiment": {"name": "planted", "run_root": str(work / "runs")}})
    cfg.corpus.sources = sources
    cfg.corpus.workers = args.workers
    folder = RunFolder.for_config(cfg)
    started = time.perf_counter()
    build_corpus(cfg, folder, None)
    seconds = time.perf_counter() - started
    manifest = read_corpus_manifest(folder.corpus)
    counts = manifest["counts"]
    accounted = counts["kept"] + sum(counts["rejected"].values()) + sum(counts["duplicates"].values())
    return {"bench": "planted near-duplicates", "seconds": round(seconds, 1), "counts": counts,
            "every_document_accounted": accounted == counts["in"] == len(raw) + args.planted,
            "sources": manifest["sources"], **planted_rates(manifest, "planted"), "work_dir": str(work)}


def levels(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-corpus-levels-"))
    source = ruslit_source()
    source.paths = [str(RUSLIT / "prose" / args.author)]
    overrides = {key.removeprefix("corpus.dedup."): int(value) for key, value in (o.split("=", 1) for o in args.dedup)}
    cfg = build_dataclass(ExperimentConfig, {"experiment": {"name": "levels", "run_root": str(work / "runs")},
                                             "corpus": {"dedup": overrides}})
    cfg.corpus.sources = [source]
    started = time.perf_counter()
    report = measure_planted_levels(cfg.corpus, args.copies, args.rates, work, seed=args.seed)
    return {"bench": "planted copies per edit rate", "author": args.author, "copies_per_rate": args.copies,
            **report, "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    tp = sub.add_parser("throughput")
    tp.add_argument("--mb", type=float, default=6.0, help="MB of ruslit text to process")
    tp.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    pl = sub.add_parser("planted")
    pl.add_argument("--planted", type=int, default=500)
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--workers", type=int, default=0)
    pl.add_argument("--no-debian", action="store_true", help="ruslit only (no apt-get)")
    pl.add_argument("--debian-cache", default="", help="reuse a Debian .deb cache folder")
    lv = sub.add_parser("levels")
    lv.add_argument("--author", default="Bryusov", help="a folder of ruslit/prose")
    lv.add_argument("--copies", type=int, default=100, help="copies per edit rate")
    lv.add_argument("--rates", type=float, nargs="+", default=[0.02, 0.05, 0.10])
    lv.add_argument("--seed", type=int, default=3)
    lv.add_argument("dedup", nargs="*", help="corpus.dedup.KEY=INT overrides (bands, rows, ngram)")
    args = parser.parse_args()
    if not RUSLIT.is_dir():
        sys.exit(f"error: ruslit not found at {RUSLIT} (set RU_SHARED_DATA)")
    result = {"throughput": throughput, "planted": planted, "levels": levels}[args.command](args)
    print(json.dumps(result, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
