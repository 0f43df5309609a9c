"""Benchmarks of recipe 01 on Beam; each prints one JSON object (run with the beam venv's python).

``speed``: the whole recipe (read, clean, dedup, write shards) on a slice of ruslit, for the local
pool and Beam's DirectRunner in multi-processing mode, each at 1 and 2 worker processes, in
``--rounds`` interleaved rounds (``bench/interleave.py``). Ratios are medians of per-round ratios.

``driver``: the driver's peak RSS at two corpus sizes ``--scale`` apart. The corpus is ruslit
repeated with variations (every repeat after the first has 30% of its words swapped for other
words of the same text, so near dedup keeps the repeats and the output grows with the input).
Beam runs through a portable job service and an external worker pool started by this script, so
the driver is a process of its own, as with Dataflow/Flink/Spark; DirectRunner, whose runner
lives inside the driver process and buffers the shuffled data there, is measured for comparison.

    python bench/bench_beam.py speed --mb 3 --rounds 3
    python bench/bench_beam.py driver --mb 2 --scale 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_corpus import RUSLIT, cpu_seconds, ruslit_source  # noqa: E402
from interleave import interleaved_rounds, median_ratio, medians  # noqa: E402

from data_prep.corpus.build import build_corpus  # noqa: E402
from data_prep.corpus.sources import iter_raw_documents  # noqa: E402
from experiment.config import build_dataclass  # noqa: E402
from experiment.corpus_format import read_corpus_manifest  # noqa: E402
from experiment.runfolder import RunFolder  # noqa: E402
from experiment.schema import ExperimentConfig  # noqa: E402


def direct_options(workers: int) -> list[str]:
    return ["--runner=DirectRunner", f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]


def recipe_config(work: Path, sources: list[Any], **corpus: Any) -> Any:
    cfg = build_dataclass(ExperimentConfig, {"experiment": {"name": "bench", "run_root": str(work / "runs")},
                                             "corpus": corpus})
    cfg.corpus.sources = sources
    return cfg


def run_recipe(cfg: Any) -> dict[str, Any]:
    started, cpu_started = time.perf_counter(), cpu_seconds()
    folder = RunFolder.for_config(cfg)
    build_corpus(cfg, folder, None)
    manifest = read_corpus_manifest(folder.corpus)
    return {"seconds": time.perf_counter() - started, "cpu_seconds": cpu_seconds() - cpu_started,
            "kept": manifest["documents"], "shards_sha256": [s["sha256"] for s in manifest["shards"]]}


def speed(args: argparse.Namespace) -> dict[str, Any]:
    """Each runner on the full slice and on a tiny one (its fixed start-up: spawning, imports, pipeline
    set-up); the marginal figures (full minus tiny, per round) are the per-document work's cost."""
    work = Path(tempfile.mkdtemp(prefix="bench-beam-speed-"))
    sizes = {"full": args.mb, "tiny": args.tiny_mb}
    documents = {size: sum(1 for _ in iter_raw_documents([ruslit_source(max_bytes=int(mb * 1e6))], work))
                 for size, mb in sizes.items()}
    runners = {  # corpus.workers 1 is the plain loop in this process: the local runner's one-worker form
        "local x1": {"workers": 1}, "local pool x2": {"workers": 2},
        "beam x1": {"runner": "beam", "beam_options": direct_options(1)},
        "beam x2": {"runner": "beam", "beam_options": direct_options(2)},
    }
    configs = {(name, size): recipe_config(work / f"{name}-{size}".replace(" ", "_"),
                                           [ruslit_source(max_bytes=int(mb * 1e6))], **corpus)
               for name, corpus in runners.items() for size, mb in sizes.items()}
    rounds = interleaved_rounds({f"{name} {size}": lambda cfg=cfg: run_recipe(cfg)
                                 for (name, size), cfg in configs.items()}, args.rounds)
    same = len({tuple(rounds[f"{name} full"][0]["shards_sha256"]) for name in runners}) == 1
    marginal = {name: [{key: full[key] - tiny[key] for key in ("seconds", "cpu_seconds")}
                       for full, tiny in zip(rounds[f"{name} full"], rounds[f"{name} tiny"], strict=True)]
                for name in runners}
    results = []
    for name in runners:
        row: dict[str, Any] = {"runner": name}
        for size in sizes:
            rows = rounds[f"{name} {size}"]
            row[size] = {**medians({key: [r[key] for r in rows] for key in ("seconds", "cpu_seconds")}, digits=2),
                         "seconds_rounds": [round(r["seconds"], 2) for r in rows]}
        row["marginal"] = medians({key: [r[key] for r in marginal[name]] for key in ("seconds", "cpu_seconds")},
                                  digits=2)
        results.append(row)

    def ratio(slow: str, fast: str, key: str) -> dict[str, Any]:
        return median_ratio([r[key] for r in marginal[slow]], [r[key] for r in marginal[fast]], 2)

    pairs = {"beam x2 vs beam x1": ("beam x1", "beam x2"), "local x2 vs local x1": ("local x1", "local pool x2"),
             "beam x1 vs local x1": ("local x1", "beam x1"), "beam x2 vs local x2": ("local pool x2", "beam x2")}
    return {"bench": "corpus recipe, Beam vs local runner", "documents": documents, "mb": sizes,
            "rounds": args.rounds, "cpu_count": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2),
            "same_shards_everywhere": same, "results": results,
            "marginal_wall_ratios": {label: ratio(*pair, "seconds") for label, pair in pairs.items()},
            "marginal_cpu_efficiency": {label: ratio(*pair, "cpu_seconds") for label, pair in pairs.items()}}


# ---------------------------------------------------------------- driver memory

def write_varied_corpus(out_dir: Path, mb: float, file_mb: float = 1.0, seed: int = 0) -> int:
    """ruslit chunks repeated until ``mb`` MB: repeat 0 verbatim, later ones with 30% of words swapped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = [d.text for d in iter_raw_documents([ruslit_source(max_bytes=int(min(mb, 5.0) * 1e6))], out_dir) if d.text]
    rng = random.Random(seed)
    vocabulary = sorted({w for text in base[:200] for w in text.split()})
    written, number, handle, repeat = 0, 0, None, 0
    while written < mb * 1e6:
        for text in base:
            if repeat:
                text = " ".join(rng.choice(vocabulary) if rng.random() < 0.3 else w for w in text.split(" "))
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            if handle is None or handle.tell() >= file_mb * 1e6:
                if handle is not None:
                    handle.close()
                handle = (out_dir / f"part-{number:05d}.jsonl").open("w", encoding="utf-8")
                number += 1
            handle.write(line)
            written += len(line.encode("utf-8"))
            if written >= mb * 1e6:
                break
        repeat += 1
    assert handle is not None
    handle.close()
    return number


def driver_one(args: argparse.Namespace) -> dict[str, Any]:
    """One recipe run in this process (the driver); cheap cleaning: the driver's memory is the question."""
    work = Path(tempfile.mkdtemp(prefix="bench-beam-driver-"))
    source = ruslit_source()
    source.paths, source.split_rule = [f"{args.inputs}/*.jsonl"], "file"
    cfg = recipe_config(work, [source], runner="beam", beam_options=json.loads(args.options),
                        langid={"enabled": False}, quality={"enabled": False}, docs_per_shard=2000)
    result = run_recipe(cfg)
    return {"driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "seconds": round(result["seconds"], 1), "kept": result["kept"], "shards": len(result["shards_sha256"])}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


def driver(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-beam-driver-"))
    sizes = {"small": args.mb, "large": args.mb * args.scale}
    files = {name: write_varied_corpus(work / name, mb) for name, mb in sizes.items()}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    job_port, pool_port = _free_port(), _free_port()
    services = [subprocess.Popen([sys.executable, "-m", module, flag], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
                for module, flag in (("apache_beam.runners.portability.local_job_service_main", f"--port={job_port}"),
                                     ("apache_beam.runners.worker.worker_pool_main", f"--service_port={pool_port}"))]
    portable = ["--runner=PortableRunner", f"--job_endpoint=localhost:{job_port}", "--environment_type=EXTERNAL",
                f"--environment_config=localhost:{pool_port}"]
    results: dict[str, dict[str, Any]] = {}
    try:
        time.sleep(5)  # the services start listening
        for runner, options in (("portable runner + worker pool", portable), ("DirectRunner x2", direct_options(2))):
            for name in ("small", "large") * args.rounds:
                out = subprocess.run([sys.executable, __file__, "driver-one", "--inputs", str(work / name),
                                      "--options", json.dumps(options)], env=env, capture_output=True, text=True,
                                     check=True)
                row = json.loads(out.stdout)
                entry = results.setdefault(f"{runner}, {name}", {"mb": sizes[name], "files": files[name], "runs": []})
                entry["runs"].append(row)
    finally:
        for service in services:
            service.terminate()
            service.wait(timeout=30)
    for entry in results.values():
        entry["driver_peak_rss_mb"] = max(run["driver_peak_rss_mb"] for run in entry["runs"])
    ratios = {runner: round(results[f"{runner}, large"]["driver_peak_rss_mb"]
                            / results[f"{runner}, small"]["driver_peak_rss_mb"], 3)
              for runner in ("portable runner + worker pool", "DirectRunner x2")}
    return {"bench": "Beam driver peak RSS vs corpus size", "scale": args.scale, "results": results,
            "large_over_small_rss": ratios, "cpu_count": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("speed")
    sp.add_argument("--mb", type=float, default=3.0, help="MB of ruslit text to process")
    sp.add_argument("--tiny-mb", type=float, default=0.05, help="the start-up run's input, MB")
    sp.add_argument("--rounds", type=int, default=3)
    dr = sub.add_parser("driver")
    dr.add_argument("--mb", type=float, default=2.0, help="the small corpus, MB")
    dr.add_argument("--scale", type=float, default=10.0, help="the large corpus is this many times larger")
    dr.add_argument("--rounds", type=int, default=1)
    one = sub.add_parser("driver-one")
    one.add_argument("--inputs", required=True)
    one.add_argument("--options", required=True, help="Beam flags as a JSON list")
    args = parser.parse_args()
    if not RUSLIT.is_dir():
        sys.exit(f"error: ruslit not found at {RUSLIT} (set RU_SHARED_DATA)")
    result = {"speed": speed, "driver": driver, "driver-one": driver_one}[args.command](args)
    print(json.dumps(result, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
