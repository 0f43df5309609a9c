"""Memory-efficient attention and loss: each kernel against a float64 NumPy definition, the kernel
chosen per platform, and the chunked loss against the full-logits loss (values and gradients).

Splash attention runs here in Pallas' interpret mode (the TPU kernel's own code, executed on the
CPU); its TPU compilation is checked by the fit-check tests in the tpu venv.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiment.errors import ConfigError
from model.attention import attend, resolve_attention
from model.llama.config import LlamaConfig
from model.llama.family import LLAMA
from model.llama.model import Decoder
from model.loss import chunked_cross_entropy, cross_entropy, output_logits
from tests.recipe_runner import with_fast_cpu_compile

REPO = Path(__file__).resolve().parents[1]
B, T, H, KV, D = 2, 128, 4, 2, 16  # splash needs a sequence divisible by 128


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """The definition in float64: softmax(q k^T / sqrt(d)) v, causal, within one document, GQA by repetition."""
    h, kv, hd = q.shape[2], k.shape[2], q.shape[3]
    k, v = np.repeat(k, h // kv, axis=2), np.repeat(v, h // kv, axis=2)
    scores = np.einsum("bqhd,bshd->bhqs", q, k) * hd**-0.5
    allowed = np.tril(np.ones((q.shape[1],) * 2, bool))[None, None]
    allowed = allowed & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    scores = np.where(allowed, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhqs,bshd->bqhd", probs / probs.sum(-1, keepdims=True), v)


def qkv(seed: int = 0) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    segments = jnp.array([[1] * 50 + [2] * 40 + [3] * 38, [1] * T])  # packed documents, and one plain row
    return (jax.random.normal(kq, (B, T, H, D)), jax.random.normal(kk, (B, T, KV, D)),
            jax.random.normal(kv, (B, T, KV, D)), segments)


@pytest.mark.parametrize("impl", ["splash", "dot_product", "einsum"])
def test_attention_equals_the_definition(impl: str) -> None:
    q, k, v, segments = qkv()
    expected = reference_attention(*(np.asarray(x, np.float64) for x in (q, k, v)), np.asarray(segments))
    np.testing.assert_allclose(jax.jit(attend, static_argnums=0)(impl, q, k, v, segments), expected, atol=2e-5)
    causal_only = reference_attention(*(np.asarray(x, np.float64) for x in (q, k, v)), np.zeros((B, T), int))
    np.testing.assert_allclose(jax.jit(attend, static_argnums=0)(impl, q, k, v, None), causal_only, atol=2e-5)


def test_splash_gradients_equal_the_reference_path() -> None:
    q, k, v, segments = qkv(1)
    probe = jax.random.normal(jax.random.key(9), (B, T, H, D))

    def grads(impl: str) -> tuple[jax.Array, ...]:
        return jax.jit(jax.grad(lambda a, b, c: jnp.sum(attend(impl, a, b, c, segments) * probe),
                                argnums=(0, 1, 2)))(q, k, v)

    for ours, ref in zip(grads("splash"), grads("einsum"), strict=True):
        np.testing.assert_allclose(ours, ref, atol=5e-5)


def test_auto_picks_the_kernel_of_the_platform_compiled_for() -> None:
    bf16, f32 = jnp.bfloat16, jnp.float32
    assert resolve_attention("auto", "tpu", bf16, 64, 2048) == "splash"
    assert resolve_attention("auto", "tpu", bf16, 64, 200) == "dot_product"  # not a multiple of the block
    assert resolve_attention("auto", "gpu", bf16, 128, 2048) == "cudnn"
    assert resolve_attention("auto", "cuda", f32, 128, 2048) == "dot_product"  # cuDNN flash wants 16-bit
    assert resolve_attention("auto", "gpu", bf16, 256, 2048) == "dot_product"
    assert resolve_attention("auto", "cpu", bf16, 64, 2048) == "dot_product"
    assert resolve_attention("einsum", "tpu", bf16, 64, 2048) == "einsum"  # an explicit choice is kept
    with pytest.raises(ConfigError, match="model.attention': cudnn needs an NVIDIA GPU"):
        resolve_attention("cudnn", "cpu", bf16, 64, 2048)
    with pytest.raises(ConfigError, match="splash needs a sequence length divisible by 128"):
        resolve_attention("splash", "tpu", bf16, 64, 100)


def test_decoder_with_splash_matches_einsum_on_packed_documents() -> None:
    cfg = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=T)
    tokens = jax.random.randint(jax.random.key(2), (1, T), 0, 97)
    segments = jnp.array([[1] * 60 + [2] * 68])
    positions = jnp.array([list(range(60)) + list(range(68))])
    logits = {}
    for impl in ("splash", "einsum"):
        model = LLAMA.init(dataclasses.replace(cfg, attention=impl), 97, seed=0)
        logits[impl] = nnx.jit(lambda m, t, s, p: m(t, s, p))(model, tokens, segments, positions)
    np.testing.assert_allclose(logits["splash"], logits["einsum"], atol=2e-5)


@pytest.mark.parametrize(("length", "chunk"), [(12, 4), (13, 4), (12, 0), (12, 12)])
@pytest.mark.parametrize("weighted", [False, True])
def test_chunked_loss_equals_full_logits_loss(length: int, chunk: int, weighted: bool) -> None:
    kh, kw, kt, km = jax.random.split(jax.random.key(3), 4)
    hidden = jax.random.normal(kh, (3, length, 8))
    weight = jax.random.normal(kw, (8, 50)) * 2  # large logits make log(Z) matter
    targets = jax.random.randint(kt, (3, length), 0, 50)
    weights = (jax.random.uniform(km, (3, length)) > 0.3).astype(jnp.float32) if weighted else None

    def losses(fn: object) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
        def total(h: jax.Array, w: jax.Array) -> jax.Array:
            nll, z = fn(h, w)
            return nll + 1e-2 * z

        # jitted: one compile of each path, not an eager dispatch (and a compile) per op and shape
        return jax.jit(lambda h, w: (fn(h, w), jax.grad(total, argnums=(0, 1))(h, w)))(hidden, weight)

    full = losses(lambda h, w: cross_entropy(output_logits(h, w), targets, weights=weights))
    chunked = losses(lambda h, w: chunked_cross_entropy(h, w, targets, chunk, weights=weights))
    for ours, ref in zip(jax.tree.leaves(chunked), jax.tree.leaves(full), strict=True):
        np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=2e-6)


def test_chunked_loss_keeps_one_chunk_of_logits() -> None:
    """The compiled loss + gradient needs far less temporary memory than B x T x V logits."""
    hidden = jax.ShapeDtypeStruct((4, 1024, 64), jnp.float32)
    weight = jax.ShapeDtypeStruct((64, 8192), jnp.float32)
    targets = jax.ShapeDtypeStruct((4, 1024), jnp.int32)

    def temp_bytes(chunk: int) -> int:
        fn = jax.grad(lambda h, w, t: chunked_cross_entropy(h, w, t, chunk)[0], argnums=(0, 1))
        return jax.jit(fn).lower(hidden, weight, targets).compile().memory_analysis().temp_size_in_bytes

    logits_bytes, chunk_bytes = 4 * 1024 * 8192 * 4, 4 * 128 * 8192 * 4
    assert temp_bytes(0) >= logits_bytes  # the full path holds all logits (and their gradient)
    assert temp_bytes(128) < 2.5 * chunk_bytes  # one chunk's logits and their gradient


SHARDED = textwrap.dedent('''
    import json, dataclasses
    import jax, jax.numpy as jnp, numpy as np
    from model.llama.config import LlamaConfig
    from experiment.sections.train import MeshConfig, TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch

    model = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=128)
    train = TrainConfig(steps=10, batch_size=8, warmup_steps=1, loss_chunk_len=48,
                        mesh=MeshConfig(data=2, fsdp=2, tensor=2))
    mesh = build_mesh(train.mesh)
    tokens = np.random.default_rng(0).integers(0, 64, (8, 129), dtype=np.int32)
    segments = np.repeat(np.array([[1] * 70 + [2] * 58], np.int32), 8, axis=0)
    positions = np.repeat(np.array([list(range(70)) + list(range(58))], np.int32), 8, axis=0)
    out = {}
    for impl in ("splash", "einsum"):
        prog = TrainProgram(dataclasses.replace(model, attention=impl), train, 64, mesh, seed=0)
        state = prog.init_state()
        batch = global_batch({"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": segments,
                              "positions": positions}, prog.batch_sharding)
        losses = []
        for _ in range(3):  # the first update has learning rate 0 (warmup)
            state, metrics = prog.step(state, batch)
            losses.append(float(metrics["loss"]))
        out[impl] = {"losses": losses, "grad_norm": float(metrics["grad_norm"])}
    print("RESULT " + json.dumps(out))
''')


@pytest.mark.integration
def test_splash_train_step_on_an_8_device_mesh_equals_the_reference() -> None:
    """Splash inside shard_map (batch over data x fsdp, heads over tensor) with the chunked loss."""
    env = {**os.environ, "XLA_FLAGS": with_fast_cpu_compile("--xla_force_host_platform_device_count=8"),
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SHARDED], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    np.testing.assert_allclose(out["splash"]["losses"], out["einsum"]["losses"], rtol=1e-5)
    assert out["splash"]["grad_norm"] == pytest.approx(out["einsum"]["grad_norm"], rel=1e-4)
    assert out["splash"]["losses"][2] < out["splash"]["losses"][0]


def reference_decoder(params: dict[str, np.ndarray], tokens: np.ndarray, n_layers: int, eps: float,
                      theta: float = 10_000.0) -> np.ndarray:
    """The Llama decoder written out in float64 NumPy from its parameters: embedding, per layer RMSNorm ->
    GQA causal attention with half-split RoPE -> residual, RMSNorm -> SwiGLU -> residual; the final RMSNorm.
    Returns the final-normed hidden states [B, T, D] (what the output projection reads)."""
    def rms(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale

    def rope(x: np.ndarray) -> np.ndarray:
        half = x.shape[-1] // 2
        angles = np.arange(x.shape[1])[:, None] * theta ** (-np.arange(half) / half)  # [T, half]
        sin, cos = np.sin(angles)[None, :, None], np.cos(angles)[None, :, None]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    x = params["embed"][tokens]
    for i in range(n_layers):
        p = {k.removeprefix(f"{i}."): v for k, v in params.items() if k.startswith(f"{i}.")}
        h = rms(x, p["attn_norm"])
        q, k, v = (np.einsum("btd,dhk->bthk", h, p[w]) for w in ("wq", "wk", "wv"))
        out = reference_attention(rope(q), rope(k), v, np.zeros(tokens.shape, int))
        x = x + np.einsum("bthk,hkd->btd", out, p["wo"])
        h = rms(x, p["mlp_norm"])
        gate, up = h @ p["w_gate"], h @ p["w_up"]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p["w_down"]
    return rms(x, params["final_norm"])


def decoder_params(model: Decoder, n_layers: int) -> dict[str, np.ndarray]:
    """The decoder's parameters as float64 arrays by layer (``<i>.<name>``), from either layout."""
    out = {"embed": model.embed[...], "final_norm": model.final_norm.scale[...]}
    for i in range(n_layers):
        # scanned: one Block whose parameters carry a leading layer axis; unrolled: a list of Blocks
        block = model.blocks if model.scanned else model.blocks[i]
        out.update({f"{i}.{name}": value[...][i] if model.scanned else value[...] for name, value in (
            ("attn_norm", block.attn_norm.scale), ("mlp_norm", block.mlp_norm.scale), ("wq", block.attn.wq),
            ("wk", block.attn.wk), ("wv", block.attn.wv), ("wo", block.attn.wo), ("w_gate", block.mlp.w_gate),
            ("w_up", block.mlp.w_up), ("w_down", block.mlp.w_down))})
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


@pytest.mark.parametrize(("tie", "scan"), [(True, True), (False, False)])
def test_decoder_hidden_and_output_weight_give_the_logits(tie: bool, scan: bool) -> None:
    """What the chunked loss reads (``hidden()`` and ``output_weight()``, never the full logits) against the
    decoder written out in NumPy: the final-normed hidden states, the output projection (the embedding
    transposed when tied, the separate head otherwise) and logits = hidden @ weight. The norm scales are
    randomised so that a missing or misplaced norm shows."""
    cfg = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16, tie_embeddings=tie,
                      scan_layers=scan)
    model = LLAMA.init(cfg, 97)
    assert isinstance(model, Decoder)
    keys = iter(jax.random.split(jax.random.key(1), 8))
    for norm in (model.final_norm, model.blocks.attn_norm, model.blocks.mlp_norm) if scan else (
            model.final_norm, *(n for b in model.blocks for n in (b.attn_norm, b.mlp_norm))):
        norm.scale[...] = jax.random.uniform(next(keys), norm.scale[...].shape, minval=0.5, maxval=1.5)
    tokens = (jnp.arange(32).reshape(2, 16) * 7) % 97
    params = decoder_params(model, cfg.n_layers)
    want_hidden = reference_decoder(params, np.asarray(tokens), cfg.n_layers, cfg.norm_eps)
    want_weight = params["embed"].T if tie else np.asarray(model.lm_head[...], np.float64)

    hidden = nnx.jit(lambda m, t: m.hidden(t))(model, tokens)
    np.testing.assert_allclose(hidden, want_hidden, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(model.output_weight(), want_weight.astype(np.float32))
    np.testing.assert_allclose(nnx.jit(lambda m, t: m(t))(model, tokens), want_hidden @ want_weight,
                               rtol=1e-4, atol=1e-5)


def test_a_checkpoint_trained_with_a_platform_kernel_loads_on_this_cpu() -> None:
    from trainer.trained_model import model_config_from_meta

    for kernel, loaded in (("cudnn", "auto"), ("splash", "auto"), ("einsum", "einsum")):
        meta = {"model": {**dataclasses.asdict(LlamaConfig()), "attention": kernel}}
        assert model_config_from_meta(meta).attention == loaded
