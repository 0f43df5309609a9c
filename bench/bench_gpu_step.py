"""The 1B preset's train step on one NVIDIA GPU: our JAX step (bf16 compute, cuDNN flash attention)
against PyTorch + transformers ``LlamaForCausalLM`` at the same shape, batch and sequence length.

    python bench/bench_gpu_step.py --out gpu_step.json            # about 5 minutes on an H100/H200
    python bench/bench_gpu_step.py --attention cudnn dot_product   # also XLA's attention, for the difference
    python bench/bench_gpu_step.py --layouts scanned               # one layer layout only (default: both)

What it measures, each side in turn (``--rounds`` interleaved rounds of ``--steps`` timed steps after a
warm-up): seconds per step, tokens/s, MFU = hand-counted model FLOPs per token (``model/llama/flops.py``, 3x
forward, full T x T attention as in PaLM's formula) x tokens/s / the chip's dense bf16 peak
(``--peak-tflops``, the datasheet figure) and over the bf16 matmul rate measured on this GPU in the
same run, and the framework's peak device memory. Before timing, cuDNN attention is checked against
the einsum reference on the GPU (forward and gradients, packed documents and plain causal).

Both sides: fp32 master weights and AdamW moments, bf16 compute (ours: a cast of the weights in the
step; PyTorch: ``torch.autocast``), tied embeddings, gradient clipping at 1.0, one optimizer step
per batch. PyTorch uses SDPA attention (FlashAttention-2 kernels) and fused AdamW, eager; with
``--torch-compile`` also ``torch.compile``.

Decode (after the train step, or alone with ``--decode-only``; ``--no-decode`` skips it): greedy generation
of ``--decode-new-tokens`` (64) tokens from random prompts of ``--decode-prompt-len`` (16) ids at batch 1 and 8
(``--decode-batches``), on the preset's shape in bf16: our ``model.generate.generate`` (KV cache, one jitted
prefill and decode step) against Transformers' ``generate(..., cache_implementation="static")``, eager
(``disable_compile=True``) and with its own auto-compile (``torch.compile`` of the decode forward, mode
reduce-overhead: CUDA graphs), both on the same weights (ours, exported by the Llama HF adapter and loaded
into ``LlamaForCausalLM``). Decode tokens/s excludes the prefill and the first (compiling) call per batch size;
``--rounds`` interleaved rounds of one call per side (bench/bench_decode.py's ``OursDecoder`` /
``TheirsDecoder``). Greedy tokens are compared with ours and the result recorded (bf16: a difference is
possible and not a failure). NOT YET RUN on a GPU: only its CPU-side code paths were exercised (a tiny
preset on a CPU, ``--decode-only --preset demo-5m --vocab 4000``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench_train_step import step_runner  # noqa: E402 - bench/ is this script's folder
from interleave import interleaved_rounds  # noqa: E402


def emit(out: Path | None, record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)
    if out is not None:
        with out.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def matmul_tflops_jax(n: int = 8192, repeats: int = 10) -> float:
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        c = f(a, a)
    c.block_until_ready()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def check_cudnn_attention() -> dict[str, Any]:
    """cuDNN attention vs the einsum reference in bf16 on the GPU: max abs error of outputs and grads."""
    import jax
    import jax.numpy as jnp

    from model.attention import attend

    b, t, h, kv, d = 2, 2048, 32, 8, 64
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (b, t, h, d), jnp.bfloat16)
    k = jax.random.normal(keys[1], (b, t, kv, d), jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, t, kv, d), jnp.bfloat16)
    probe = jax.random.normal(keys[3], (b, t, h, d), jnp.float32)
    segments = jnp.concatenate([jnp.ones((b, 900), jnp.int32), 2 * jnp.ones((b, t - 900), jnp.int32)], axis=1)
    result: dict[str, Any] = {}
    for name, seg in (("packed", segments), ("causal", None)):
        def loss(impl: str, q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array | None = seg) -> jax.Array:
            return jnp.sum(attend(impl, q, k, v, seg).astype(jnp.float32) * probe)

        outs = {impl: jax.jit(lambda q, k, v, impl=impl, seg=seg: attend(impl, q, k, v, seg))(q, k, v)
                for impl in ("cudnn", "einsum")}
        grads = {impl: jax.jit(jax.grad(lambda q, k, v, impl=impl: loss(impl, q, k, v), argnums=(0, 1, 2)))(q, k, v)
                 for impl in ("cudnn", "einsum")}
        result[name] = {
            "out_max_abs_err": float(jnp.max(jnp.abs(outs["cudnn"].astype(jnp.float32)
                                                     - outs["einsum"].astype(jnp.float32)))),
            "grad_max_rel_err": max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32))) /
                                          (float(jnp.max(jnp.abs(r.astype(jnp.float32)))) or 1.0))
                                    for a, r in zip(grads["cudnn"], grads["einsum"], strict=True)),
        }
    return result


def jax_side(args: argparse.Namespace, attention: str, scanned: bool) -> tuple[dict[str, Any], Any, Any]:
    import jax
    import numpy as np

    from experiment.sections.train import TrainConfig
    from model.attention import resolve_attention
    from model.llama.config import PRESETS, LlamaConfig
    from model.llama.flops import train_flops_per_token

    shape = {k: v for k, v in PRESETS[args.preset].items() if k != "max_seq_len"}
    model_cfg = LlamaConfig(**shape, max_seq_len=args.seq_len, attention=attention, remat=args.remat,
                            scan_layers=scanned)
    train_cfg = TrainConfig(steps=1000, batch_size=args.batch, warmup_steps=10, compute_dtype="bfloat16",
                            loss_chunk_len=args.loss_chunk_len)
    run, box = step_runner(model_cfg, train_cfg, args.vocab, args.seq_len)

    started = time.perf_counter()
    in_use = (jax.devices()[0].memory_stats() or {}).get("bytes_in_use", 0)
    run(1)
    stats = jax.devices()[0].memory_stats() or {}
    kernel = resolve_attention(attention, jax.default_backend(), np.dtype("bfloat16"), model_cfg.resolved_head_dim,
                               args.seq_len)
    facts = {"device_memory_gib_after_first_step": stats.get("peak_bytes_in_use", 0) / 2**30,
             "device_memory_gib_held_before": in_use / 2**30,
             "side": f"ours ({'scanned' if scanned else 'unrolled'}, {attention} -> {kernel})",
             "framework": f"jax {jax.__version__}", "compile_and_first_step_s": time.perf_counter() - started,
             "flops_per_token": train_flops_per_token(model_cfg, args.vocab, args.seq_len)}

    def finish() -> dict[str, Any]:  # JAX's peak is process-wide: the first side's figure above is its own
        return {"loss": float(box["metrics"]["loss"])}

    return facts, run, finish


def torch_side(args: argparse.Namespace, compiled: bool) -> tuple[dict[str, Any], Any, Any]:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    from model.llama.config import PRESETS

    shape = PRESETS[args.preset]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=shape["d_model"], intermediate_size=shape["d_ff"],
                         num_hidden_layers=shape["n_layers"], num_attention_heads=shape["n_heads"],
                         num_key_value_heads=shape["n_kv_heads"], max_position_embeddings=args.seq_len,
                         rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    rows = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), device="cuda")
    inputs, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def step() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, args.vocab), targets.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    step_fn = torch.compile(step) if compiled else step
    box: dict[str, Any] = {}

    def run(steps: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            box["loss"] = step_fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / steps

    started = time.perf_counter()
    run(1)
    facts = {"side": "torch.compile" if compiled else "torch eager", "framework": f"torch {torch.__version__}, "
             f"transformers {transformers.__version__}", "compile_and_first_step_s": time.perf_counter() - started}

    def finish() -> dict[str, Any]:
        return {"loss": float(box["loss"]), "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}

    return facts, run, finish


def torch_decode_model(state_dict: dict[str, Any], config: dict[str, Any]) -> tuple[str, Any]:
    """(device, ``LlamaForCausalLM`` in bf16 on it) holding our exported weights (numpy fp32, Transformers' names)."""
    import torch
    import transformers

    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(config))
    missing, unexpected = theirs.load_state_dict({k: torch.tensor(v) for k, v in state_dict.items()}, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if config.get("tie_word_embeddings") else set()):
        raise SystemExit(f"exported weights do not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return device, theirs.to(device=device, dtype=torch.bfloat16).eval()


def decode_rows(args: argparse.Namespace) -> None:
    """Decode tokens/s of ours and Transformers' static-cache generate, bf16, one row per batch size (emitted)."""
    import jax
    import jax.numpy as jnp
    from bench_decode import OursDecoder, TheirsDecoder, make_prompts, summarize
    from flax import nnx

    from model.llama.config import PRESETS, LlamaConfig
    from model.registry import get_family

    shape = {k: v for k, v in PRESETS[args.preset].items() if k != "max_seq_len"}
    cfg = LlamaConfig(**shape, max_seq_len=args.seq_len)
    llama = get_family("llama")
    model = llama.init(cfg, args.vocab, seed=0)
    state_dict, config = llama.hf_adapter.export(model, cfg, args.vocab)  # fp32 numpy, Transformers' names
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, jax.tree.map(
        lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, state))
    decoders: dict[str, Any] = {"ours": OursDecoder(model, args.decode_new_tokens)}
    device = jax.default_backend()
    if not args.no_torch:
        device, theirs = torch_decode_model(state_dict, config)
        decoders["hf_static"] = TheirsDecoder(theirs, args.decode_new_tokens, compiled=False)
        if not args.no_torch_compile_decode:
            decoders["hf_static_compiled"] = TheirsDecoder(theirs, args.decode_new_tokens, compiled=True)
    del state_dict
    prompts = make_prompts(args.vocab, max(args.decode_batches), args.decode_prompt_len, seed=0)
    for batch in args.decode_batches:
        first_call_s = {name: round(decoder.run(prompts[:batch])["call_s"], 3) for name, decoder in decoders.items()}
        runs = interleaved_rounds({name: (lambda d=decoder, b=batch: d.run(prompts[:b]))
                                   for name, decoder in decoders.items()}, args.rounds)
        emit(args.out, {"decode": f"{args.preset} bf16, prompt {args.decode_prompt_len}, "
                                  f"{args.decode_new_tokens} new tokens, greedy", "device": device,
                        "first_call_s": first_call_s, **summarize(batch, runs)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--remat", default="none")
    parser.add_argument("--loss-chunk-len", type=int, default=1024)
    parser.add_argument("--attention", nargs="+", default=["auto"])
    parser.add_argument("--layouts", nargs="+", default=["scanned", "unrolled"], choices=["scanned", "unrolled"],
                        help="our sides' layer layouts (model.scan_layers), each measured against the others")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM datasheet)")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--torch-compile", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-decode", action="store_true", help="skip the decode measurement")
    parser.add_argument("--decode-only", action="store_true", help="only the decode measurement (no train step)")
    parser.add_argument("--decode-batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--decode-prompt-len", type=int, default=16)
    parser.add_argument("--decode-new-tokens", type=int, default=64)
    parser.add_argument("--no-torch-compile-decode", action="store_true",
                        help="decode: leave out Transformers' compiled static-cache peer")
    args = parser.parse_args()

    import jax

    device = jax.devices()[0]
    measured = None if args.decode_only else matmul_tflops_jax()
    emit(args.out, {"device": getattr(device, "device_kind", str(device)), "jax": jax.__version__,
                    "matmul_bf16_tflops_measured": measured, "date": time.strftime("%Y-%m-%d")})
    if args.decode_only:
        decode_rows(args)
        return
    if jax.default_backend() == "gpu":
        emit(args.out, {"cudnn_attention_vs_einsum_bf16": check_cudnn_attention()})

    sides: list[tuple[dict[str, Any], Any, Any]] = []
    for attention in args.attention:
        for layout in args.layouts:
            try:
                sides.append(jax_side(args, attention, layout == "scanned"))
                emit(args.out, sides[-1][0])
            except Exception as exc:  # noqa: BLE001 - e.g. XLA's attention running out of memory: report it, go on
                emit(args.out, {"side": f"ours ({layout}, {attention})",
                                "failed": f"{type(exc).__name__}: {exc}"[:300]})
    if not args.no_torch:
        for compiled in (False, True) if args.torch_compile else (False,):
            try:
                sides.append(torch_side(args, compiled))
                emit(args.out, sides[-1][0])
            except Exception as exc:  # noqa: BLE001 - report the peer's failure and keep our numbers
                emit(args.out, {"torch_side_failed": f"{type(exc).__name__}: {exc}"[:500]})
    flops = next(facts["flops_per_token"] for facts, _, _ in sides if "flops_per_token" in facts)
    tokens = args.batch * args.seq_len
    times: list[list[float]] = [[] for _ in sides]
    for round_index in range(args.rounds):
        order = range(len(sides)) if round_index % 2 == 0 else reversed(range(len(sides)))
        for i in order:
            sides[i][1](2)  # settle after the other side ran
            times[i].append(sides[i][1](args.steps))
    for (facts, _, finish), series in zip(sides, times, strict=True):
        seconds = statistics.median(series)
        emit(args.out, {**{k: v for k, v in facts.items() if k != "flops_per_token"}, "seconds_per_step": seconds,
                        "rounds": series, "tokens_per_s": tokens / seconds,
                        "mfu_vs_datasheet": flops * tokens / seconds / (args.peak_tflops * 1e12),
                        "mfu_vs_measured_matmul": flops * tokens / seconds / (measured * 1e12), **finish()})
    if not args.no_decode:
        del sides, times  # the train sides' states (the torch side's memory goes back to its cache)
        import gc

        gc.collect()
        if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
            sys.modules["torch"].cuda.empty_cache()
        decode_rows(args)


if __name__ == "__main__":
    main()
