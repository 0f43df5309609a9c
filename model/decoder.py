"""A Llama-style decoder in Flax NNX, readable in one sitting.

    tokens -> embedding -> n_layers x [RMSNorm -> GQA attention with RoPE -> +residual,
                                       RMSNorm -> SwiGLU MLP -> +residual]
           -> RMSNorm -> tied (or separate) output projection -> logits

Every parameter carries logical axis names (``out_sharding`` metadata) that ``model.sharding``
maps onto the device mesh; key activations are pinned with ``constrain``. The model computes in
the dtype of the parameters it is given: the trainer casts fp32 master weights to bf16 before the
forward pass when ``train.compute_dtype`` is bfloat16. Norms, softmax and the logits stay fp32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiment.sections.model import ModelConfig
from model.attention import attend, resolve_attention
from model.sharding import compiled_platform, constrain

REMAT_POLICIES = {
    "full": None,  # save nothing, recompute the whole block in the backward pass
    # keep the projections' outputs (dots without batch dims), recompute attention and elementwise work
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # the same outputs, kept in host memory instead of HBM (TPU; the fit search reports where unsupported)
    "offload": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
}


@jax.custom_vjp
def linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., in] @ w [in, out]: every projection of the model, with a backward pass tuned for XLA:CPU."""
    return jnp.einsum("...i,io->...o", x, w)


def _linear_forward(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return linear(x, w), (x, w)


def _linear_backward(residuals: tuple[jax.Array, jax.Array], dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The same gradients as autodiff, with the weight gradient's dot taking the smaller activation first.

    Why: XLA:CPU copies the first operand of a dot that contracts over leading dims into a transposed
    layout, and autodiff puts the output gradient first, so the copy got fused into the elementwise
    work that made that gradient (the SwiGLU backward) and ran 5-7x slower than a plain transpose:
    removing that made the CPU train step 1.12x faster. On TPUs and GPUs the operand order changes nothing.
    """
    x, w = residuals
    dx = jnp.einsum("...o,io->...i", dy, w)
    x_first = w.shape[0] <= w.shape[1]  # the activation with fewer features is the one copied
    dw = jnp.einsum("...i,...o->io", x, dy) if x_first else jnp.einsum("...o,...i->oi", dy, x).T
    return dx, dw


linear.defvjp(_linear_forward, _linear_backward)


def project_heads(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [B, T, D] @ w [D, H, K] -> [B, T, H, K] (query, key or value heads), through ``linear``."""
    return linear(x, w.astype(x.dtype).reshape(w.shape[0], -1)).reshape(*x.shape[:-1], *w.shape[1:])


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], std: float) -> nnx.Param:
    """A truncated-normal fp32 parameter tagged with its logical axis names."""
    init = jax.nn.initializers.truncated_normal(stddev=std)
    return nnx.Param(init(rngs.params(), shape, jnp.float32), out_sharding=axes)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), out_sharding=("norm",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope_table(length: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """sin and cos [length, head_dim / 2] of the rotary angles of positions 0..length-1 (fp32)."""
    half = head_dim // 2
    freqs = np.float32(theta) ** (-np.arange(half, dtype=np.float32) / np.float32(half))
    angles = np.arange(length, dtype=np.float32)[:, None] * freqs
    return np.sin(angles), np.cos(angles)


def rope_angles(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
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

    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], segments: Segments) -> jax.Array:
        b, t, d = x.shape
        q, k, v = (project_heads(x, w[...]) for w in (self.wq, self.wk, self.wv))
        q = constrain(rotary(q, rope), ("batch", "length", "act_heads", "head_dim"))
        k = rotary(k, rope)
        impl = resolve_attention(self.impl, compiled_platform(), x.dtype, self.head_dim, t)
        out = constrain(attend(impl, q, k, v, segments), ("batch", "length", "act_heads", "head_dim"))
        return linear(out.reshape(b, t, -1), self.wo[...].astype(x.dtype).reshape(-1, d))


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, f = cfg.d_model, cfg.d_ff
        self.w_gate = param(rngs, (d, f), ("embed", "mlp"), cfg.init_std)
        self.w_up = param(rngs, (d, f), ("embed", "mlp"), cfg.init_std)
        self.w_down = param(rngs, (f, d), ("mlp", "embed"), cfg.init_std / (2 * cfg.n_layers) ** 0.5)

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        gate = linear(x, self.w_gate[...].astype(dtype))
        up = linear(x, self.w_up[...].astype(dtype))
        hidden = constrain(jax.nn.silu(gate) * up, ("batch", "length", "act_mlp"))
        return linear(hidden, self.w_down[...].astype(dtype))


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
        self.head_dim, self.rope_theta = cfg.resolved_head_dim, cfg.rope_theta
        self.embed = param(rngs, (vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std)
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.n_layers)])
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
        rope = rope_angles(positions, self.head_dim, self.rope_theta)
        x = constrain(jnp.take(self.embed[...], tokens, axis=0), ("batch", "length", "act_embed"))
        for block in self.blocks:
            x = self.run_block(block, x, rope, segment_ids)
        return self.final_norm(x)

    def output_weight(self) -> jax.Array:
        """The output projection [D, V]: the embedding table transposed when tied."""
        return self.embed[...].T if self.lm_head is None else self.lm_head[...]

    def run_block(self, block: Block, x: jax.Array, rope: tuple[jax.Array, jax.Array], segments: Segments) -> jax.Array:
        if self.remat == "none":
            return block(x, rope, segments)
        policy = REMAT_POLICIES[self.remat]
        return nnx.remat(lambda blk, h, r, s: blk(h, r, s), policy=policy)(block, x, rope, segments)


def output_logits(hidden: jax.Array, weight: jax.Array) -> jax.Array:
    """hidden [..., T, D] @ weight [D, V] -> fp32 logits, laid out with the vocabulary split as the rules say."""
    logits = linear(hidden, weight.astype(hidden.dtype))
    return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))


def cross_entropy(logits: jax.Array, targets: jax.Array, z_loss: float = 0.0,
                  weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Mean next-token cross-entropy and mean log(Z)^2 (the z-loss term, before its weight)."""
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = log_z - target_logit
    z_term = jnp.square(log_z)
    if weights is None:
        return nll.mean(), z_term.mean()
    total = jnp.maximum(weights.sum(), 1.0)
    return (nll * weights).sum() / total, (z_term * weights).sum() / total


def chunked_cross_entropy(hidden: jax.Array, weight: jax.Array, targets: jax.Array, chunk_len: int,
                          weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """``cross_entropy(output_logits(hidden, weight), targets)`` without all logits in memory at once.

    The sequence is cut into chunks of ``chunk_len`` positions (the last padded with zero-weight
    positions); a scan computes each chunk's logits, its summed NLL and log(Z)^2 and drops the logits,
    and the backward pass recomputes them chunk by chunk (``jax.checkpoint``). Peak memory for the
    logits falls from B x T x V to B x chunk_len x V floats, for one more forward matmul of the head.
    """
    b, t, d = hidden.shape
    if chunk_len <= 0 or chunk_len >= t:
        return cross_entropy(output_logits(hidden, weight), targets, weights=weights)
    n = -(-t // chunk_len)
    pad = n * chunk_len - t
    mask = jnp.ones((b, t), jnp.float32) if weights is None else weights.astype(jnp.float32)
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets, mask = jnp.pad(targets, ((0, 0), (0, pad))), jnp.pad(mask, ((0, 0), (0, pad)))

    def by_chunk(x: jax.Array) -> jax.Array:  # [B, n * c, ...] -> [n, B, c, ...]
        return x.reshape(b, n, chunk_len, *x.shape[2:]).swapaxes(0, 1)

    @jax.checkpoint
    def chunk_sums(h: jax.Array, tgt: jax.Array, m: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = output_logits(h, weight)
        log_z = jax.nn.logsumexp(logits, axis=-1)
        nll = log_z - jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
        return (nll * m).sum(), (jnp.square(log_z) * m).sum()

    def step(carry: tuple[jax.Array, jax.Array], chunk: tuple[jax.Array, ...]) -> tuple[tuple[jax.Array, jax.Array], None]:
        nll_sum, z_sum = chunk_sums(*chunk)
        return (carry[0] + nll_sum, carry[1] + z_sum), None

    zero = jnp.zeros((), jnp.float32)
    (nll_sum, z_sum), _ = jax.lax.scan(step, (zero, zero), (by_chunk(hidden), by_chunk(targets), by_chunk(mask)))
    total = jnp.maximum(mask.sum(), 1.0) if weights is not None else jnp.float32(b * t)
    return nll_sum / total, z_sum / total


def count_params(model_or_state: Any) -> int:
    state = nnx.state(model_or_state, nnx.Param) if isinstance(model_or_state, nnx.Module) else model_or_state
    return sum(int(x.size) for x in jax.tree.leaves(state))


def run_once_compile_options(platform: str) -> dict[str, Any]:
    """XLA options for a program that runs once (initialisation): on CPU, LLVM's optimisation of the
    unrolled threefry random-number code costs ~3x more compile time than the single run saves."""
    return {"xla_backend_optimization_level": 0} if platform == "cpu" else {}


def init_decoder(cfg: ModelConfig, vocab_size: int, seed: int = 0) -> Decoder:
    """A freshly initialised decoder on the default device (no mesh), e.g. for tests and benchmarks.

    Built under ``jax.jit``: eager initialisation compiles every random op on its own.
    """
    with nnx.use_eager_sharding(False):
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: Decoder(cfg, vocab_size, nnx.Rngs(0))))

        def make() -> nnx.State:
            return nnx.state(Decoder(cfg, vocab_size, nnx.Rngs(seed)))

        options = run_once_compile_options(jax.devices()[0].platform)
        return nnx.merge(graphdef, jax.jit(make).lower().compile(compiler_options=options)())
