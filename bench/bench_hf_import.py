"""Peak host memory of importing a Hugging Face checkpoint (model/hf_checkpoint.py), against its safetensors size.

Writes a ~300M-parameter Llama-shaped bf16 checkpoint (random weights, one safetensors file, or
sharded with ``--shards``) in a child process, then imports it in a fresh child with
``load_hf_checkpoint(folder, param_dtype)`` and reports that child's peak RSS (``ru_maxrss``), its RSS
right after importing jax/flax (the interpreter's own share), and both over the safetensors size.

    python bench/bench_hf_import.py                         # bf16 parameters, one file
    python bench/bench_hf_import.py --param-dtype float32   # fp32 master weights: the state alone is 2x
    python bench/bench_hf_import.py --layouts scanned        # one layer layout (default: scanned, then unrolled)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = {"d_model": 1024, "n_layers": int(os.environ.get("BENCH_LAYERS", 20)), "n_heads": 16, "n_kv_heads": 8,
         "d_ff": 2816, "max_seq_len": 2048, "tie_embeddings": False}
VOCAB = 32_000


def write(folder: str, shards: int) -> None:
    import ml_dtypes
    import numpy as np
    from flax import nnx
    from safetensors.numpy import save_file

    from model.llama.config import LlamaConfig
    from model.llama.family import LLAMA
    from model.llama.hf import hf_tensors, llama_config

    cfg = LlamaConfig(**SHAPE, scan_layers=False)  # per-layer shapes, as the HF file has them
    pure = nnx.to_pure_dict(nnx.state(LLAMA.abstract(cfg, VOCAB), nnx.Param))
    pure_shapes = {}
    for t in hf_tensors(cfg):
        node = pure
        for key in t.path:
            node = node[key]
        pure_shapes[t.name] = t.hf_shape(tuple(node.shape))
    rng = np.random.default_rng(0)
    names = list(pure_shapes)
    groups = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for i, group in enumerate(groups):
        file = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {n: (rng.standard_normal(pure_shapes[n], dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
                   for n in group}
        save_file(tensors, str(Path(folder) / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in group})
        del tensors
    if shards > 1:
        (Path(folder) / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}))
    (Path(folder) / "config.json").write_text(json.dumps(llama_config(cfg, VOCAB)))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def load(folder: str, param_dtype: str, layout: str) -> None:
    import jax  # noqa: F401
    from flax import nnx  # noqa: F401

    from model.hf_checkpoint import load_hf_checkpoint

    base = rss_mb()
    start = time.perf_counter()
    imported = load_hf_checkpoint(Path(folder), param_dtype, scan_layers=layout == "scanned")
    seconds = time.perf_counter() - start
    n = sum(x.size for x in jax.tree.leaves(imported.state))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"params": n, "base_rss_mb": base, "peak_rss_mb": peak, "seconds": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--param-dtype", default="bfloat16")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--child", choices=["write", "load"])
    parser.add_argument("--folder")
    parser.add_argument("--layouts", default="scanned,unrolled", help="layer layouts to import into, in turn")
    args = parser.parse_args()
    if args.child == "write":
        return write(args.folder, args.shards)
    if args.child == "load":
        return load(args.folder, args.param_dtype, args.layouts)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with tempfile.TemporaryDirectory() as folder:
        me = [sys.executable, __file__, "--folder", folder]
        subprocess.run([*me, "--child", "write", "--shards", str(args.shards)], check=True, env=env)
        size = sum(p.stat().st_size for p in Path(folder).glob("*.safetensors")) / 2**20
        for layout in args.layouts.split(","):
            out = subprocess.run([*me, "--child", "load", "--param-dtype", args.param_dtype, "--layouts", layout],
                                 check=True, env=env, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            print(f"{result['params'] / 1e6:.0f}M parameters, bf16 safetensors {size:.0f} MB in {args.shards} file(s), "
                  f"param dtype {args.param_dtype}, {layout} layers: import {result['seconds']:.1f} s, peak RSS "
                  f"{result['peak_rss_mb']:.0f} MB = {result['peak_rss_mb'] / size:.2f}x the file; after importing jax "
                  f"{result['base_rss_mb']:.0f} MB, the import's own share "
                  f"{(result['peak_rss_mb'] - result['base_rss_mb']) / size:.2f}x")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
