"""Loss after N steps of the demo with fp32, bf16 compute, int8 and fp8 quantized training (Qwix).

Correctness, not speed: on a CPU quantized training is slower than float (Qwix quantizes and rescales
around every matmul and XLA:CPU has no fast int8/fp8 training path); what this checks is that int8 and
fp8 train the demo model as far as bf16 and fp32 do in the same steps. Each arm runs recipe 04 on a
copy of an existing demo run's prepared stages (corpus, tokenizer, shards: recipes 01-03), same seed,
same data order, W&B off, and reads its train_log.jsonl.

    nice -n 5 python bench/bench_low_precision.py --stages runs/demo --steps 200

Arms run one after another, not interleaved: the numbers compared are losses, which do not depend on
the machine's load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiment.files import atomic_write_json  # noqa: E402

ARMS = {
    "fp32": ["train.compute_dtype=float32"],
    "bf16": ["train.compute_dtype=bfloat16"],
    "int8": ["train.compute_dtype=bfloat16", "train.quantization=int8"],
    "fp8": ["train.compute_dtype=bfloat16", "train.quantization=fp8"],
}


def run_arm(name: str, stages: Path, steps: int, tail: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f"lowprec-{name}-") as tmp:
        run = Path(tmp) / "demo"
        for stage in ("corpus", "tokenizer", "shards"):
            shutil.copytree(stages / stage, run / stage)
        cmd = [sys.executable, str(REPO / "recipes" / "04_pretrain.py"), "--config",
               str(REPO / "recipes" / "configs" / "demo.yaml"), f"experiment.run_root={tmp}", f"train.steps={steps}",
               "train.log_every=1", f"train.checkpoint_every={steps}", "wandb.mode=disabled", *ARMS[name]]
        started = time.monotonic()
        subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - started
        records = [json.loads(line) for line in (run / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    losses = {r["train/step"]: r["train/loss"] for r in records if "train/loss" in r}
    if sorted(losses) != list(range(1, steps + 1)):
        raise SystemExit(f"{name}: train_log.jsonl lacks steps (has {len(losses)} of {steps})")
    last = [losses[s] for s in range(steps - tail + 1, steps + 1)]
    return {"arm": name, "overrides": ARMS[name],
            "loss_at_steps": {s: round(losses[s], 4) for s in (1, steps // 2, steps)},
            f"mean_loss_last_{tail}": round(statistics.fmean(last), 4), "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=Path, default=REPO / "runs" / "demo",
                        help="a demo run folder with corpus/, tokenizer/ and shards/ (recipes 01-03)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--tail", type=int, default=20, help="steps averaged at the end")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "low_precision.json")
    args = parser.parse_args()
    rows = []
    for name in args.arms.split(","):
        rows.append(run_arm(name, args.stages, args.steps, args.tail))
        print(json.dumps(rows[-1]), flush=True)
    atomic_write_json(args.out, {"steps": args.steps, "stages": str(args.stages), "rows": rows})


if __name__ == "__main__":
    main()
