"""What the checksums of a checkpoint step cost, against the save and the restore of the same step.

Saves one step of a state shaped like a ~100M-parameter run (fp32 params and two AdamW moments:
~1.2 GB) with the trainer's checkpoint manager, then times in interleaved rounds: writing
``checksums.json`` (CRC32C of every file), verifying it, SHA-256 of the same files (the peer
hash), reading the files without hashing (the I/O floor), and Orbax's restore of the step.
Files are in the page cache after the first round (as when the trainer checksums a step it has
just written); a resume after a reboot reads them from disk. Prints JSON.

    python bench/bench_checkpoint_checksums.py --params-m 100 --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from experiment.sections.train import TrainConfig
from trainer import checkpoint, checkpoint_integrity

CHUNK = 4 << 20


def make_state(params_m: int, arrays: int = 12) -> dict:
    rng = np.random.default_rng(0)
    size = params_m * 1_000_000 // arrays

    def tree() -> dict:
        return {f"w{i}": rng.standard_normal(size, dtype=np.float32) for i in range(arrays)}

    host = {"params": tree(), "opt_state": {"mu": tree(), "nu": tree()}, "step": np.int32(1),
            "rng": np.zeros(2, np.uint32)}
    return jax.tree.map(jax.numpy.asarray, host)


def read_all(step_dir: Path, digest: Callable[[], object] | None = None) -> None:
    for path in checkpoint_integrity.step_files(step_dir):
        hasher = digest() if digest else None
        with open(path, "rb") as handle:
            while block := handle.read(CHUNK):
                if hasher is not None:
                    hasher.update(block)  # type: ignore[attr-defined]


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-m", type=int, default=100, help="parameters, in millions")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    state = make_state(args.params_m)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "checkpoints"
        manager = checkpoint.open_manager(directory, TrainConfig(async_checkpointing=False))
        save_s = timed(lambda: checkpoint.save(manager, 1, state, {}, {}, {}, force=True))
        step_dir = directory / "1"
        total_bytes = sum(p.stat().st_size for p in checkpoint_integrity.step_files(step_dir))
        sides: dict[str, Callable[[], object]] = {
            "write_checksums_crc32c": lambda: checkpoint_integrity.write_checksums(step_dir),
            "verify_checksums_crc32c": lambda: checkpoint_integrity.verify_checksums(step_dir),
            "sha256_all_files": lambda: read_all(step_dir, hashlib.sha256),
            "read_all_files": lambda: read_all(step_dir),
            "orbax_restore": lambda: checkpoint.restore(manager, 1, abstract),
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, fn in sides.items():
                times[name].append(timed(fn))
        manager.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(json.dumps({
        "cpu": platform.processor() or platform.machine(), "params_m": args.params_m, "rounds": args.rounds,
        "step_bytes": total_bytes, "orbax_sync_save_s": round(save_s, 3),
        "median_s": {k: round(v, 4) for k, v in medians.items()},
        "mb_per_s": {k: round(total_bytes / 1e6 / v, 1) for k, v in medians.items() if k != "orbax_restore"},
        "verify_over_restore": round(medians["verify_checksums_crc32c"] / medians["orbax_restore"], 3),
        "rounds_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
