"""Building blocks the decoder families share: parameters with logical axes, RMSNorm, RoPE, remat policies.

Every parameter carries logical axis names (``out_sharding`` metadata) that ``model.sharding`` maps
onto the device mesh. Norms and the rotary angles compute in fp32 whatever the compute dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiment.sections.rope import Rope, yarn_mscale  # noqa: F401 (re-exported: the families import them from here)
from model.linear import PROJECTIONS, project
from model.loss import output_logits
from model.sharding import constrain

if TYPE_CHECKING:
    from model.kv_cache import KVCache

# activation checkpointing per decoder block (``model.remat``); "none" runs without jax.checkpoint. Each policy saves
# named values (model/linear.py's ``PROJECTIONS``), not "dots": every projection runs inside ``linear``'s custom VJP,
# where a dot-matching policy (``dots_with_no_batch_dims_saveable``) finds no dot and saves nothing beyond ``full``
REMAT_POLICIES = {
    "full": None,  # save nothing but the block's input, recompute the whole block in the backward pass
    # keep the projections' outputs, recompute attention (its dots have batch dims) and the elementwise work
    "save_dots": jax.checkpoint_policies.save_only_these_names(*PROJECTIONS),
    # the same outputs, moved to host memory (TPU; the fit search reports where unsupported) instead of kept in HBM
    "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(PROJECTIONS), offload_src="device",
        offload_dst="pinned_host"),
}


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


def rope_table(length: int, head_dim: int, theta: float | Rope) -> tuple[np.ndarray, np.ndarray]:
    """sin and cos [length, head_dim / 2] of the rotary angles of positions 0..length-1 (fp32)."""
    rope = theta if isinstance(theta, Rope) else Rope(theta)
    angles = np.arange(length, dtype=np.float32)[:, None] * rope.frequencies(head_dim)
    scale = np.float32(rope.attention_factor())
    return np.sin(angles) * scale, np.cos(angles) * scale


def rope_angles(positions: jax.Array, head_dim: int, theta: float | Rope,
                length: int | None = None) -> tuple[jax.Array, jax.Array]:
    """sin and cos [B, T, 1, head_dim / 2] for row-local positions (< ``length``, default T), shared by all layers.

    Looked up in a table made at trace time, not computed in the graph: XLA:CPU recomputed sin and
    cos inside every fusion that read them (per head, forward and backward), ~5% of a train step.
    ``length``: the table's, when positions may reach past T (a cached decode step: T = 1, positions
    up to the cache length).
    """
    sin, cos = rope_table(positions.shape[1] if length is None else length, head_dim, theta)
    return jnp.take(sin, positions, axis=0)[:, :, None, :], jnp.take(cos, positions, axis=0)[:, :, None, :]


def rotary(x: jax.Array, rope: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Rotate pairs (first half, second half) of each head by position-dependent angles: [B, T, H, D]."""
    sin, cos = rope
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


class GatedMLP(nnx.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with ``silu`` (Llama, Qwen, Mistral), GeGLU with ``gelu_tanh``
    (Gemma; Transformers' ``gelu_pytorch_tanh``). The output projection, which writes into the residual
    stream, starts scaled down by sqrt(2 n_layers) (GPT-2)."""

    def __init__(self, d_model: int, d_ff: int, n_layers: int, init_std: float, activation: str, rngs: nnx.Rngs):
        self.activation = activation
        self.w_gate = param(rngs, (d_model, d_ff), ("embed", "mlp"), init_std)
        self.w_up = param(rngs, (d_model, d_ff), ("embed", "mlp"), init_std)
        self.w_down = param(rngs, (d_ff, d_model), ("mlp", "embed"), init_std / (2 * n_layers) ** 0.5)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = project(x, self.w_gate[...], name="gate_proj")
        up = project(x, self.w_up[...], name="up_proj")
        hidden = constrain(ACTIVATIONS[self.activation](gate) * up, ("batch", "length", "act_mlp"))
        return project(hidden, self.w_down[...], name="down_proj")


class CausalLM(nnx.Module):
    """What a family's decoder shares (model.family.FamilyModel): logits are ``hidden`` through ``output_weight``
    (model/loss.py); a subclass defines those two."""

    def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                 positions: jax.Array | None = None) -> jax.Array:
        """tokens [B, T] int32 -> logits [B, T, V] float32."""
        return output_logits(self.hidden(tokens, segment_ids, positions), self.output_weight())

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        raise NotImplementedError

    def output_weight(self) -> jax.Array:
        raise NotImplementedError

    def decode(self, tokens: jax.Array, cache: KVCache, last: bool = False) -> tuple[jax.Array, KVCache]:
        """tokens [B, T] written into ``cache`` at its index -> (logits [B, T, V] float32, or [B, 1, V] of the
        last position with ``last``; the cache with their keys and values, its index T further)."""
        hidden, cache = self.decode_hidden(tokens, cache)
        return output_logits(hidden[:, -1:] if last else hidden, self.output_weight()), cache

    def decode_hidden(self, tokens: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        raise NotImplementedError

    def cache_shape(self) -> tuple[int, int, int, int]:
        """(layers, KV heads, key width, value width): what a KV cache (model/kv_cache.py) holds per slot."""
        return self.n_layers, self.n_kv_heads, self.head_dim, self.head_dim

    def compute_dtype(self) -> jnp.dtype:
        """The dtype it computes in: its parameters' (the embedding table's)."""
        return self.embed[...].dtype


def default_positions(tokens: jax.Array, positions: jax.Array | None) -> jax.Array:
    """Row-local positions [B, T] int32: ``positions`` as given, or 0..T-1 on every row (no packing)."""
    if positions is not None:
        return positions
    b, t = tokens.shape
    return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
