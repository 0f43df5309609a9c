"""A probe, not the bench: save and restore MB/s of one Orbax checkpoint step on s3 (moto), gs (fake-gcs-server)
and a local folder, with ``trainer.orbax_s3`` teaching Orbax ``s3://``.

One step of a ~64 MB float32 pytree (``--mb``), saved by a ``CheckpointManager`` with the options a bucket gets
from ``checkpoint_options_for`` (synchronous save: the time is the whole write, commit marker included), then
restored into fresh arrays; ``--rounds`` rounds, the backends interleaved within each, every save to a fresh
folder. The servers are the tests' (tests/storage_servers.py, on loopback, in memory), so the bucket figures
are what Orbax + TensorStore + the client libraries cost on this machine's CPU, not what a real network gives.
Prints JSON.

    .venv/bin/python bench/bench_checkpoint_s3_probe.py --mb 64 --rounds 3
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# etils' gs:// filesystem would otherwise ask the storage control API for the bucket type on every file it
# opens (Google credentials, gRPC) and fall back after a warning: time the emulator would bill to gs
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # tests.storage_servers

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from experiment.storage import location, remove_tree  # noqa: E402
from tests.storage_servers import StorageServers  # noqa: E402
from trainer import orbax_s3  # noqa: E402

BACKENDS = ("s3", "gs", "local")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def make_tree(megabytes: int, arrays: int = 8) -> dict[str, jax.Array]:
    rng = np.random.default_rng(0)
    size = megabytes * (1 << 20) // 4 // arrays
    return {f"w{i}": jax.numpy.asarray(rng.standard_normal(size, dtype=np.float32)) for i in range(arrays)}


def tree_bytes(tree: dict[str, jax.Array]) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


def one_round(directory: str, tree: dict[str, jax.Array]) -> dict[str, float]:
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False,
                                           **orbax_s3.checkpoint_options_for(directory))
    manager = ocp.CheckpointManager(directory, item_names=("params",), options=options)
    started = time.perf_counter()
    manager.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(tree)))
    manager.wait_until_finished()
    saved = time.perf_counter() - started
    manager.close()
    reader = ocp.CheckpointManager(directory, item_names=("params",),
                                   options=ocp.CheckpointManagerOptions(**orbax_s3.checkpoint_options_for(directory)))
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    started = time.perf_counter()
    restored = reader.restore(1, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract)))["params"]
    jax.block_until_ready(restored)
    loaded = time.perf_counter() - started
    reader.close()
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(tree), strict=True):
        if np.asarray(got).tobytes() != np.asarray(want).tobytes():
            raise AssertionError(f"{directory}: the restored arrays differ from the saved ones")
    return {"save_s": saved, "restore_s": loaded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="pytree size in MiB (float32)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-dir", type=Path, default=None, help="where the local folders go (default: $TMPDIR)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ckpt-s3-probe-", dir=args.local_dir))
    servers = StorageServers(work / "server-logs")  # forked before JAX starts its threads
    os.environ.update(servers.env)
    tree = make_tree(args.mb)
    size_mb = tree_bytes(tree) / 1e6
    times: dict[str, list[dict[str, float]]] = {backend: [] for backend in BACKENDS}
    try:
        buckets = {scheme: servers.new_bucket(scheme, "probe") for scheme in ("s3", "gs")}
        one_round(f"{buckets['s3']}/warmup", make_tree(1))  # compiles nothing, but imports and connects once
        one_round(f"{buckets['gs']}/warmup", make_tree(1))
        for round_index in range(args.rounds):
            for backend in BACKENDS:
                directory = (str(work / f"local-{round_index}") if backend == "local"
                             else f"{buckets[backend]}/round-{round_index}")
                times[backend].append(one_round(directory, tree))
                if backend == "local":
                    shutil.rmtree(directory)
                else:
                    remove_tree(location(directory))  # moto and fake-gcs-server hold it in memory
    finally:
        servers.close()
        shutil.rmtree(work, ignore_errors=True)

    def summary(rounds: list[dict[str, float]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for what in ("save", "restore"):
            rates = [size_mb / r[f"{what}_s"] for r in rounds]
            out[f"{what}_mb_s"] = [round(rate, 1) for rate in rates]
            out[f"{what}_mb_s_median"] = round(statistics.median(rates), 1)
        return out

    print(json.dumps({
        "cpu": cpu_model(), "cores": os.cpu_count(), "mb": round(size_mb, 1), "rounds": args.rounds,
        "orbax": orbax_s3.orbax_version(), "tensorstore": importlib.metadata.version("tensorstore"),
        "note": "MB = 1e6 bytes; loopback servers in memory (moto, fake-gcs-server); local: "
                f"{args.local_dir or tempfile.gettempdir()}; sync save incl. commit, restore incl. block_until_ready",
        "backends": {backend: summary(times[backend]) for backend in BACKENDS},
    }, indent=2))


if __name__ == "__main__":
    main()
