"""Train-step throughput: our JAX/Flax step vs PyTorch + transformers ``LlamaForCausalLM`` (or
``Qwen3MoeForCausalLM``), eager and ``torch.compile``d, same CPU.

Both train the same shape on the same batch and sequence length with AdamW and gradient clipping: by default
Llama (RMSNorm, RoPE, SwiGLU, GQA, tied embeddings); with ``--family qwen3_moe`` Qwen3-MoE (q/k norms, a
softmax router choosing ``--top-k`` of ``--n-experts`` SwiGLU experts of width ``--d-expert``, untied
embeddings), its transformers config written by ``model/qwen3_moe/hf.py`` from ours, and the load-balancing
loss (``--router-aux-loss-coef``) in both losses. Each side runs in its own process (so peak host memory is its
own) and measures its framework's fp32 matmul peak on this machine; MFU is model FLOPs per second (hand-counted
by the family, ``model/<family>/flops.py``: active parameters for an MoE) over the higher of the measured peaks.

    python bench/bench_train_step.py                      # the demo shape, fp32 and bf16
    python bench/bench_train_step.py --torch-python .venvs/hf/bin/python --dtypes float32 --rounds 8
    python bench/bench_train_step.py --no-torch --layouts scanned,unrolled,scanned:1 --dtypes float32 --rounds 8
        # scanned layers (scan_unroll by platform) vs the Python loop vs the rolled scan (one layer per iteration)
    python bench/bench_train_step.py --family qwen3_moe --routings dropless,capacity --d-expert 352 --dtypes float32
        # our two MoE dispatches (ragged_dot, capacity buffers) vs transformers' experts implementations

Every side stays up as a worker process and runs ``--steps`` timed steps in turn, ``--rounds`` times
(order rotating, ``interleave.py``), so a slow spell of a shared machine hits all of them; each ratio
is the median of the per-round ratios. Our side applies recipe 4's CPU-host settings
(``trainer/cpu_host.py``) unless ``--no-cpu-host``. The ``torch.compile`` peer compiles the forward
pass and loss (inductor, default mode; backward through AOTAutograd, optimizer eager), as
torchtitan compiles its model; its compile time is in ``compile_s``. ``--no-torch-compile`` leaves
it out. With ``--family qwen3_moe`` the PyTorch peers are one per ``--torch-experts`` entry (transformers'
``experts_implementation``: ``torch`` runs the first, ``torch_experts_<name>`` the others; ``torch_compile``
compiles the first), and each records the expert kernels a profiled step ran (``experts_ops``): under
``torch.compile`` in fp32 transformers swaps its ``grouped_mm`` for a per-expert ``torch.mm`` loop.
The JSON records the CPU model and its vector/matrix flags (AMX decides PyTorch's bf16 speed) and every side's
peak RSS.

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
sys.path.insert(0, str(REPO))  # the driver reads our model config (model/) too


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
    box: dict[str, Any] = {"state": program.init_state(), "program": program}
    rows = np.random.default_rng(0).integers(0, vocab, (train_cfg.batch_size, seq_len + 1)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding)

    def run(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            box["state"], box["metrics"] = program.step(box["state"], batch)
        jax.block_until_ready(box["metrics"])
        return (time.perf_counter() - start) / steps

    return run, box


def model_config(args: argparse.Namespace) -> Any:
    """Our ``model:`` section of the benchmarked shape (the Qwen3-MoE one also gives the peer its config)."""
    common = dict(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, n_kv_heads=args.n_kv_heads,
                  max_seq_len=args.seq_len, attention=args.attention, remat=args.remat,
                  scan_layers=args.scan_layers == "true", scan_unroll=args.scan_unroll)
    if args.family == "llama":
        from model.llama.config import LlamaConfig

        return LlamaConfig(d_ff=args.d_ff, **common)
    from model.qwen3_moe.config import Qwen3MoeConfig

    return Qwen3MoeConfig(head_dim=0, n_experts=args.n_experts, top_k=args.top_k, d_expert=args.d_expert,
                          routing=args.routing, capacity_factor=args.capacity_factor,
                          router_aux_loss_coef=args.router_aux_loss_coef, **common)


def xla_flops_per_token(program: Any, batch: int, seq_len: int) -> float | None:
    """FLOPs per trained token of the step as XLA compiled it (its cost analysis, one device's share of the batch,
    times the devices): above the hand count where the compiled program does more work than the model asks for,
    e.g. ``ragged_dot`` expanded into a dense dot over every expert."""
    import jax

    cost = program.lower(program.abstract_batch(batch, seq_len)).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = (cost or {}).get("flops")
    return None if flops is None else flops * jax.device_count() / (batch * seq_len)


def jax_worker(args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any]:
    """(facts, run(k) -> seconds per step, finish() -> final facts) for our trainer's real step."""
    import jax

    from experiment.config import family_mesh_axes
    from experiment.sections.train import MeshConfig, TrainConfig
    from model.family import get_family
    from trainer.cpu_host import prepare_cpu_host

    model_cfg = model_config(args)
    family = get_family(args.family)
    mesh = MeshConfig(axes=family_mesh_axes({}, family.mesh_rules({}), family.name))  # Qwen3-MoE's expert axis, 1
    train_cfg = TrainConfig(steps=1000, batch_size=args.batch, warmup_steps=10, compute_dtype=args.dtype,
                            cpu_devices=args.cpu_devices, mesh=mesh)
    host = prepare_cpu_host(train_cfg) if args.cpu_host else {}  # as recipe 4 does, before JAX starts
    run, box = step_runner(model_cfg, train_cfg, args.vocab, args.seq_len)
    compile_s = run(1)
    facts = {"framework": f"jax {jax.__version__}", "dtype": args.dtype, "compile_s": compile_s,
             "scan_layers": model_cfg.scan_layers, "scan_unroll": model_cfg.scan_unroll,
             "devices": jax.device_count(), "cpu_host": host, "backend": jax.default_backend(),
             "model": family.describe(model_cfg), "n_params": family.param_count(model_cfg, args.vocab),
             "flops_per_token": family.flops(model_cfg, args.vocab, args.seq_len)}
    if args.family == "qwen3_moe":
        from model.qwen3_moe.flops import active_param_count

        facts |= {"routing": model_cfg.routing, "capacity_factor": model_cfg.capacity_factor,
                  "active_params": active_param_count(model_cfg, args.vocab)}

    def finish() -> dict[str, Any]:
        final = {"loss": float(box["metrics"]["loss"]), "total_loss": float(box["metrics"]["total_loss"]),
                 "peak_rss_gib": peak_rss_gib()}  # before the compile below
        return final | {"xla_flops_per_token": xla_flops_per_token(box["program"], args.batch, args.seq_len),
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


def hf_model(args: argparse.Namespace) -> Any:
    """The transformers peer: Llama of the flags' shape, or Qwen3-MoE of the config.json the driver wrote from ours
    (``--hf-config``), outputting its router logits so its loss has the load-balancing term."""
    import transformers

    if args.family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.d_model, intermediate_size=args.d_ff,
            num_hidden_layers=args.n_layers, num_attention_heads=args.n_heads, num_key_value_heads=args.n_kv_heads,
            max_position_embeddings=args.seq_len, rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=True,
            attn_implementation="sdpa"))
    config = {**json.loads(args.hf_config), "output_router_logits": True}
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **config, attn_implementation="sdpa", experts_implementation=args.experts_implementation))


def expert_ops(step: Any) -> dict[str, int]:
    """The grouped expert kernels one step of the MoE peer ran (profiler op names and call counts): transformers'
    ``grouped_mm`` calls ``aten::_grouped_mm``, its fallback the custom op ``transformers::grouped_mm_fallback``;
    empty for the ``eager`` implementation (a Python loop of ``nn.functional.linear`` per expert)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return {e.key: e.count for e in prof.key_averages() if "grouped_mm" in e.key}


def torch_worker(args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any]:
    import torch
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    model = hf_model(args)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    box: dict[str, Any] = {}

    def forward_loss(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the loss to train, its cross-entropy)."""
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            out = model(input_ids=inputs)
        nll = torch.nn.functional.cross_entropy(out.logits.float().reshape(-1, args.vocab), targets.reshape(-1))
        if args.family == "llama":
            return nll, nll
        return nll + model.router_aux_loss_coef * out.aux_loss, nll  # as Qwen3MoeForCausalLM adds it to a labels loss

    compiled = args.worker == "torch-compile"
    loss_of = torch.compile(forward_loss) if compiled else forward_loss

    def step() -> None:
        loss, nll = loss_of(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        box["total_loss"], box["loss"] = loss.detach(), nll.detach()

    def run(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - start) / steps

    facts = {"framework": f"torch {torch.__version__} + transformers {transformers.__version__}"
                          + (" (torch.compile, inductor)" if compiled else " (eager)"),
             "dtype": args.dtype, "compile_s": run(1), "n_params": sum(p.numel() for p in model.parameters())}
    if args.family == "qwen3_moe":
        facts["experts_implementation"] = model.config._experts_implementation

    def finish() -> dict[str, Any]:
        final = {"loss": float(box["loss"]), "total_loss": float(box["total_loss"]), "peak_rss_gib": peak_rss_gib(),
                 "matmul_peak_flops": matmul_peak_torch()}
        return final | ({"experts_ops": expert_ops(step)} if args.family == "qwen3_moe" else {})

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
    parser.add_argument("--family", choices=["llama", "qwen3_moe"], default="llama")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--n-kv-heads", type=int, default=2)
    parser.add_argument("--d-ff", type=int, default=704, help="llama: the SwiGLU width")
    parser.add_argument("--n-experts", type=int, default=8, help="qwen3_moe: experts per layer")
    parser.add_argument("--top-k", type=int, default=2, help="qwen3_moe: experts per token")
    parser.add_argument("--d-expert", type=int, default=352,
                        help="qwen3_moe: each expert's width (352 x top 2 = the Llama demo's d_ff 704 of active FLOPs)")
    parser.add_argument("--router-aux-loss-coef", type=float, default=0.001,
                        help="qwen3_moe: the load-balancing loss's weight, both sides")
    parser.add_argument("--capacity-factor", type=float, default=1.25, help="qwen3_moe: capacity routing's factor")
    parser.add_argument("--routing", choices=["dropless", "capacity"], default="dropless",
                        help="worker: qwen3_moe's model.routing")
    parser.add_argument("--routings", default="dropless",
                        help="driver, qwen3_moe: our sides' model.routing, comma-separated (dropless: ragged_dot; "
                             "capacity: per-expert buffers); each after the first is side 'jax_<routing>'")
    parser.add_argument("--experts-implementation", default="grouped_mm", help="worker: transformers' MoE experts")
    parser.add_argument("--torch-experts", default="grouped_mm,eager",
                        help="driver, qwen3_moe: transformers' experts_implementation of the eager peers, "
                             "comma-separated: the first is side 'torch' (and the compiled one's), the others "
                             "'torch_experts_<name>' (batched_mm, which gathers every token-slot's expert weights, "
                             "is two orders of magnitude slower on a CPU)")
    parser.add_argument("--hf-config", default="{}", help="worker: the Qwen3-MoE peer's config.json (the driver's)")
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

    shape = ["--family", args.family, "--d-model", str(args.d_model), "--n-layers", str(args.n_layers),
             "--n-heads", str(args.n_heads), "--n-kv-heads", str(args.n_kv_heads), "--vocab", str(args.vocab),
             "--seq-len", str(args.seq_len), "--batch", str(args.batch), "--warmup", str(args.warmup),
             "--attention", args.attention, "--remat", args.remat, "--cpu-devices", str(args.cpu_devices)]
    moe = args.family == "qwen3_moe"
    if moe:
        shape += ["--n-experts", str(args.n_experts), "--top-k", str(args.top_k), "--d-expert", str(args.d_expert),
                  "--router-aux-loss-coef", str(args.router_aux_loss_coef),
                  "--capacity-factor", str(args.capacity_factor)]
    else:
        shape += ["--d-ff", str(args.d_ff)]
    if not args.cpu_host:
        shape.append("--no-cpu-host")
    peer: list[str] = []  # the transformers peer's config, written by our Hugging Face export from our section
    if moe and not args.no_torch:
        from model.qwen3_moe.hf import to_hf_config

        peer = ["--hf-config", json.dumps(to_hf_config(model_config(args), args.vocab))]
    layouts, routings = args.layouts.split(","), (args.routings.split(",") if moe else [args.routing])
    experts = args.torch_experts.split(",") if moe else [args.experts_implementation]
    rows = []
    for dtype in args.dtypes.split(","):
        sides = {}
        for layout in layouts:  # the first layout (and routing) is the side the peers' ratios are taken against
            for routing in routings:
                suffix = [layout.replace(":", "_")] * (len(layouts) > 1) + [routing] * (len(routings) > 1)
                name = "jax" if (layout, routing) == (layouts[0], routings[0]) else "_".join(["jax", *suffix])
                kind, _, unroll = layout.partition(":")
                scan = {"scanned": "true", "unrolled": "false"}[kind]
                sides[name] = Worker(sys.executable, "jax", [*shape, "--dtype", dtype, "--scan-layers", scan,
                                                             "--scan-unroll", unroll or "0", "--routing", routing])
        if not args.no_torch:
            for i, impl in enumerate(experts):
                argv = [*shape, *peer, "--dtype", dtype, "--experts-implementation", impl]
                sides["torch" if i == 0 else f"torch_experts_{impl}"] = Worker(args.torch_python, "torch", argv)
                if args.torch_compile and i == 0:
                    sides["torch_compile"] = Worker(args.torch_python, "torch-compile", argv)
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
        ours = [name for name in sides if name.startswith("jax")]
        for our in ours:  # the first of ours against every other side, each other of ours against the peers
            for name in sides:
                if name != our and (our == "jax" or name not in ours):
                    # tokens/s ratio = the other's step time over ours, round by round
                    row[f"ratio_tokens_per_s_{our}_over_{name}"] = median_ratio(times[name], times[our])
                    row[f"ratio_peak_rss_{our}_over_{name}"] = round(row[our]["peak_rss_gib"]
                                                                     / row[name]["peak_rss_gib"], 3)
        rows.append(row)
    print(json.dumps({"cpu": cpu_facts(), "shape": dict(zip(shape[0::2], shape[1::2], strict=False)),
                      "steps_per_round": args.steps, "rounds": args.rounds, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
