"""Where to keep the layer axis of stacked parameters: axis 0 (ours) or axis 1 (MaxText's ``param_scan_axis``).

A stack of SwiGLU MLP blocks at the 1B width (d_model 2,048, d_ff 5,632, 16 layers) is trained for one
step (forward + backward through ``lax.scan``, a loss on the output) with its parameters stored either
way, FSDP-sharded along d_model over v6e-8, and compiled ahead of time by libtpu on this CPU. Axis 1 is
moved to axis 0 for the loop, as a scan must; what is compared is what the compiler then needs: HBM per
chip (temporaries), the transposes and copies left in the optimized program, and compile time.

    .venvs/tpu/bin/python bench/bench_scan_axis.py     # writes bench/results/scan_axis.json
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

from experiment.files import atomic_write_json  # noqa: E402

D, F, LAYERS, ROWS, T = 2048, 5632, 16, 128, 2048


def measure(axis: int) -> dict[str, object]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from trainer.fit_check import topology_devices

    mesh = jax.sharding.Mesh(topology_devices("v6e-8"), ("fsdp",))
    stacked_shape = {0: (LAYERS, D, F), 1: (D, LAYERS, F)}[axis]
    spec = {0: P(None, "fsdp", None), 1: P("fsdp", None, None)}[axis]
    down_shape = {0: (LAYERS, F, D), 1: (F, LAYERS, D)}[axis]
    down_spec = {0: P(None, None, "fsdp"), 1: P(None, None, "fsdp")}[axis]
    weights = {"gate": jax.ShapeDtypeStruct(stacked_shape, jnp.float32, sharding=NamedSharding(mesh, spec)),
               "up": jax.ShapeDtypeStruct(stacked_shape, jnp.float32, sharding=NamedSharding(mesh, spec)),
               "down": jax.ShapeDtypeStruct(down_shape, jnp.float32, sharding=NamedSharding(mesh, down_spec))}
    x = jax.ShapeDtypeStruct((ROWS, T, D), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp", None, None)))

    def loss(params: dict, h: jax.Array) -> jax.Array:
        layers = {k: jnp.moveaxis(v, axis, 0).astype(jnp.bfloat16) for k, v in params.items()}

        def body(carry: jax.Array, w: dict) -> tuple[jax.Array, None]:
            hidden = jax.nn.silu(carry @ w["gate"]) * (carry @ w["up"])
            return carry + hidden @ w["down"], None

        out, _ = jax.lax.scan(jax.checkpoint(body, prevent_cse=False), h, layers)
        return jnp.mean(out.astype(jnp.float32) ** 2)

    step = jax.jit(jax.grad(loss), out_shardings={k: v.sharding for k, v in weights.items()})
    started = time.perf_counter()
    compiled = step.lower(weights, x).compile()
    seconds = time.perf_counter() - started
    text = compiled.as_text()
    memory = compiled.memory_analysis()
    return {"layer_axis": axis, "compile_s": round(seconds, 1), "temp_gib": memory.temp_size_in_bytes / 2**30,
            "argument_gib": memory.argument_size_in_bytes / 2**30,
            "transposes": len(re.findall(r"= \S+ transpose\(", text)), "copies": len(re.findall(r"= \S+ copy\(", text))}


def main() -> None:
    rows = [measure(axis) for axis in (0, 1, 0, 1)]  # alternating, twice
    for row in rows:
        print(json.dumps(row), flush=True)
    atomic_write_json(REPO / "bench" / "results" / "scan_axis.json",
                      {"shape": {"d_model": D, "d_ff": F, "layers": LAYERS, "rows": ROWS, "seq": T, "slice": "v6e-8"},
                       "runs": rows, "date": time.strftime("%Y-%m-%d")})


if __name__ == "__main__":
    main()
