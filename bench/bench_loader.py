"""Loader speed against the train step's consumption, and our TFRecord reader against tf.data.

1. Loader tokens per CPU-second (one core: ``read_threads=1``, measured as this process's CPU
   time) against the tokens per second the real train step (``trainer.step.TrainProgram``)
   consumes on this whole machine, for the experiment config given (default: the CPU demo).
   Goal: ratio >= 20, i.e. one core of loading feeds twenty machines' worth of training.
2. Reading every train record of the same shards: our reader (index + CRC check + Example
   decode) against ``tf.data.TFRecordDataset`` + ``tf.io.parse_single_example``, when TensorFlow
   is importable (run this script with the `tf` extra's interpreter to get that row).

    python bench/bench_loader.py --config recipes/configs/demo.yaml
    .venvs/tf/bin/python bench/bench_loader.py --skip-train-step   # adds the tf.data row
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def build_shards(cfg: Any, workdir: Path, text_mb: float) -> Path:
    from bench_shards import prepare_run

    from data_prep.shards.build import shard_corpus

    run_folder, _docs = prepare_run(workdir, text_mb, cfg.tokenizer.vocab_size)
    shard_corpus(cfg, run_folder, None)
    return run_folder.shards


def bench_loader(shards: Path, batch_size: int, batches: int) -> dict[str, float]:
    from data_prep.shards.loader import make_train_iterator

    iterator = make_train_iterator(shards, batch_size, seed=0, read_threads=1)
    first = next(iterator)  # opens the shards, starts the reader thread
    tokens = batches * first["inputs"].size
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"loader_tokens_per_cpu_s": tokens / cpu, "loader_tokens_per_wall_s": tokens / wall}


def bench_train_step(cfg: Any, vocab_size: int, steps: int) -> dict[str, float]:
    import jax
    import numpy as np

    from model.sharding import build_mesh
    from trainer.step import TrainProgram

    mesh = build_mesh(cfg.train.mesh)
    program = TrainProgram(cfg.model, cfg.train, vocab_size, mesh, seed=0)
    state = program.init_state()
    rng = np.random.default_rng(0)
    shape = (cfg.train.batch_size, cfg.model.max_seq_len)
    batch = {name: jax.device_put(rng.integers(0, vocab_size, shape, dtype=np.int32), program.batch_sharding)
             for name in ("inputs", "targets")}
    state, metrics = program.step(state, batch)  # compile
    jax.block_until_ready(metrics)
    started = time.perf_counter()
    for _ in range(steps):
        state, metrics = program.step(state, batch)
    jax.block_until_ready(metrics)
    seconds = time.perf_counter() - started
    return {"train_step_tokens_per_s": steps * shape[0] * shape[1] / seconds, "train_step_s": seconds / steps}


def bench_readers(shards: Path) -> dict[str, Any]:
    """Every train record, decoded to token arrays: ours against tf.data (if TensorFlow is here)."""
    import numpy as np

    from data_prep.shards.loader import ShardSource

    source = ShardSource(shards, "train")
    files = [str(f.path) for f in source.files]
    started = time.perf_counter()
    ours = sum(int(source[i]["input_ids"].sum()) for i in range(len(source)))
    result: dict[str, Any] = {"records": len(source),
                              "ours_records_per_s": len(source) / (time.perf_counter() - started)}
    try:
        import tensorflow as tf
    except ImportError:
        result["tf_data"] = "tensorflow not importable: run with the `tf` extra's interpreter for this row"
        return result
    spec = {name: tf.io.FixedLenFeature([source.row_len], tf.int64) for name in source.features}
    dataset = tf.data.TFRecordDataset(files).map(lambda record: tf.io.parse_single_example(record, spec))
    started = time.perf_counter()
    theirs = sum(int(np.sum(example["input_ids"])) for example in dataset.as_numpy_iterator())
    result["tf_data_records_per_s"] = len(source) / (time.perf_counter() - started)
    result["same_tokens"] = ours == theirs
    result["ratio_ours_to_tf_data"] = result["ours_records_per_s"] / result["tf_data_records_per_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "recipes" / "configs" / "demo.yaml"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.max_seq_len=1024")
    parser.add_argument("--text-mb", type=float, default=4.0)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip-train-step", action="store_true")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ru-bench-loader")
    args = parser.parse_args()

    from experiment.config import load_config

    cfg = load_config(args.config, [*args.overrides, "shards.num_threads=0"])
    shards = build_shards(cfg, args.workdir, args.text_mb)
    vocab_size = json.loads((shards / "manifest.json").read_text(encoding="utf-8"))["vocab_size"]
    result: dict[str, Any] = {"bench": "loader_vs_train_step", "config": Path(args.config).name,
                              "seq_len": cfg.model.max_seq_len, "batch_size": cfg.train.batch_size,
                              "cpu_cores": os.cpu_count()}
    result.update(bench_loader(shards, cfg.train.batch_size, args.batches))
    if not args.skip_train_step:
        result.update(bench_train_step(cfg, vocab_size, args.steps))
        result["ratio_loader_per_core_to_train_step"] = (result["loader_tokens_per_cpu_s"]
                                                         / result["train_step_tokens_per_s"])
        result["goal_ratio"] = 20
    result["readers"] = bench_readers(shards)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}, indent=2, default=str))


if __name__ == "__main__":
    main()
