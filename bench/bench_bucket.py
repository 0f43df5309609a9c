"""Shards and checkpoints in a bucket against local disk: the loader, the range-read libraries, Orbax.

Targets: local disk, the GCS JSON API (fake-gcs-server), S3 (moto), and each server behind a fault proxy
(tests/fault_proxy.py) that holds every request ``--latency-ms`` before forwarding it: the round trip of a
bucket in the same region, which loopback does not have. Each part runs its sides in ``--rounds`` interleaved
rounds (bench/interleave.py); figures are medians of the rounds, every round kept in the JSON.

1. Loader: a shard set of ``--shards`` shards (``--records-per-shard`` rows of ``--seq-len`` + 1 int64 token ids
   each, ``input_ids`` as recipe 03 writes them, a SHARDS manifest), built once locally and uploaded to a bucket
   on each server. Per target: the time from opening the shard set (manifest, listing, every index) to the first
   batch in hand, as process 1 of 2 (``verify=False``: no background hashing competes), and the loader's tokens/s
   over ``--batches`` batches of ``--batch`` rows after the first.
   The opening is also taken apart (``open``): one listing; every index read as the loader reads it; every index as
   one ranged GET of the size the listing gave.
2. Range reads: the same ``--range-records`` record byte ranges (each exactly ``[offset, next offset)``), 32 in
   flight, through fsspec (``BucketPath.read_range`` from a 32-thread pool: what the loader does), obstore
   (``get_range_async`` under a 32-slot semaphore; optional, not a project dependency) and TensorStore's kvstore
   (``KvStore.read(key, byte_range=slice(start, end))`` with the request-concurrency resource at 32).
3. Checkpoints: one step of a ``--checkpoint-mb`` MB float32 pytree saved and restored through
   ``trainer.checkpoint`` (``open_manager``, ``save``, ``restore``), synchronously.
4. Goals: local loader >= 1M tokens/s per host; with the added latency >= 10x the 8B config's per-host token
   rate at its plan's MFU (``cost.planner.plan``, x 8 chips per v6e host); the first batch within 10 s.

Both servers and the proxies run on this machine: a request costs the client, the proxy and the server CPU
of the same cores, which a real bucket does not; each measurement records the CPU time of all three (from /proc)
and, through a proxy, the requests, so the JSON says what bounds it. The proxies run in their own processes, so
their event loops do not hold this process's GIL. ``--read-threads`` (an experiment) sets the loader's
``BUCKET_READ_THREADS`` and ``OPEN_THREADS`` in this process only.

    .venv/bin/python bench/bench_bucket.py --rounds 3
Prints one JSON object (also written to ``--out``); progress goes to stderr.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["--serve-proxy"]:  # the proxy's own process: stdlib + the proxy only
    import json
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.fault_proxy import FaultProxy

    upstream, flavor, latency = sys.argv[2], sys.argv[3], float(sys.argv[4])
    with FaultProxy(upstream, flavor=flavor, latency=latency) as served:
        print(served.port, flush=True)
        for _line in sys.stdin:  # "stats": the counters; end of input: the parent is done
            print(json.dumps({"seen": served.seen, "forwarded": served.forwarded}), flush=True)
    raise SystemExit(0)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import concurrent.futures  # noqa: E402
import ctypes  # noqa: E402
import datetime as dt  # noqa: E402
import hashlib  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
from interleave import cpu_model, interleaved_rounds  # noqa: E402

from tests.storage_servers import StorageServers  # noqa: E402

CHIPS_PER_V6E_HOST = 8  # https://docs.cloud.google.com/tpu/docs/v6e, "Chips per host: 8"
LEVANTER_TOKENS_PER_S = 1_000_000  # Levanter's "about a million tokens per second per host"
FIRST_BATCH_GOAL_S = 10.0
IN_FLIGHT = 32  # range reads in flight per library (the loader's BUCKET_READ_THREADS)
PLAN_CONFIG = "recipes/configs/ru-8b-v6e-64.yaml"
MB = 1e6


def log(message: str) -> None:
    print(f"[bench_bucket {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)



def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def median(values: list[float], digits: int = 3) -> float:
    return round(statistics.median(values), digits)


# ------------------------------------------------------------------------------------------ proxies


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphaned proxy


class ProxyProcess:
    """A FaultProxy adding ``latency`` s per request, in a process of its own (its asyncio loop would otherwise
    take this process's GIL from the clients it delays); ``requests()`` counts what it has seen."""

    def __init__(self, upstream: str, flavor: str, latency: float) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, "--serve-proxy", upstream, flavor, str(latency)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        preexec_fn=_die_with_parent)
        assert self.process.stdout is not None and self.process.stdin is not None
        self.url = f"http://127.0.0.1:{int(self.process.stdout.readline())}"

    def requests(self) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return int(json.loads(self.process.stdout.readline())["seen"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


# ------------------------------------------------------------------------------------------ targets


@dataclass
class Target:
    """Where one side reads and writes: local disk (``scheme`` None) or a bucket, directly or through a proxy."""

    name: str
    scheme: str | None
    endpoint: str = ""  # the URL the clients talk to: the server's, or its proxy's
    bucket: str = ""  # gs://name or s3://name
    local_root: Path | None = None
    proxy: ProxyProcess | None = None
    server_pid: int | None = None  # the emulator's process, whose CPU time is read around each measurement

    @property
    def shards(self) -> str:
        return str(self.local_root / "shards") if self.scheme is None else f"{self.bucket}/shards"

    def checkpoints(self, name: str) -> str:
        return (str(self.local_root / "checkpoints" / name) if self.scheme is None
                else f"{self.bucket}/checkpoints/{name}")

    def requests(self) -> int | None:
        return self.proxy.requests() if self.proxy is not None else None

    def verified_dir(self) -> str:
        """Where recipe 04 keeps the shard verification records: the run's own ``verified/`` folder."""
        return str(self.local_root / "run" / "verified") if self.scheme is None else f"{self.bucket}/run/verified"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Snapshot:
    """Clocks and counters at one moment: where a measured stretch's time and CPU went."""

    wall: float
    client_cpu: float  # this process, every thread (Grain's, gcsfs's loop, TensorStore's and obstore's)
    server_cpu: float | None
    proxy_cpu: float | None
    requests: int | None


def snapshot(target: Target) -> Snapshot:
    proxy_pid = target.proxy.process.pid if target.proxy is not None else None
    return Snapshot(time.perf_counter(), time.process_time(),
                    cpu_seconds(target.server_pid) if target.server_pid else None,
                    cpu_seconds(proxy_pid) if proxy_pid else None, target.requests())


def since(a: Snapshot, b: Snapshot) -> dict[str, float | int | None]:
    def minus(x: float | int | None, y: float | int | None) -> float | int | None:
        return None if x is None or y is None else y - x

    return {"wall_s": b.wall - a.wall, "client_cpu_s": b.client_cpu - a.client_cpu,
            "server_cpu_s": minus(a.server_cpu, b.server_cpu), "proxy_cpu_s": minus(a.proxy_cpu, b.proxy_cpu),
            "requests": minus(a.requests, b.requests)}


def median_tree(runs: list[dict[str, Any]], digits: int = 4) -> dict[str, Any]:
    """The median of every numeric leaf over the rounds (nested dicts kept; a leaf that is ever None is left out)."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, dict):
            out[key] = median_tree([run[key] for run in runs], digits)
        elif all(isinstance(run[key], int | float) and not isinstance(run[key], bool) for run in runs):
            out[key] = round(statistics.median(run[key] for run in runs), digits)
    return out


def point_at(target: Target) -> None:
    """Point every client of this process at ``target``'s endpoint, and drop the clients made for another one:
    ours (experiment.storage.backends), the fsspec instances Orbax reaches through etils, TensorStore's (which
    reads its endpoints when a kvstore is opened)."""
    import fsspec
    from etils.epath import backend as epath_backend

    from experiment.storage import backends

    if target.scheme == "gs":
        os.environ["STORAGE_EMULATOR_HOST"] = target.endpoint
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = target.endpoint
    elif target.scheme == "s3":
        os.environ["AWS_ENDPOINT_URL"] = target.endpoint
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)
    backends._filesystems.clear()
    for protocol in ("gcs", "s3"):
        fsspec.get_filesystem_class(protocol).clear_instance_cache()
    epath_backend.fsspec_backend._get_filesystem.cache_clear()


# ------------------------------------------------------------------------------------------ the shard set


def build_shards(folder: Path, shards: int, records: int, seq_len: int, vocab: int) -> dict[str, Any]:
    """A shard set as recipe 03 leaves it (concat packing: one ``input_ids`` feature of seq_len + 1 ids per row),
    token ids uniform over the 8B config's vocabulary (3-byte varints, the upper end of a real text's size)."""
    from data_prep.shards.layout import feature_schema, shard_file_name, shard_summary
    from data_prep.shards.tfrecord import TFRecordWriter, encode_int64_rows
    from experiment.stages import SHARDS

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    entries = []
    for index in range(shards):
        rows = {"input_ids": rng.integers(0, vocab, (records, seq_len + 1), dtype=np.int64)}
        with TFRecordWriter(folder / shard_file_name("train", index)) as writer:
            writer.write_many(encode_int64_rows(rows))
        entries.append(shard_summary(writer, records * (seq_len + 1)))
    split = {"records": shards * records, "tokens": shards * records * (seq_len + 1), "documents": shards * records,
             "padding_tokens": 0, "dropped_tokens": 0}
    payload = {"tokenizer_sha256": "0" * 64, "tokenizer_kind": "bench", "vocab_size": vocab,
               "special_ids": {"eos": 1, "pad": 0}, "seq_len": seq_len, "packing": "concat",
               "feature_schema": feature_schema(seq_len, "concat"), "validation_percent": 0.0,
               "splits": {"train": {"shards": entries, **split},
                          "validation": {"shards": [], "records": 0, "tokens": 0, "documents": 0,
                                         "padding_tokens": 0, "dropped_tokens": 0}},
               "config": {"on_corrupt": "error", "records_per_shard": records}}
    SHARDS.write_manifest(folder, payload)
    return payload


def upload(local: Path, target: Target) -> float:
    """The shard folder into the target's bucket (straight to the server: the upload is not measured)."""
    from experiment.storage import backends, location

    started = time.perf_counter()
    fs = backends.filesystem(target.scheme or "")
    fs.put(f"{local}/", location(target.shards).fs_path, recursive=True)
    listed = location(target.shards).list_objects()
    wanted = sum(1 for p in local.iterdir() if p.is_file())
    if len(listed) != wanted:
        raise RuntimeError(f"{target.shards}: {len(listed)} objects after the upload, {wanted} files in {local}")
    return time.perf_counter() - started


# ------------------------------------------------------------------------------------------ 1. loader


def loader_once(target: Target, batch: int, batches: int, seed: int) -> dict[str, Any]:
    """What recipe 04's ``make_train_iterator`` does on process 1 of 2 (``verify=False``, the run's ``verified/``
    folder for the records), each phase metered: the manifest and the shard set's opening (a listing and every
    index, in parallel), the first batch, then ``batches`` more."""
    from data_prep.shards import loader
    from experiment.storage import location

    point_at(target)
    loader.SHARD_VERIFIER = loader.ShardVerifier()  # a fresh one: a second round would reuse the first's results
    begin = snapshot(target)
    manifest = loader.read_shards_manifest(target.shards)
    after_manifest = snapshot(target)
    source = loader.ShardSource(target.shards, "train", manifest, verify=False,
                                verified_dir=location(target.verified_dir()))
    opened = snapshot(target)
    iterator = loader.TrainIterator(source, 2 * batch, seed, 1, 2, read_threads=4)  # make_train_iterator's 4
    first = next(iterator)
    first_at = snapshot(target)
    tokens = 0
    for _ in range(batches):
        tokens += int(next(iterator)["inputs"].size)
    finished = snapshot(target)
    iterator.close()
    # the background thread looks up each shard's verification record (one request per shard, one at a time,
    # though process 1 does nothing with the answer); waiting keeps them out of the next measurement
    source.check_shards(wait=True)
    checked = snapshot(target)
    if first["inputs"].shape != (batch, int(manifest["seq_len"])):
        raise RuntimeError(f"{target.name}: a batch of shape {first['inputs'].shape}")
    stream_s = finished.wall - first_at.wall
    return {"first_batch_s": first_at.wall - begin.wall, "manifest_s": after_manifest.wall - begin.wall,
            "open_s": opened.wall - after_manifest.wall, "tokens_per_s": tokens / stream_s,
            "rows_per_s": batches * batch / stream_s, "verified_lookups_done_s": checked.wall - begin.wall,
            "phases": {"open": since(begin, opened), "first_batch": since(opened, first_at),
                       "stream": since(first_at, finished), "verified_lookups_after_stream": since(finished, checked)}}


# ------------------------------------------------------------------------------------------ open, dissected


def open_indexes(target: Target, how: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The shard set's opening, piece by piece: one listing, or every index read with OPEN_THREADS threads either
    as the loader does (``read_index``: a whole-object read) or as one ranged GET of the size the listing gave."""
    from data_prep.shards import loader
    from data_prep.shards.tfrecord import parse_index, read_index
    from experiment.storage import location

    point_at(target)
    base = location(target.shards)
    files = [entry["file"] for entry in manifest["splits"]["train"]["shards"]]
    listed = base.list_objects() if how == "ranged_get" else {}  # the loader has it from its listing: not timed
    before = snapshot(target)
    if how == "listing":
        count = len(base.list_objects())
    else:
        def one(name: str) -> int:
            path = base / name
            if how == "read_index":
                return int(read_index(path).size)
            index = base / f"{name}.index"
            return int(parse_index(index.read_range(0, listed[f"{name}.index"].size), index).size)

        with concurrent.futures.ThreadPoolExecutor(min(loader.OPEN_THREADS, len(files))) as pool:
            count = sum(pool.map(one, files))
    return {**since(before, snapshot(target)), "items": count}


# ------------------------------------------------------------------------------------------ 2. range reads


@dataclass(frozen=True)
class Ranges:
    """Record byte ranges ``(file, start, end)`` of the shard set, in a shuffled order, and their bytes' digest."""

    items: list[tuple[str, int, int]]
    digest: str
    nbytes: int


def record_ranges(local: Path, manifest: dict[str, Any], count: int) -> Ranges:
    from data_prep.shards.tfrecord import read_index

    items: list[tuple[str, int, int]] = []
    for entry in manifest["splits"]["train"]["shards"]:
        offsets = read_index(local / entry["file"]).tolist()
        bounds = [*offsets, int(entry["bytes"])]
        items += [(entry["file"], bounds[i], bounds[i + 1]) for i in range(len(offsets))]
        if len(items) >= count:
            break
    items = items[:count]
    random.Random(0).shuffle(items)  # the loader's reads are shuffled too: no two neighbours in a row
    digest = hashlib.sha256()
    for name, start, end in items:
        with open(local / name, "rb") as handle:
            handle.seek(start)
            digest.update(handle.read(end - start))
    return Ranges(items, digest.hexdigest(), sum(end - start for _, start, end in items))


def check_bytes(what: str, ranges: Ranges, chunks: list[bytes]) -> None:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    if digest.hexdigest() != ranges.digest:
        raise RuntimeError(f"{what}: the bytes read differ from the shard files'")


def read_fsspec(target: Target, ranges: Ranges) -> dict[str, Any]:
    """Our path: ``BucketPath.read_range`` (gcsfs / s3fs ``cat_file`` with start and end) from 32 threads."""
    from experiment.storage import location

    point_at(target)
    base = location(target.shards)
    paths = {name: base / name for name in {name for name, _, _ in ranges.items}}
    first = ranges.items[0]
    paths[first[0]].read_range(first[1], first[1] + 1)  # the client made and connected: not measured
    before = snapshot(target)
    with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
        chunks = list(pool.map(lambda item: paths[item[0]].read_range(item[1], item[2]), ranges.items))
    window = since(before, snapshot(target))
    check_bytes(f"fsspec {target.name}", ranges, chunks)
    return window


def obstore_version() -> str | None:
    try:
        return importlib.metadata.version("obstore")
    except importlib.metadata.PackageNotFoundError:
        return None


def read_obstore(target: Target, ranges: Ranges) -> dict[str, Any]:
    """obstore (Rust object_store): ``get_range_async`` of every range, 32 at a time, on one event loop."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(target.bucket.removeprefix("s3://"), prefix="shards", endpoint=target.endpoint,
                    region=os.environ.get("AWS_REGION", "us-east-1"),
                    access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                    secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                    virtual_hosted_style_request=False, client_options={"allow_http": True})

    async def read_all() -> tuple[dict[str, Any], list[bytes]]:
        first = ranges.items[0]
        await obstore.get_range_async(store, first[0], start=first[1], end=first[1] + 1)  # connected: not measured
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def one(item: tuple[str, int, int]) -> bytes:
            async with slots:
                return bytes(await obstore.get_range_async(store, item[0], start=item[1], end=item[2]))

        before = snapshot(target)
        chunks = await asyncio.gather(*(one(item) for item in ranges.items))
        return since(before, snapshot(target)), list(chunks)

    window, chunks = asyncio.run(read_all())
    check_bytes(f"obstore {target.name}", ranges, chunks)
    return window


def read_tensorstore(target: Target, ranges: Ranges) -> dict[str, Any]:
    """TensorStore's ``gcs`` / ``s3`` kvstore: every read issued at once, its request-concurrency resource at 32
    (TensorStore queues the rest itself)."""
    import tensorstore as ts

    point_at(target)  # the gcs driver reads TENSORSTORE_GCS_HTTP_URL when the kvstore is opened
    bucket = target.bucket.split("://", 1)[1]
    if target.scheme == "gs":
        spec: dict[str, Any] = {"driver": "gcs", "bucket": bucket, "path": "shards/"}
        context = {"gcs_request_concurrency": {"limit": IN_FLIGHT}}
    else:
        spec = {"driver": "s3", "bucket": bucket, "path": "shards/", "endpoint": target.endpoint,
                "aws_region": os.environ.get("AWS_REGION", "us-east-1"), "aws_credentials": {"type": "environment"}}
        context = {"s3_request_concurrency": {"limit": IN_FLIGHT}}
    store = ts.KvStore.open(spec, context=ts.Context(context)).result()
    first = ranges.items[0]
    store.read(first[0], byte_range=slice(first[1], first[1] + 1)).result()  # connected: not measured
    before = snapshot(target)
    futures = [store.read(name, byte_range=slice(start, end)) for name, start, end in ranges.items]
    results = [future.result() for future in futures]
    window = since(before, snapshot(target))
    if any(result.state != "value" for result in results):
        raise RuntimeError(f"tensorstore {target.name}: a range came back {results[0].state}")
    check_bytes(f"tensorstore {target.name}", ranges, [bytes(result.value) for result in results])
    return window


# ------------------------------------------------------------------------------------------ 3. checkpoints


def make_state(megabytes: float, arrays: int = 8) -> dict[str, Any]:
    """A train state for ``trainer.checkpoint.save``: ``megabytes`` MB of float32 params in ``arrays`` leaves, and a
    scalar each for the optimizer state, the step and the RNG (so the size is the params')."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    size = int(megabytes * MB) // 4 // arrays
    params = {f"w{i}": jnp.asarray(rng.standard_normal(size, dtype=np.float32)) for i in range(arrays)}
    return {"params": params, "opt_state": {"count": jnp.zeros((), jnp.int32)}, "step": jnp.asarray(0, jnp.int32),
            "rng": jax.random.key_data(jax.random.key(0))}


def state_bytes(state: dict[str, Any]) -> int:
    import jax

    return sum(leaf.nbytes for leaf in jax.tree.leaves(state))


def checkpoint_once(target: Target, state: dict[str, Any], name: str) -> dict[str, Any]:
    """One synchronous save of step 1 (Orbax through its commit), the wait for our checksums.json (read back and
    CRC32C'd off the step path: the manager's ``wait_until_finished``), and a restore of every array."""
    import jax
    import orbax.checkpoint as ocp

    from experiment.sections.train import TrainConfig
    from experiment.storage import location, remove_tree
    from trainer import checkpoint

    point_at(target)
    directory = target.checkpoints(name)
    manager = checkpoint.open_manager(directory, TrainConfig(async_checkpointing=False))
    # recipe 04 writes checkpoints/wandb_run.json before its first save; without an object under it, a fresh bucket
    # prefix is no folder, and the manager's first look into it (iterdir) raises FileNotFoundError (gs and s3)
    (location(directory) / "wandb_run.json").write_text('{"run_id": "bench"}', encoding="utf-8")
    started = snapshot(target)
    checkpoint.save(manager, 1, state, {"bench": True}, {"bench": True}, {"bench": True})
    saved = snapshot(target)
    manager.wait_until_finished()
    checksummed = snapshot(target)
    manager.close()
    if not (location(directory) / "1" / "checksums.json").is_file():
        raise RuntimeError(f"{target.name}: the save left no checksums.json")
    reader = checkpoint.open_manager(directory)  # read-only, as eval and a resume open it
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    restore_started = snapshot(target)
    restored, _items = checkpoint.restore(reader, 1, abstract)
    jax.block_until_ready(restored)
    restored_at = snapshot(target)
    reader.close()
    for got, want in zip(jax.tree.leaves(restored["params"]), jax.tree.leaves(state["params"]), strict=True):
        if np.asarray(got).tobytes() != np.asarray(want).tobytes():
            raise RuntimeError(f"{target.name}: the restored params differ from the saved ones")
    remove_tree(location(directory))  # the servers hold everything in memory
    return {"save_s": saved.wall - started.wall, "checksums_s": checksummed.wall - saved.wall,
            "restore_s": restored_at.wall - restore_started.wall,
            "phases": {"save": since(started, saved), "checksums": since(saved, checksummed),
                       "restore": since(restore_started, restored_at)}}


# ------------------------------------------------------------------------------------------ goals, tables


def host_rate() -> dict[str, Any]:
    """The 8B config's planned tokens/s per v6e host: the planner's row 0 (tpu-v6e, 64 chips) x 8 chips."""
    from cost.planner import plan
    from experiment.config import load_config

    cfg = load_config(str(REPO / PLAN_CONFIG), [])
    _model, _tokens, rows, _checks = plan(cfg, None)
    row = rows[0]
    per_chip = float(row["tokens_per_s_per_chip"])
    return {"config": PLAN_CONFIG, "accelerator": row["accelerator"], "chips": row["chips"],
            "mfu": round(row["mfu"], 4),
            "tokens_per_s_per_chip": round(per_chip, 1), "chips_per_host": CHIPS_PER_V6E_HOST,
            "tokens_per_s_per_host": round(per_chip * CHIPS_PER_V6E_HOST, 1)}


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def per(value: float | None, count: float | None, scale: float = 1e3) -> float | None:
    """``value / count`` x ``scale`` (CPU seconds per request, in ms by default), None where either is missing."""
    return None if value is None or not count else value / count * scale


def tables(result: dict[str, Any], names: list[str]) -> list[str]:
    """The README's tables, from this run's medians (printed by the bench, so no figure is copied by hand)."""
    lines: list[str] = []
    loader, ckpt = result.get("loader"), result.get("checkpoint")
    if loader and ckpt:
        mb = result["checkpoint_mb"]
        lines += ["| target | first batch s | of which open s | loader tokens/s | rows/s | verification lookups "
                  "done s | checkpoint save MB/s | save + checksums MB/s | restore MB/s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name in names:
            lo, ck = loader[name]["median"], ckpt[name]["median"]
            lines.append(f"| {name} | {fmt(lo['first_batch_s'], 2)} | {fmt(lo['manifest_s'] + lo['open_s'], 2)} | "
                         f"{fmt(lo['tokens_per_s'])} | {fmt(lo['rows_per_s'])} | "
                         f"{fmt(lo['verified_lookups_done_s'], 1)} | "
                         f"{fmt(mb / ck['save_s'], 1)} | {fmt(mb / (ck['save_s'] + ck['checksums_s']), 1)} | "
                         f"{fmt(mb / ck['restore_s'], 1)} |")
        lines += ["", "| loader phase (medians) | target | wall s | requests | client CPU ms / request | "
                  "server CPU ms / request | proxy CPU ms / request |", "|---|---|---:|---:|---:|---:|---:|"]
        for phase in ("open", "first_batch", "stream"):
            for name in names[1:]:
                ph = loader[name]["median"]["phases"][phase]
                # without a proxy the requests are not counted: the stream's rows stand in for them
                count = ph.get("requests") or (loader[name]["median"]["rows_per_s"] * ph["wall_s"]
                                               if phase == "stream" else None)
                lines.append(f"| {phase} | {name} | {fmt(ph['wall_s'], 2)} | {fmt(ph.get('requests'))} | "
                             f"{fmt(per(ph['client_cpu_s'], count), 2)} | "
                             f"{fmt(per(ph.get('server_cpu_s'), count), 2)} | "
                             f"{fmt(per(ph.get('proxy_cpu_s'), count), 2)} |")
    if result.get("ceilings"):
        lines += ["", "| loader stream (medians) | rows/s measured | ceiling from latency: threads / latency | "
                  "ceiling from this machine's CPUs: CPUs / CPU per request (client + server + proxy) | "
                  "client CPU ms / request |", "|---|---:|---:|---:|---:|"]
        for name, ceiling in result["ceilings"].items():
            lines.append(f"| {name} | {fmt(ceiling['rows_per_s'])} | {fmt(ceiling['latency_ceiling_rows_per_s'])} | "
                         f"{fmt(ceiling['cpu_ceiling_rows_per_s'])} | {fmt(ceiling['client_cpu_ms_per_request'], 2)} |")
    if "open_dissected" in result:
        lines += ["", f"| opening {result['shard_set']['shards']:,} shards, {result['loader_threads']['OPEN_THREADS']} "
                  "threads (medians) | target | wall s | requests | server CPU s |", "|---|---|---:|---:|---:|"]
        for how, by_target in result["open_dissected"].items():
            for name, entry in by_target.items():
                mid = entry["median"]
                lines.append(f"| {how} | {name} | {fmt(mid['wall_s'], 2)} | {fmt(mid.get('requests'))} | "
                             f"{fmt(mid.get('server_cpu_s'), 2)} |")
    if "range_reads" in result:
        lines += ["", f"| library ({result['range_records']:,} records, {IN_FLIGHT} in flight) | target | records/s | "
                  "MB/s | client CPU µs / record | server CPU µs / record |", "|---|---|---:|---:|---:|---:|"]
        for library, by_target in result["range_reads"]["libraries"].items():
            for name, entry in by_target.items():
                if "median" not in entry:
                    lines.append(f"| {library} | {name} | {entry['skipped']} | | | |")
                    continue
                mid = entry["median"]
                lines.append(f"| {library} | {name} | {fmt(entry['records_per_s'])} | {fmt(entry['mb_per_s'], 1)} | "
                             f"{fmt(per(mid['client_cpu_s'], result['range_records'], 1e6))} | "
                             f"{fmt(per(mid.get('server_cpu_s'), result['range_records'], 1e6))} |")
    if result.get("goals"):
        lines += ["", "| goal | measured | met |", "|---|---|---|"]
        for goal in result["goals"]:
            lines.append(f"| {goal['goal']} | {goal['measured']} | {'met' if goal['met'] else '**not met**'} |")
    return lines


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=30.0, help="added by the proxy to every request")
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--records-per-shard", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256, help="token ids are uniform below this (the 8B config's)")
    parser.add_argument("--batch", type=int, default=16, help="rows per batch of this process")
    parser.add_argument("--batches", type=int, default=160, help="batches timed after the first")
    parser.add_argument("--range-records", type=int, default=2000)
    parser.add_argument("--checkpoint-mb", type=float, default=64.0)
    parser.add_argument("--read-threads", type=int, default=None,
                        help="experiment: set the loader's BUCKET_READ_THREADS and OPEN_THREADS to this")
    parser.add_argument("--parts", default="loader,open,ranges,checkpoint", help="comma-separated subset to run")
    parser.add_argument("--workdir", type=Path, default=None, help="local files (default: a fresh temporary folder)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    today = dt.date.today().isoformat()
    out = args.out or REPO / "bench" / "results" / f"bucket_{today}.json"
    started = time.perf_counter()
    load_before = load_average()

    work = Path(tempfile.mkdtemp(prefix="bench-bucket-", dir=args.workdir))
    servers = StorageServers(work / "server-logs")  # forked before JAX or any client starts a thread
    os.environ.update(servers.env)
    latency = args.latency_ms / 1000
    lat = f"+{args.latency_ms:g}ms"
    proxies = {"gs": ProxyProcess(servers.gcs_endpoint, "gcs", latency),
               "s3": ProxyProcess(servers.s3_endpoint, "s3", latency)}
    try:
        from data_prep.shards import loader

        if args.read_threads is not None:  # an experiment only: the library's values are what the result names
            loader.BUCKET_READ_THREADS = loader.OPEN_THREADS = args.read_threads
        buckets = {scheme: servers.new_bucket(scheme, "bench") for scheme in ("gs", "s3")}
        gcs_pid, moto_pid = (process.pid for process in servers.processes)
        targets = [Target("local disk", None, local_root=work / "local"),
                   Target("gs", "gs", servers.gcs_endpoint, buckets["gs"], server_pid=gcs_pid),
                   Target("s3", "s3", servers.s3_endpoint, buckets["s3"], server_pid=moto_pid),
                   Target(f"gs{lat}", "gs", proxies["gs"].url, buckets["gs"], proxy=proxies["gs"], server_pid=gcs_pid),
                   Target(f"s3{lat}", "s3", proxies["s3"].url, buckets["s3"], proxy=proxies["s3"], server_pid=moto_pid)]
        names = [t.name for t in targets]
        result: dict[str, Any] = {
            "date": today, "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "load_average_before": load_before,
            "python": platform.python_version(),
            "versions": {p: importlib.metadata.version(p) for p in
                         ("gcsfs", "s3fs", "fsspec", "tensorstore", "orbax-checkpoint", "grain", "jax")}
            | {"obstore": obstore_version() or "not installed"},
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "loader_threads": {"BUCKET_READ_THREADS": loader.BUCKET_READ_THREADS, "OPEN_THREADS": loader.OPEN_THREADS},
            "notes": [
                "fake-gcs-server (one Go process), moto (one Python process) and the two latency proxies (one Python "
                f"process each) run on this same {os.cpu_count()}-CPU machine, in memory, on loopback: every request "
                "costs the client, the proxy and the server CPU of the same cores, which a real bucket does not",
                f"'{lat}': a FaultProxy holds every request {args.latency_ms:g} ms before forwarding it (requests in "
                "flight wait concurrently); it opens one upstream connection per request",
                "loader: recipe 04's make_train_iterator as process 1 of 2 (verify=False, verified_dir = the run's "
                "verified/), read_threads=4, which a bucket raises to BUCKET_READ_THREADS; Grain reads each batch's "
                "rows one after another in one of its threads, so a batch takes batch x (one request) and the "
                "threads give the requests in flight",
                "first batch: from reading the manifest to the first batch in hand; open = the manifest, the listing "
                "and every shard's index (OPEN_THREADS in flight); requests are counted by the proxies only",
                "CPU: client = this process (every thread), server = the emulator's process, proxy = the proxy's "
                "process, from /proc over the same stretch",
                "checkpoint: trainer.checkpoint.open_manager + save/restore (the train-state shape; params hold the "
                "MB), synchronous; save = Orbax through its commit; checksums = our checksums.json (a disk: the files "
                "CRC32C'd; a bucket: the storage's own checksums from a listing); restore = every array back; MB = 1e6 "
                "bytes",
                "obstore's GCS client speaks the XML API (GET /bucket/key); fake-gcs-server answers it 404, even for a "
                "key without / or . (tried with base_url and skip_signature): no obstore row for gs",
            ],
        }
        log(f"{len(targets)} targets; servers at {servers.gcs_endpoint} (gcs), {servers.s3_endpoint} (s3)")

        # ---- the shard set, once locally, then into each bucket
        local_shards = work / "local" / "shards"
        t0 = time.perf_counter()
        manifest = build_shards(local_shards, args.shards, args.records_per_shard, args.seq_len, args.vocab)
        records = args.shards * args.records_per_shard
        total_bytes = sum(e["bytes"] for e in manifest["splits"]["train"]["shards"])
        log(f"built {args.shards} shards ({total_bytes / MB:.1f} MB, {total_bytes / records:,.0f} bytes per record) "
            f"in {time.perf_counter() - t0:.1f} s")
        result["shard_set"] = {"shards": args.shards, "records": records, "bytes": total_bytes,
                               "bytes_per_record": round(total_bytes / records)}
        for target in targets[1:3]:
            point_at(target)
            log(f"uploaded to {target.shards} in {upload(local_shards, target):.1f} s")
        point_at(targets[0])

        if "loader" in parts:
            log("loader: warm-up (imports, Grain's first use) on local disk")
            loader_once(targets[0], args.batch, 2, seed=99)
            seeds = iter(range(10_000))

            def loader_side(target: Target) -> Callable[[], dict[str, Any]]:
                def run() -> dict[str, Any]:
                    one = loader_once(target, args.batch, args.batches, next(seeds))
                    log(f"loader {target.name}: first batch {one['first_batch_s']:.2f} s (open {one['open_s']:.2f} s), "
                        f"{one['tokens_per_s']:,.0f} tokens/s, verification-record lookups done at "
                        f"{one['verified_lookups_done_s']:.1f} s")
                    return one
                return run

            rounds = interleaved_rounds({t.name: loader_side(t) for t in targets}, args.rounds)
            result["loader"] = {name: {"rounds": runs, "median": median_tree(runs)} for name, runs in rounds.items()}

        if "open" in parts:
            sides_open: dict[str, Callable[[], dict[str, Any]]] = {}
            for how in ("listing", "read_index", "ranged_get"):
                for target in targets[1:]:
                    def open_side(target: Target = target, how: str = how) -> dict[str, Any]:
                        one = open_indexes(target, how, manifest)
                        log(f"open {how} {target.name}: {one['wall_s']:.2f} s, {one['requests']} requests")
                        return one
                    sides_open[f"{how} | {target.name}"] = open_side
            rounds_open = interleaved_rounds(sides_open, args.rounds)
            labels = {"listing": "one listing of the folder",
                      "read_index": "every index, as the loader reads it (read_index: a whole-object read)",
                      "ranged_get": "every index as one ranged GET of the listed size"}
            result["open_dissected"] = {labels[how]: {} for how in labels}
            for key, runs in rounds_open.items():
                how, name = key.split(" | ")
                result["open_dissected"][labels[how]][name] = {"rounds": runs, "median": median_tree(runs)}

        if "ranges" in parts:
            ranges = record_ranges(local_shards, manifest, args.range_records)
            result["range_records"], result["range_bytes"] = len(ranges.items), ranges.nbytes
            libraries: dict[str, Callable[[Target, Ranges], dict[str, Any]]] = {
                "fsspec (gcsfs / s3fs), 32 threads": read_fsspec, "tensorstore kvstore": read_tensorstore}
            if obstore_version() is not None:
                libraries["obstore"] = read_obstore
            sides: dict[str, Callable[[], dict[str, Any]]] = {}
            for library, read in libraries.items():
                for target in targets[1:]:
                    if library == "obstore" and target.scheme == "gs":
                        continue

                    def side(read: Callable[[Target, Ranges], dict[str, Any]] = read, target: Target = target,
                             library: str = library) -> dict[str, Any]:
                        one = read(target, ranges)
                        log(f"ranges {library} {target.name}: {len(ranges.items) / one['wall_s']:,.0f} records/s")
                        return one
                    sides[f"{library} | {target.name}"] = side
            rounds_r = interleaved_rounds(sides, args.rounds)
            by_library: dict[str, dict[str, Any]] = {library: {} for library in [*libraries, "obstore"]}
            for key, runs in rounds_r.items():
                library, name = key.split(" | ")
                mid = median_tree(runs)
                by_library[library][name] = {"rounds": runs, "median": mid,
                                             "records_per_s": round(len(ranges.items) / mid["wall_s"], 1),
                                             "mb_per_s": round(ranges.nbytes / MB / mid["wall_s"], 2)}
            for target in targets[1:]:
                if target.scheme == "gs":
                    by_library["obstore"][target.name] = {"skipped": "no GCS row: XML API not served by the emulator"}
                elif obstore_version() is None:
                    by_library["obstore"][target.name] = {"skipped": "not installed"}
            result["range_reads"] = {"in_flight": IN_FLIGHT, "libraries": by_library}

        if "checkpoint" in parts:
            import jax  # noqa: F401  (imported late: the servers and proxies were forked before its threads)

            state = make_state(args.checkpoint_mb)
            size_mb = state_bytes(state) / MB
            result["checkpoint_mb"] = round(size_mb, 2)
            small = make_state(1)
            for target in targets:
                checkpoint_once(target, small, "warm-up")  # imports, first connections, Orbax's first save
            names_iter = iter(range(10_000))

            def checkpoint_side(target: Target) -> Callable[[], dict[str, Any]]:
                def run() -> dict[str, Any]:
                    one = checkpoint_once(target, state, f"step-{next(names_iter)}")
                    log(f"checkpoint {target.name}: save {size_mb / one['save_s']:.1f} MB/s (+ checksums "
                        f"{one['checksums_s']:.2f} s), restore {size_mb / one['restore_s']:.1f} MB/s")
                    return one
                return run

            rounds_ck = interleaved_rounds({t.name: checkpoint_side(t) for t in targets}, args.rounds)
            result["checkpoint"] = {name: {"rounds": runs, "median": median_tree(runs)}
                                    for name, runs in rounds_ck.items()}

        if "loader" in parts:
            # what bounds the stream through each proxy: requests in flight over the latency, or the CPU that the
            # client, the emulator and the proxy spend per request on this machine's cores
            result["ceilings"] = {}
            for target in targets[3:]:
                mid = result["loader"][target.name]["median"]
                stream = mid["phases"]["stream"]
                if not stream.get("requests"):  # a tiny run: every row was read ahead of the timed stretch
                    continue
                cpu = (stream["client_cpu_s"] + stream["server_cpu_s"] + stream["proxy_cpu_s"]) / stream["requests"]
                result["ceilings"][target.name] = {
                    "rows_per_s": mid["rows_per_s"], "latency_ceiling_rows_per_s": loader.BUCKET_READ_THREADS / latency,
                    "cpu_ms_per_request": round(cpu * 1e3, 3),
                    "cpu_ceiling_rows_per_s": round((os.cpu_count() or 1) / cpu, 1),
                    "client_cpu_ms_per_request": round(stream["client_cpu_s"] / stream["requests"] * 1e3, 3)}

        # ---- goals
        rate = host_rate()
        result["plan"] = rate
        goals = []
        if "loader" in parts:
            mid = {name: result["loader"][name]["median"] for name in names}
            local_rate = mid["local disk"]["tokens_per_s"]
            goals.append({"goal": f"local disk: loader >= {LEVANTER_TOKENS_PER_S:,} tokens/s per host (Levanter)",
                          "measured": f"{local_rate:,.0f} tokens/s", "met": local_rate >= LEVANTER_TOKENS_PER_S})
            need = 10 * rate["tokens_per_s_per_host"]
            for name in (f"gs{lat}", f"s3{lat}"):
                got = mid[name]["tokens_per_s"]
                goals.append({"goal": f"{name}: loader >= 10 x {rate['tokens_per_s_per_host']:,.0f} = {need:,.0f} "
                              "tokens/s (the 8B plan per v6e host)",
                              "measured": f"{got:,.0f} tokens/s ({got / need * 10:.1f}x)", "met": got >= need})
            for name in names[1:]:
                got = mid[name]["first_batch_s"]
                goals.append({"goal": f"{name}: first batch of {args.shards:,} shards within {FIRST_BATCH_GOAL_S:g} s",
                              "measured": f"{got:.2f} s", "met": got <= FIRST_BATCH_GOAL_S})
        result["goals"] = goals
        result["tables"] = tables(result, names)
        result["load_average_after"] = load_average()
        result["wall_s"] = round(time.perf_counter() - started, 1)
    finally:
        for proxy in proxies.values():
            proxy.close()
        servers.close()
        shutil.rmtree(work, ignore_errors=True)

    text = json.dumps(result, indent=2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n", encoding="utf-8")
    print(text)
    log(f"wrote {out} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
