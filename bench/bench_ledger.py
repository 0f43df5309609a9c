"""What the cost ledger adds to a training step, against a naive per-step JSONL ledger.

Each variant runs the same loop a trainer runs: enter the train phase, record the step's tokens,
leave the phase. Printed as JSON: microseconds per step for each variant, and the ratios of our
ledger to the peers (the bare loop, a ledger that appends and flushes a line per step, and one
that also fsyncs per step, which is what crash safety would cost without coalescing).

    python bench/bench_ledger.py --steps 20000
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

from cost.ledger import Ledger
from cost.rates import UsdRubRate
from experiment.sections.cost import CostConfig


def per_step_us(loop: Callable[[int], None], steps: int) -> float:
    started = time.perf_counter()
    loop(steps)
    return (time.perf_counter() - started) / steps * 1e6


def bare(steps: int) -> None:
    for _ in range(steps):
        with contextlib.nullcontext():
            pass


def ours(folder: Path) -> Callable[[int], None]:
    cfg = CostConfig(accelerator="tpu-v5e", chips=8, usd_rub_rate=100.0, usd_rub_date=dt.date.today().isoformat())
    ledger = Ledger.open(folder / "ours", cfg, "bench", rate=UsdRubRate(100.0, dt.date.today(), "bench"))

    def loop(steps: int) -> None:
        for step in range(1, steps + 1):
            with ledger.phase("train"):
                ledger.add_tokens(step, 4096)
        ledger.close()

    return loop


def naive(folder: Path, fsync: bool) -> Callable[[int], None]:
    path = folder / f"naive-{'fsync' if fsync else 'flush'}.jsonl"

    def loop(steps: int) -> None:
        with path.open("a", encoding="utf-8") as handle:
            for step in range(1, steps + 1):
                t0 = time.time()
                record = {"e": "step", "phase": "train", "step": step, "tokens": 4096, "t0": t0, "t1": time.time()}
                handle.write(json.dumps(record) + "\n")
                handle.flush()
                if fsync:
                    os.fsync(handle.fileno())

    return loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--fsync-steps", type=int, default=2_000, help="steps for the fsync-per-step peer (slow)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        results = {
            "bare_us": per_step_us(bare, args.steps),
            "ours_us": per_step_us(ours(folder), args.steps),
            "naive_flush_us": per_step_us(naive(folder, fsync=False), args.steps),
            "naive_fsync_us": per_step_us(naive(folder, fsync=True), args.fsync_steps),
        }
        results["ours_bytes_per_step"] = (folder / "ours" / "ledger.jsonl").stat().st_size / args.steps
        results["naive_bytes_per_step"] = (folder / "naive-flush.jsonl").stat().st_size / args.steps
    results["ours_over_naive_flush"] = results["ours_us"] / results["naive_flush_us"]
    results["ours_over_naive_fsync"] = results["ours_us"] / results["naive_fsync_us"]
    results["steps"] = args.steps
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
