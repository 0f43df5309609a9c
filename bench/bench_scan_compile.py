"""Compile time and HBM per chip of the train step, scanned vs unrolled layers, by libtpu AOT compiles on a CPU.

Each case is recipe 04b (the fit check) run as its own process on a shipped config with overrides, once
with ``model.scan_layers=true`` and once with ``false``, the two layouts alternating (so a drift in the
machine's load hits both). What is recorded per compile: HBM needed per chip (arguments, temporaries), the
verdict, and the compile time the fit check measured (lowering + XLA compile), plus the CPU it ran on.

    .venvs/tpu/bin/python bench/bench_scan_compile.py depth      # 1B width at 4/16/32/80 layers on v6e-8
    .venvs/tpu/bin/python bench/bench_scan_compile.py large      # 70b on v5p-128 (FSDP 64), 8B on v6e-256
    .venvs/tpu/bin/python bench/bench_scan_compile.py long       # 8B at 32k on v6e-256, splash + full remat
    .venvs/tpu/bin/python bench/bench_scan_compile.py shipped    # the shipped 8B and 70B configs as they are

Results go to bench/results/scan_compile_<group>.json (rewritten after every compile, so a long group
that is stopped keeps what it measured); the tables are in docs/launch.md and bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiment.files import atomic_write_json  # noqa: E402

CONFIGS = REPO / "recipes" / "configs"
ONE_B = CONFIGS / "ru-1b-fineweb2-v6e-8.yaml"
EIGHT_B = CONFIGS / "ru-8b-v6e-64.yaml"
SEVENTY_B = CONFIGS / "ru-70b-v5p-128.yaml"

# (name, config, overrides); each runs scanned and unrolled
GROUPS: dict[str, list[tuple[str, Path, list[str]]]] = {
    "depth": [(f"1b width, {n} layers, v6e-8", ONE_B, [f"model.n_layers={n}"]) for n in (4, 16, 32, 80)],
    "large": [
        ("70b preset, v5p-128, fsdp 64, 256 x 4096, full remat, 1 micro-batch", SEVENTY_B, []),
        # MaxText's tpu-recipes Llama3.1-8B on v6e-256: per-device batch 4 at 8,192 (1,024 x 8,192 per step)
        ("llama3.1-8b shape, v6e-256, fsdp 256, 1024 x 8192, full remat", EIGHT_B,
         ["train.batch_size=1024", "train.mesh.fsdp=256", "cost.chips=256", "train.fit_topologies=[v6e-256]"]),
    ],
    "long": [
        # YandexGPT-5's "Powerup" stage length: 32k tokens per sequence
        ("llama3.1-8b shape at 32k, v6e-256, fsdp 256, 256 x 32768, splash, full remat", EIGHT_B,
         ["model.max_seq_len=32768", "train.batch_size=256", "train.mesh.fsdp=256", "cost.chips=256",
          "train.fit_topologies=[v6e-256]", "model.attention=splash", "model.remat=full"]),
    ],
    "shipped": [("ru-8b-v6e-64 as shipped", EIGHT_B, []), ("ru-70b-v5p-128 as shipped", SEVENTY_B, [])],
}


def cpu() -> dict[str, str]:
    info = {"machine": platform.machine(), "cores": str(os.cpu_count())}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        info["model"] = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                             if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags"))
        info["flags"] = " ".join(f for f in flags if f.startswith(("avx", "amx", "fma")))
    except (OSError, StopIteration):
        pass
    return info


def compile_once(config: Path, overrides: list[str], scanned: bool, timeout: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="scan-compile-") as tmp:
        cmd = [sys.executable, str(REPO / "recipes" / "04b_tpu_fit_check.py"), "--config", str(config),
               f"experiment.run_root={tmp}", "wandb.mode=disabled", f"model.scan_layers={str(scanned).lower()}",
               *overrides]
        env = {**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "JAX_PLATFORMS": "cpu"}
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"scan_layers": scanned, "error": f"no result within {timeout:.0f} s",
                    "wall_s": round(time.monotonic() - started)}
        wall = time.monotonic() - started
        reports = list(Path(tmp).glob("*/reports/fit_check.json"))
        if not reports:
            return {"scan_layers": scanned, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:400],
                    "wall_s": round(wall, 1)}
        (report,) = json.loads(reports[0].read_text(encoding="utf-8"))
    keep = ("slice", "devices", "mesh", "remat", "attention_kernel", "grad_accum_steps", "fits", "needed_gib",
            "argument_gib", "temp_gib", "capacity_gib", "compile_s", "error", "recompute_factor")
    return {"scan_layers": scanned, **{k: report[k] for k in keep if k in report}, "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("group", choices=sorted(GROUPS))
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one compile may take")
    parser.add_argument("--only", choices=["scanned", "unrolled"], help="one layout only")
    args = parser.parse_args()
    out = REPO / "bench" / "results" / f"scan_compile_{args.group}.json"
    result: dict[str, object] = {"group": args.group, "cpu": cpu(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                                 "cases": []}
    layouts = [True, False] if args.only is None else [args.only == "scanned"]
    for i, (name, config, overrides) in enumerate(GROUPS[args.group]):
        case: dict[str, object] = {"case": name, "config": config.name, "overrides": overrides, "runs": []}
        result["cases"].append(case)  # type: ignore[union-attr]
        # alternate which layout goes first from case to case
        for scanned in (layouts if i % 2 == 0 else layouts[::-1]):
            run = compile_once(config, overrides, scanned, args.timeout)
            case["runs"].append(run)  # type: ignore[union-attr]
            print(json.dumps({"case": name, **run}), flush=True)
            atomic_write_json(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
