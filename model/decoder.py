"""A Llama-style decoder in Flax NNX, readable in one sitting.

    tokens -> embedding -> n_layers x [RMSNorm -> GQA attention with RoPE -> +residual,
                                       RMSNorm -> SwiGLU MLP -> +residual]
           -> RMSNorm -> tied (or separate) output projection -> logits

Options of the families built on it (model/hf_families.py): biases on the query/key/value
projections (``qkv_bias``, Qwen2), an RMSNorm over each query and key head before RoPE (``qk_norm``,
Qwen3) and Llama 3's RoPE frequency scaling (``rope_scaling: llama3``).

Every parameter carries logical axis names (``out_sharding`` metadata) that ``model.sharding``
maps onto the device mesh; key activations are pinned with ``constrain``. The model computes in
the dtype of the parameters it is given: the trainer casts fp32 master weights to bf16 before the
forward pass when ``train.compute_dtype`` is bfloat16. Norms, softmax and the logits stay fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiment.sections.model import ModelConfig
from model.attention import attend, resolve_attention
from model.cpu_kernels import linear, projections_plain
from model.family import init_module
from model.loss import output_logits
from model.sharding import compiled_platform, constrain
from model.stacking import scan_layers, stacked

REMAT_POLICIES = {
    "full": None,  # save nothing, recompute the whole block in the backward pass
    # keep the projections' outputs (dots without batch dims), recompute attention and elementwise work
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # the same outputs, kept in host memory instead of HBM (TPU; the fit search reports where unsupported)
    "offload": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
}

# the submodules whose matmuls quantized training quantizes (model.family.ModelFamily.quantized_modules):
# attention's and the MLP's projections; attention's score and value einsums (activation x activation)
# and the output head (in the loss, outside ``hidden``) stay in the compute dtype
QUANTIZED_MODULES = r"blocks/(\d+/)?(attn|mlp)"  # unrolled blocks/<i>/attn, or the scanned stack's blocks/attn


def project(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
    """x [..., in dims] @ w [in dims, out dims] -> [..., out dims]: the last ``n_in`` dims of ``x``
    contract with the first ``n_in`` of ``w`` (every projection: q/k/v [D] @ [D, H, K], o [H, K] @
    [H, K, D], the MLP's [D] @ [D, F]).

    Normally through ``linear`` (the XLA:CPU-tuned backward) on 2-D views. For quantized training
    (``model.cpu_kernels.plain_projections``) one ``dot_general`` of the parameter array itself, cast
    only if its dtype differs: Qwix recognises a weight operand by identity with a module's
    ``nnx.Param`` value, and quantizes the backward of dots whose VJP it owns.
    """
    if projections_plain():
        w = w if w.dtype == x.dtype else w.astype(x.dtype)
        contract = (tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in)))
        return jax.lax.dot_general(x, w, (contract, ((), ())))
    in_size = math.prod(w.shape[:n_in])
    y = linear(x.reshape(*x.shape[:x.ndim - n_in], in_size), w.astype(x.dtype).reshape(in_size, -1))
    return y.reshape(*x.shape[:x.ndim - n_in], *w.shape[n_in:])


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], std: float) -> nnx.Param:
    """A truncated-normal fp32 parameter tagged with its logical axis names."""
    init = jax.nn.initializers.truncated_normal(stddev=std)
    return nnx.Param(init(rngs.params(), shape, jnp.float32), out_sharding=axes)


def zeros(shape: tuple[int, ...], axes: tuple[str, ...]) -> nnx.Param:
    return nnx.Param(jnp.zeros(shape, jnp.float32), out_sharding=axes)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, axis: str = "norm"):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), out_sharding=(axis,))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * self.scale[...].astype(jnp.float32)).astype(x.dtype)


@dataclass(frozen=True)
class Rope:
    """RoPE's frequencies: base ``theta``, optionally with Llama 3's scaling (``scaling="llama3"``)."""

    theta: float = 10_000.0
    scaling: str = "none"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192

    @classmethod
    def of(cls, cfg: ModelConfig) -> Rope:
        return cls(cfg.rope_theta, cfg.rope_scaling, cfg.rope_factor, cfg.rope_low_freq_factor,
                   cfg.rope_high_freq_factor, cfg.rope_original_max_len)

    def frequencies(self, head_dim: int) -> np.ndarray:
        """Inverse wavelengths [head_dim / 2] (fp32), as Transformers' ``ROPE_INIT_FUNCTIONS`` compute them."""
        half = head_dim // 2
        freqs = np.float32(self.theta) ** (-np.arange(half, dtype=np.float32) / np.float32(half))
        if self.scaling == "llama3":
            # long wavelengths (low frequencies) slowed down by ``factor``, short ones kept, a ramp between
            wavelen = 2 * math.pi / freqs
            scaled = np.where(wavelen > self.original_max_len / self.low_freq_factor, freqs / self.factor, freqs)
            smooth = (self.original_max_len / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = ~(wavelen < self.original_max_len / self.high_freq_factor) & ~(
                wavelen > self.original_max_len / self.low_freq_factor)
            freqs = np.where(medium, smoothed, scaled).astype(np.float32)
        return freqs


def rope_table(length: int, head_dim: int, theta: float | Rope) -> tuple[np.ndarray, np.ndarray]:
    """sin and cos [length, head_dim / 2] of the rotary angles of positions 0..length-1 (fp32)."""
    rope = theta if isinstance(theta, Rope) else Rope(theta)
    angles = np.arange(length, dtype=np.float32)[:, None] * rope.frequencies(head_dim)
    return np.sin(angles), np.cos(angles)


def rope_angles(positions: jax.Array, head_dim: int, theta: float | Rope) -> tuple[jax.Array, jax.Array]:
    """sin and cos [B, T, 1, head_dim / 2] for row-local positions (< T), shared by all layers.

    Looked up in a table made at trace time, not computed in the graph: XLA:CPU recomputed sin and
    cos inside every fusion that read them (per head, forward and backward), ~5% of a train step.
    """
    sin, cos = rope_table(positions.shape[1], head_dim, theta)
    return jnp.take(sin, positions, axis=0)[:, :, None, :], jnp.take(cos, positions, axis=0)[:, :, None, :]


def rotary(x: jax.Array, rope: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Rotate pairs (first half, second half) of each head by position-dependent angles: [B, T, H, D]."""
    sin, cos = rope
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


Segments = jax.Array | None  # packed documents' segment ids [B, T]; None: plain causal attention


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = h, kv, hd
        self.impl = cfg.attention
        self.wq = param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), cfg.init_std)
        self.wk = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), cfg.init_std)
        self.wv = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), cfg.init_std)
        # scaled init of the projections that write into the residual stream (GPT-2)
        self.wo = param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), cfg.init_std / (2 * cfg.n_layers) ** 0.5)
        # Qwen2: biases on q, k, v (not on the output projection)
        self.bq = zeros((h, hd), ("heads", "head_dim")) if cfg.qkv_bias else None
        self.bk = zeros((kv, hd), ("kv_heads", "head_dim")) if cfg.qkv_bias else None
        self.bv = zeros((kv, hd), ("kv_heads", "head_dim")) if cfg.qkv_bias else None
        # Qwen3: each query and key head RMS-normed (one scale per head dimension, shared by the heads)
        self.q_norm = RMSNorm(hd, cfg.norm_eps, "head_dim") if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps, "head_dim") if cfg.qk_norm else None

    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], segments: Segments) -> jax.Array:
        t = x.shape[1]
        q, k, v = (project(x, w[...]) for w in (self.wq, self.wk, self.wv))
        if self.bq is not None:
            q, k, v = (y + bias[...].astype(y.dtype) for y, bias in ((q, self.bq), (k, self.bk), (v, self.bv)))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = constrain(rotary(q, rope), ("batch", "length", "act_heads", "head_dim"))
        k = rotary(k, rope)
        impl = resolve_attention(self.impl, compiled_platform(), x.dtype, self.head_dim, t)
        out = constrain(attend(impl, q, k, v, segments), ("batch", "length", "act_heads", "head_dim"))
        return project(out, self.wo[...], n_in=2)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, f = cfg.d_model, cfg.d_ff
        self.w_gate = param(rngs, (d, f), ("embed", "mlp"), cfg.init_std)
        self.w_up = param(rngs, (d, f), ("embed", "mlp"), cfg.init_std)
        self.w_down = param(rngs, (f, d), ("mlp", "embed"), cfg.init_std / (2 * cfg.n_layers) ** 0.5)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = project(x, self.w_gate[...])
        up = project(x, self.w_up[...])
        hidden = constrain(jax.nn.silu(gate) * up, ("batch", "length", "act_mlp"))
        return project(hidden, self.w_down[...])


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], segments: Segments) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), rope, segments)
        x = x + self.mlp(self.mlp_norm(x))
        return constrain(x, ("batch", "length", "act_embed"))


class Decoder(nnx.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, rngs: nnx.Rngs):
        self.vocab_size, self.remat = vocab_size, cfg.remat
        self.scanned, self.scan_unroll, self.n_layers = cfg.scan_layers, cfg.scan_unroll, cfg.n_layers
        self.head_dim, self.rope = cfg.resolved_head_dim, Rope.of(cfg)
        self.embed = param(rngs, (vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std)
        # scanned (model/stacking.py): one Block whose parameters carry a leading layer axis; else a list
        self.blocks = (stacked(lambda layer_rngs: Block(cfg, layer_rngs), cfg.n_layers, rngs) if cfg.scan_layers
                       else nnx.List([Block(cfg, rngs) for _ in range(cfg.n_layers)]))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else param(rngs, (cfg.d_model, vocab_size), ("embed", "vocab"), cfg.init_std)

    def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                 positions: jax.Array | None = None) -> jax.Array:
        """tokens [B, T] int32 -> logits [B, T, V] float32."""
        return output_logits(self.hidden(tokens, segment_ids, positions), self.output_weight())

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        """tokens [B, T] int32 -> the final-normed hidden states [B, T, D] the output projection reads."""
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        rope = rope_angles(positions, self.head_dim, self.rope)
        x = constrain(jnp.take(self.embed[...], tokens, axis=0), ("batch", "length", "act_embed"))
        if self.scanned:
            x = scan_layers(self.blocks, x, lambda block, h: block(h, rope, segment_ids),
                            REMAT_POLICIES.get(self.remat), remat=self.remat != "none", unroll=self.unroll())
        else:
            for block in self.blocks:
                x = self.run_block(block, x, rope, segment_ids)
        return self.final_norm(x)

    def unroll(self) -> int:
        """Layers per scan iteration: ``model.scan_unroll``, or by the platform compiled for (its comment)."""
        return self.scan_unroll or (self.n_layers if compiled_platform() == "cpu" else 1)

    def output_weight(self) -> jax.Array:
        """The output projection [D, V]: the embedding table transposed when tied."""
        return self.embed[...].T if self.lm_head is None else self.lm_head[...]

    def run_block(self, block: Block, x: jax.Array, rope: tuple[jax.Array, jax.Array], segments: Segments) -> jax.Array:
        if self.remat == "none":
            return block(x, rope, segments)
        policy = REMAT_POLICIES[self.remat]
        return nnx.remat(lambda blk, h, r, s: blk(h, r, s), policy=policy)(block, x, rope, segments)


def init_decoder(cfg: ModelConfig, vocab_size: int, seed: int = 0) -> Decoder:
    """A freshly initialised decoder on the default device (no mesh), e.g. for tests and benchmarks."""
    return init_module(Decoder, cfg, vocab_size, seed)  # type: ignore[return-value]
