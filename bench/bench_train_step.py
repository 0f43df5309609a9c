"""Train-step throughput: our JAX/Flax step vs PyTorch + transformers ``LlamaForCausalLM``, same CPU.

Both train the same Llama shape (RMSNorm, RoPE, SwiGLU, GQA, tied embeddings) on the same batch
and sequence length with AdamW and gradient clipping. Each side runs in its own process (so peak
host memory is its own) and measures its framework's fp32 matmul peak on this machine; MFU is
model FLOPs per second (hand-counted, ``model.flops``) over the higher of the two measured peaks.

    python bench/bench_train_step.py                      # the demo shape, fp32 and bf16
    python bench/bench_train_step.py --torch-python .venvs/hf/bin/python --steps 10

The PyTorch side needs torch 2.13 and transformers 5 (the ``hf`` extra), by default from
.venvs/hf or RU_TORCH_PYTHON. On a GPU, ``--no-torch`` runs the JAX side alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


def jax_worker(args: argparse.Namespace) -> dict[str, Any]:
    import jax
    import numpy as np

    from experiment.sections.model import ModelConfig
    from experiment.sections.train import TrainConfig
    from model.flops import train_flops_per_token
    from model.sharding import build_mesh
    from trainer.step import build_program, global_batch

    model_cfg = ModelConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                            n_kv_heads=args.n_kv_heads, d_ff=args.d_ff, max_seq_len=args.seq_len,
                            attention=args.attention, remat=args.remat)
    train_cfg = TrainConfig(steps=1000, batch_size=args.batch, warmup_steps=10, compute_dtype=args.dtype)
    program = build_program(model_cfg, train_cfg, args.vocab, build_mesh(train_cfg.mesh), seed=0)
    state = program.init_state()
    rows = np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.seq_len + 1)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding)
    start = time.perf_counter()
    state, metrics = program.train_step(state, batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - start
    for _ in range(args.warmup):
        state, metrics = program.train_step(state, batch)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(args.steps):
        state, metrics = program.train_step(state, batch)
    jax.block_until_ready(metrics)
    step_s = (time.perf_counter() - start) / args.steps
    return {"framework": f"jax {jax.__version__}", "dtype": args.dtype, "step_s": step_s,
            "tokens_per_s": args.batch * args.seq_len / step_s, "compile_s": compile_s,
            "loss": float(metrics["loss"]), "peak_rss_gib": peak_rss_gib(),
            "flops_per_token": train_flops_per_token(model_cfg, args.vocab, args.seq_len),
            "matmul_peak_flops": matmul_peak_jax() if jax.default_backend() == "cpu" else None,
            "backend": jax.default_backend()}


def torch_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.d_model, intermediate_size=args.d_ff,
                         num_hidden_layers=args.n_layers, num_attention_heads=args.n_heads,
                         num_key_value_heads=args.n_kv_heads, max_position_embeddings=args.seq_len,
                         rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> float:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    start = time.perf_counter()
    step()
    first_s = time.perf_counter() - start
    for _ in range(args.warmup):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    step_s = (time.perf_counter() - start) / args.steps
    return {"framework": f"torch {torch.__version__} + transformers {transformers.__version__}",
            "dtype": args.dtype, "step_s": step_s, "tokens_per_s": args.batch * args.seq_len / step_s,
            "compile_s": first_s, "loss": loss, "peak_rss_gib": peak_rss_gib(),
            "n_params": sum(p.numel() for p in model.parameters()), "matmul_peak_flops": matmul_peak_torch()}


def run_worker(python: str, kind: str, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([python, __file__, "--worker", kind, *argv], env=env, capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["jax", "torch"])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--n-kv-heads", type=int, default=2)
    parser.add_argument("--d-ff", type=int, default=704)
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="driver: the dtypes to compare")
    parser.add_argument("--attention", default="einsum")
    parser.add_argument("--remat", default="none")
    parser.add_argument("--torch-python", default=os.environ.get("RU_TORCH_PYTHON", ".venvs/hf/bin/python"))
    parser.add_argument("--no-torch", action="store_true", help="only the JAX side (e.g. on a GPU)")
    args = parser.parse_args()
    if args.worker:
        result = jax_worker(args) if args.worker == "jax" else torch_worker(args)
        print(json.dumps(result))
        return

    shape = ["--d-model", str(args.d_model), "--n-layers", str(args.n_layers), "--n-heads", str(args.n_heads),
             "--n-kv-heads", str(args.n_kv_heads), "--d-ff", str(args.d_ff), "--vocab", str(args.vocab),
             "--seq-len", str(args.seq_len), "--batch", str(args.batch), "--steps", str(args.steps),
             "--warmup", str(args.warmup), "--attention", args.attention, "--remat", args.remat]
    if args.no_torch:
        shape.append("--no-torch")
    rows = []
    for dtype in args.dtypes.split(","):
        ours = run_worker(sys.executable, "jax", [*shape, "--dtype", dtype])
        peer = None if args.no_torch else run_worker(args.torch_python, "torch", [*shape, "--dtype", dtype])
        peaks = [p for p in (ours["matmul_peak_flops"], peer and peer["matmul_peak_flops"]) if p]
        peak = max(peaks) if peaks else None
        row = {"dtype": dtype, "jax": ours, "torch": peer}
        for side in ("jax", "torch"):
            if row[side] is not None and peak:
                row[side]["mfu_vs_measured_matmul_peak"] = row[side]["tokens_per_s"] * ours["flops_per_token"] / peak
        if peer is not None:
            row["ratio_tokens_per_s_jax_over_torch"] = ours["tokens_per_s"] / peer["tokens_per_s"]
        rows.append(row)
    print(json.dumps({"shape": dict(zip(shape[0::2], shape[1::2], strict=False)), "results": rows}, indent=2))


if __name__ == "__main__":
    main()
