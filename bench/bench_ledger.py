"""What the cost ledger adds to a training step and to the disk, against a naive per-step JSONL ledger.

Each variant runs the loop a trainer runs (enter the train phase, record the step's tokens, leave the
phase) back to back for ``--periods`` x ``--flush-seconds`` of wall time, so our ledger's background
thread flushes (one time record, one tokens record, fsync) several times inside the measurement. The
variants alternate over ``--rounds`` interleaved rounds (``bench/interleave.py``): microseconds per step
and bytes written, medians over the rounds, and ratios as medians of the per-round ratios. Peers: the
bare loop, a ledger that appends and flushes a JSON line per step, and one that also fsyncs per step
(what crash safety would cost without coalescing).

Bytes per second of training time: ours writes per flush period, whatever the step rate, so the rate
measured here is the rate of any run; a per-step ledger writes per step, so its rate depends on the step
time: it is given at ``--step-seconds`` (bytes per step / step time) next to the rate measured here.

    python bench/bench_ledger.py --periods 3 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from interleave import interleaved_rounds, median_ratio, medians

from cost.ledger import Ledger
from cost.ledger_format import LEDGER_FILE
from cost.rates import UsdRubRate
from experiment.sections.cost import CostConfig

TOKENS_PER_STEP = 4096
STEPS_PER_CHECK = 100  # steps between looks at the clock


def run_for(seconds: float, step: Callable[[int], None]) -> tuple[int, float]:
    """Run ``step`` back to back for at least ``seconds``; (steps, seconds taken)."""
    started = time.perf_counter()
    steps = 0
    while True:
        for _ in range(STEPS_PER_CHECK):
            steps += 1
            step(steps)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return steps, elapsed


def measured(steps: int, seconds: float, written: int, covered: float | None = None) -> dict[str, Any]:
    """``covered``: the training seconds the written bytes account for, when not the whole loop."""
    return {"steps": steps, "seconds": seconds, "us_per_step": seconds / steps * 1e6, "bytes": written,
            "bytes_per_step": written / steps, "bytes_per_training_second": written / (covered or seconds)}


def complete_lines(path: Path) -> list[str]:
    """The file's newline-terminated lines (the background thread may be writing the next one)."""
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def bare(seconds: float) -> dict[str, Any]:
    def step(_: int) -> None:
        with contextlib.nullcontext():
            pass

    return measured(*run_for(seconds, step), 0)


def ours(folder: Path, seconds: float, flush_seconds: float) -> dict[str, Any]:
    """A fresh ledger with its background flush thread, as the trainer opens it. Only the flushes while
    training count (not the opening and closing records), against the training time their records cover
    (the first one's t0 to the last one's t1): the loop's end falls between two flushes."""
    cfg = CostConfig(accelerator="tpu-v5e", chips=8, usd_rub_rate=100.0, usd_rub_date=dt.date.today().isoformat(),
                     flush_seconds=flush_seconds)
    ledger_dir = Path(tempfile.mkdtemp(prefix="ours-", dir=folder))
    ledger = Ledger.open(ledger_dir, cfg, "bench", rate=UsdRubRate(100.0, dt.date.today(), "bench"))
    path = ledger_dir / LEDGER_FILE
    lines_at_open = len(complete_lines(path))

    def step(number: int) -> None:
        with ledger.phase("train"):
            ledger.add_tokens(number, TOKENS_PER_STEP)

    steps, elapsed = run_for(seconds, step)
    lines = complete_lines(path)[lines_at_open:]
    ledger.close()
    times = [record for record in map(json.loads, lines) if record["e"] == "time"]
    covered = times[-1]["t1"] - times[0]["t0"] if times else float("inf")
    written = sum(len(line.encode("utf-8")) + 1 for line in lines)
    return {**measured(steps, elapsed, written, covered), "flushes": len(times), "covered_seconds": covered}


def naive(folder: Path, seconds: float, fsync: bool) -> dict[str, Any]:
    path = Path(tempfile.mkstemp(prefix=f"naive-{'fsync' if fsync else 'flush'}-", suffix=".jsonl", dir=folder)[1])
    with path.open("a", encoding="utf-8") as handle:
        def step(number: int) -> None:
            t0 = time.time()
            record = {"e": "step", "phase": "train", "step": number, "tokens": TOKENS_PER_STEP, "t0": t0,
                      "t1": time.time()}
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())

        steps, elapsed = run_for(seconds, step)
    return measured(steps, elapsed, path.stat().st_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flush-seconds", type=float, default=CostConfig.flush_seconds,
                        help="cost.flush_seconds of our ledger")
    parser.add_argument("--periods", type=float, default=3.0, help="flush periods each variant runs per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--step-seconds", type=float, default=1.0,
                        help="a training step's time, to state a per-step ledger's bytes per training second")
    args = parser.parse_args()
    seconds = (args.periods + 0.5) * args.flush_seconds  # ``periods`` whole flush periods and half another
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rounds = interleaved_rounds({
            "bare": lambda: bare(seconds),
            "ours": lambda: ours(folder, seconds, args.flush_seconds),
            "naive_flush": lambda: naive(folder, seconds, fsync=False),
            "naive_fsync": lambda: naive(folder, seconds, fsync=True),
        }, args.rounds)
    results: dict[str, Any] = {}
    for name, runs in rounds.items():
        results[name] = {**medians({key: [r[key] for r in runs] for key in runs[0]}, digits=6),
                         "us_per_step_rounds": [round(r["us_per_step"], 2) for r in runs]}
        results[name][f"bytes_per_training_second_at_{args.step_seconds:g}s_steps"] = (
            results["ours"]["bytes_per_training_second"] if name == "ours"
            else round(results[name]["bytes_per_step"] / args.step_seconds, 1))
    us = {name: [r["us_per_step"] for r in runs] for name, runs in rounds.items()}
    print(json.dumps({
        "bench": "cost ledger per training step", "flush_seconds": args.flush_seconds,
        "seconds_per_variant_per_round": seconds, "rounds": args.rounds, "step_seconds": args.step_seconds,
        "load_average_1m": round(os.getloadavg()[0], 2), "results": results,
        "ours_over_naive_flush": median_ratio(us["ours"], us["naive_flush"]),
        "ours_over_naive_fsync": median_ratio(us["ours"], us["naive_fsync"], digits=4),
        "ours_minus_bare_us": round(results["ours"]["us_per_step"] - results["bare"]["us_per_step"], 2),
    }, indent=2))


if __name__ == "__main__":
    main()
