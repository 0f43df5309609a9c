"""Train-step throughput: our JAX/Flax step vs PyTorch + transformers ``LlamaForCausalLM``, eager and
``torch.compile``d, same CPU.

Both train the same Llama shape (RMSNorm, RoPE, SwiGLU, GQA, tied embeddings) on the same batch
and sequence length with AdamW and gradient clipping. Each side runs in its own process (so peak
host memory is its own) and measures its framework's fp32 matmul peak on this machine; MFU is
model FLOPs per second (hand-counted, ``model/llama/flops.py``) over the higher of the two measured peaks.

    python bench/bench_train_step.py                      # the demo shape, fp32 and bf16
    python bench/bench_train_step.py --torch-python .venvs/hf/bin/python --dtypes float32 --rounds 8
    python bench/bench_train_step.py --no-torch --layouts scanned,unrolled,scanned:1 --dtypes float32 --rounds 8
        # scanned layers (scan_unroll by platform) vs the Python loop vs the rolled scan (one layer per iteration)

Every side stays up as a worker process and runs ``--steps`` timed steps in turn, ``--rounds`` times
(order rotating, ``interleave.py``), so a slow spell of a shared machine hits all of them; each ratio
is the median of the per-round ratios. Our side applies recipe 4's CPU-host settings
(``trainer/cpu_host.py``) unless ``--no-cpu-host``. The ``torch.compile`` peer compiles the forward
pass and loss (inductor, default mode; backward through AOTAutograd, optimizer eager), as
torchtitan compiles its model; its compile time is in ``compile_s``. ``--no-torch-compile`` leaves
it out. The JSON records the CPU model and its vector/matrix flags (AMX decides PyTorch's bf16
speed) and every side's peak RSS.

The PyTorch side needs torch 2.13 and transformers 5 (the ``hf`` extra), by default from
.venvs/hf or RU_TORCH_PYTHON. On a GPU, ``--no-torch`` runs the JAX side alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from interleave import interleaved_rounds, median_ratio

REPO = Path(__file__).resolve().parents[1]


def matmul_peak_jax(n: int = 2048, repeats: int = 5) -> float:
    import jax
    import jax.numpy as jnp

    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f(a, a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def matmul_peak_torch(n: int = 2048, repeats: int = 5) -> float:
    import torch

    a = torch.ones((n, n), dtype=torch.float32)
    torch.mm(a, a)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, a)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux reports KiB


def step_runner(model_cfg: Any, train_cfg: Any, vocab: int, seq_len: int) -> tuple[Any, dict[str, Any]]:
    """Our trainer's real step on one fixed random batch: ``run(k)`` -> seconds per step over k steps,
    and the box that holds the state and the last metrics."""
    import jax
    import numpy as np

    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch

    program = TrainProgram(model_cfg, train_cfg, vocab, build_mesh(train_cfg.mesh), seed=0)
    box: dict[str, Any] = {"state": program.init_state()}
    rows = np.random.default_rng(0).integers(0, vocab, (train_cfg.batch_size, seq_len + 1)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding)

    def run(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            box["state"], box["metrics"] = program.step(box["state"], batch)
        jax.block_until_ready(box["metrics"])
        return (time.perf_counter() - start) / steps

    return run, box


def jax_worker(args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any]:
    """(facts, run(k) -> seconds per step, finish() -> final facts) for our trainer's real step."""
    import jax

    from experiment.sections.train import TrainConfig
    from model.llama.config import LlamaConfig
    from model.llama.flops import train_flops_per_token
    from trainer.cpu_host import prepare_cpu_host

    model_cfg = LlamaConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                            n_kv_heads=args.n_kv_heads, d_ff=args.d_ff, max_seq_len=args.seq_len,
                            attention=args.attention, remat=args.remat, scan_layers=args.scan_layers == "true",
                            scan_unroll=args.scan_unroll)
    train_cfg = TrainConfig(steps=1000, batch_size=args.batch, warmup_steps=10, compute_dtype=args.dtype,
                            cpu_devices=args.cpu_devices)
    host = prepare_cpu_host(train_cfg) if args.cpu_host else {}  # as recipe 4 does, before JAX starts
    run, box = step_runner(model_cfg, train_cfg, args.vocab, args.seq_len)
    compile_s = run(1)
    facts = {"framework": f"jax {jax.__version__}", "dtype": args.dtype, "compile_s": compile_s,
             "scan_layers": model_cfg.scan_layers, "scan_unroll": model_cfg.scan_unroll,
             "devices": jax.device_count(), "cpu_host": host, "backend": jax.default_backend(),
             "flops_per_token": train_flops_per_token(model_cfg, args.vocab, args.seq_len)}

    def finish() -> dict[str, Any]:
        return {"loss": float(box["metrics"]["loss"]), "peak_rss_gib": peak_rss_gib(),
                "matmul_peak_flops": matmul_peak_jax() if jax.default_backend() == "cpu" else None}

    return facts, run, finish


def cpu_facts() -> dict[str, Any]:
    """The CPU model, logical CPUs and the flags that decide matmul speed (AVX-512, VNNI, AMX, ...)."""
    model, flags = "unknown", []
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.split()
    except OSError:
        pass
    notable = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4")) or "vnni" in f
                     or "bf16" in f)
    return {"model": model, "logical_cpus": os.cpu_count(), "flags": notable,
            "amx": any(f.startswith("amx") for f in flags)}


def torch_worker(args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any]:
    import torch
    import transformers
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    config = HFLlamaConfig(vocab_size=args.vocab, hidden_size=args.d_model, intermediate_size=args.d_ff,
                         num_hidden_layers=args.n_layers, num_attention_heads=args.n_heads,
                         num_key_value_heads=args.n_kv_heads, max_position_embeddings=args.seq_len,
                         rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    box: dict[str, float] = {}

    def forward_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=inputs).logits
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, args.vocab), targets.reshape(-1))

    compiled = args.worker == "torch-compile"
    loss_of = torch.compile(forward_loss) if compiled else forward_loss

    def step() -> None:
        loss = loss_of(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        box["loss"] = float(loss)

    def run(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - start) / steps

    facts = {"framework": f"torch {torch.__version__} + transformers {transformers.__version__}"
                          + (" (torch.compile, inductor)" if compiled else " (eager)"),
             "dtype": args.dtype, "compile_s": run(1), "n_params": sum(p.numel() for p in model.parameters())}

    def finish() -> dict[str, Any]:
        return {"loss": box["loss"], "peak_rss_gib": peak_rss_gib(), "matmul_peak_flops": matmul_peak_torch()}

    return facts, run, finish


def serve(args: argparse.Namespace) -> None:
    """Worker loop: set up, warm up, then time ``RUN k`` requests from the driver until ``DONE``."""
    facts, run, finish = jax_worker(args) if args.worker == "jax" else torch_worker(args)
    run(args.warmup)
    print("READY " + json.dumps(facts), flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[0] == "RUN":
            print(json.dumps({"step_s": run(int(command[1]))}), flush=True)
        else:
            print(json.dumps(finish()), flush=True)
            return


class Worker:
    """A benchmark side in its own process (so its peak memory is its own), driven over stdin/stdout."""

    def __init__(self, python: str, kind: str, argv: list[str]) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.kind = kind
        self.proc = subprocess.Popen([python, __file__, "--worker", kind, *argv], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.facts = json.loads(self._line().removeprefix("READY "))

    def _line(self) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(("READY ", "{")):
                return line
        raise SystemExit(f"{self.kind} worker failed:\n{self.proc.stderr.read()[-3000:] if self.proc.stderr else ''}")

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def close(self) -> dict[str, Any]:
        final = self.ask("DONE")
        self.proc.wait(timeout=60)
        return {**self.facts, **final}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["jax", "torch", "torch-compile"])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--n-kv-heads", type=int, default=2)
    parser.add_argument("--d-ff", type=int, default=704)
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side in each round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds; the sides alternate, medians are reported")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="driver: the dtypes to compare")
    parser.add_argument("--attention", default="dot_product", choices=["einsum", "dot_product"])
    parser.add_argument("--remat", default="none")
    parser.add_argument("--cpu-devices", type=int, default=0, help="train.cpu_devices for our side")
    parser.add_argument("--scan-layers", choices=["true", "false"], default="true", help="worker: model.scan_layers")
    parser.add_argument("--scan-unroll", type=int, default=0, help="worker: model.scan_unroll (0: by platform)")
    parser.add_argument("--layouts", default="scanned",
                        help="driver: our sides, comma-separated: scanned (side 'jax'), "
                             "unrolled (side 'jax_unrolled'), "
                             "scanned:N (scanned with model.scan_unroll=N, side 'jax_scanned_N')")
    parser.add_argument("--no-cpu-host", dest="cpu_host", action="store_false",
                        help="our side without trainer/cpu_host.py's settings (one device, default allocator)")
    parser.add_argument("--torch-python", default=os.environ.get("RU_TORCH_PYTHON", ".venvs/hf/bin/python"))
    parser.add_argument("--no-torch", action="store_true", help="only the JAX side (e.g. on a GPU)")
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="leave out the torch.compile peer (PyTorch eager only)")
    args = parser.parse_args()
    if args.worker:
        serve(args)
        return

    shape = ["--d-model", str(args.d_model), "--n-layers", str(args.n_layers), "--n-heads", str(args.n_heads),
             "--n-kv-heads", str(args.n_kv_heads), "--d-ff", str(args.d_ff), "--vocab", str(args.vocab),
             "--seq-len", str(args.seq_len), "--batch", str(args.batch), "--warmup", str(args.warmup),
             "--attention", args.attention, "--remat", args.remat, "--cpu-devices", str(args.cpu_devices)]
    if not args.cpu_host:
        shape.append("--no-cpu-host")
    rows = []
    for dtype in args.dtypes.split(","):
        layouts = args.layouts.split(",")
        sides = {}
        for layout in layouts:  # the first layout is the side the peers' ratios are taken against
            name = "jax" if layout == layouts[0] else f"jax_{layout.replace(':', '_')}"
            kind, _, unroll = layout.partition(":")
            scan = {"scanned": "true", "unrolled": "false"}[kind]
            sides[name] = Worker(sys.executable, "jax", [*shape, "--dtype", dtype, "--scan-layers", scan,
                                                         "--scan-unroll", unroll or "0"])
        if not args.no_torch:
            sides["torch"] = Worker(args.torch_python, "torch", [*shape, "--dtype", dtype])
            if args.torch_compile:
                sides["torch_compile"] = Worker(args.torch_python, "torch-compile", [*shape, "--dtype", dtype])
        times = interleaved_rounds({name: (lambda w=worker: w.ask(f"RUN {args.steps}")["step_s"])
                                    for name, worker in sides.items()}, args.rounds)
        row: dict[str, Any] = {"dtype": dtype}
        for name, worker in sides.items():
            step_s = statistics.median(times[name])
            row[name] = {**worker.close(), "step_s": step_s, "step_s_rounds": [round(t, 4) for t in times[name]],
                         "tokens_per_s": args.batch * args.seq_len / step_s}
        peaks = [row[name]["matmul_peak_flops"] for name in sides if row[name]["matmul_peak_flops"]]
        for name in sides:
            if peaks:
                row[name]["mfu_vs_measured_matmul_peak"] = (row[name]["tokens_per_s"] * row["jax"]["flops_per_token"]
                                                            / max(peaks))
        for name in sides:
            if name != "jax":  # tokens/s ratio = the peer's step time over ours, round by round
                row[f"ratio_tokens_per_s_jax_over_{name}"] = median_ratio(times[name], times["jax"])
                row[f"ratio_peak_rss_jax_over_{name}"] = round(row["jax"]["peak_rss_gib"]
                                                               / row[name]["peak_rss_gib"], 3)
        rows.append(row)
    print(json.dumps({"cpu": cpu_facts(), "shape": dict(zip(shape[0::2], shape[1::2], strict=False)),
                      "steps_per_round": args.steps, "rounds": args.rounds, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
