"""Gemma 3's text decoder in Flax NNX.

    tokens -> embedding * sqrt(d_model) -> n_layers x [
                  x + post_attn_norm(attention(input_norm(x)))      local (sliding window) or global,
                  x + post_mlp_norm(GeGLU(pre_mlp_norm(x)))  ]       as the layer pattern says
           -> final norm -> the embedding table transposed (tied) -> logits

As the Gemma 3 technical report (Gemma Team, 2025) and Transformers' ``models/gemma3/modeling_gemma3.py``
define it: every RMSNorm scales by ``1 + w`` (``w`` starts at 0) and computes in fp32; queries and keys are
RMS-normed per head before RoPE; a local layer attends to the ``sliding_window`` positions ending at the
query, with RoPE base ``rope_theta_local``; a global layer attends causally over the whole sequence with
``rope_theta_global`` (optionally linearly scaled); the scores are scaled by ``query_pre_attn_scalar ** -0.5``.

Every layer has the same parameter shapes: local and global differ only in their (static) window and RoPE
table. So with ``scan_layers`` the layers are stored as one stack (model/stacking.py's generic ``[L, ...]``
layout, the one checkpoints, restacking and HF import already handle) and run by model/stacking.py's
``scan_groups``: a ``lax.scan`` over the repeating group of ``len(pattern)`` layers (6 for 5 local : 1 global),
the ``g`` layers of a group unrolled in the scan body with their own window and RoPE, and the ``L % g`` tail
layers after the scan (Gemma 3 1B: 26 = 4 x 6 + 2); ``scan_groups_xs`` does the same with each layer's KV-cache
slice for text generation. ``scan_layers: false`` is a loop over per-layer modules.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from model.attention import attend, resolve_attention
from model.gemma3.config import GLOBAL, LOCAL, Gemma3Config
from model.kv_cache import KVCache, LayerKV, attend_cached
from model.layers import REMAT_POLICIES, CausalLM, GatedMLP, Rope, default_positions, param, rope_angles, rotary
from model.linear import project
from model.sharding import compiled_platform, constrain
from model.stacking import layer_stack, scan_groups, scan_groups_xs

# the submodules whose matmuls quantized training quantizes (model.family.ModelFamily.quantized_modules):
# attention's and the MLP's projections; the score and value einsums and the (tied) head stay in the compute dtype
QUANTIZED_MODULES = r"blocks/(\d+/)?(attn|mlp)"  # unrolled blocks/<i>/attn, or the scanned stack's blocks/attn

Segments = jax.Array | None  # packed documents' segment ids [B, T]; None: plain causal attention
RopeTable = tuple[jax.Array, jax.Array]  # sin, cos [B, T, 1, head_dim / 2]


def ropes_of(cfg: Gemma3Config) -> dict[str, Rope]:
    """Each layer type's RoPE: local layers the plain ``rope_theta_local`` one, global ones ``rope_theta_global``,
    scaled as the config says."""
    return {LOCAL: Rope(cfg.rope_theta_local),
            GLOBAL: Rope(cfg.rope_theta_global, cfg.rope_scaling, factor=cfg.rope_factor)}


class GemmaRMSNorm(nnx.Module):
    """RMSNorm scaling by ``1 + scale`` (Gemma's convention: ``scale`` starts at 0), in fp32 throughout and cast
    back after the scaling (Transformers' ``Gemma3RMSNorm``: ``(x * (1 + w)).to(dtype)``, not Llama's order)."""

    def __init__(self, dim: int, eps: float, axis: str = "norm"):
        self.scale = nnx.Param(jnp.zeros((dim,), jnp.float32), out_sharding=(axis,))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: Gemma3Config, rngs: nnx.Rngs):
        d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
        self.head_dim, self.impl, self.scale = hd, cfg.attention, cfg.attn_scale
        self.wq = param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), cfg.init_std)
        self.wk = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), cfg.init_std)
        self.wv = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), cfg.init_std)
        # scaled init of the projections that write into the residual stream (GPT-2), as Llama's
        self.wo = param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), cfg.init_std / (2 * cfg.n_layers) ** 0.5)
        # each query and key head RMS-normed before RoPE (one scale per head dimension, shared by the heads)
        self.q_norm = GemmaRMSNorm(hd, cfg.norm_eps, "head_dim")
        self.k_norm = GemmaRMSNorm(hd, cfg.norm_eps, "head_dim")

    def __call__(self, x: jax.Array, rope: RopeTable, segments: Segments, window: int) -> jax.Array:
        q, k, v = self.qkv(x, rope)
        impl = resolve_attention(self.impl, compiled_platform(), x.dtype, self.head_dim, x.shape[1])
        out = attend(impl, q, k, v, segments, window=window, scale=self.scale)
        out = constrain(out, ("batch", "length", "act_heads", "head_dim"))
        return project(out, self.wo[...], n_in=2, name="o_proj")

    def qkv(self, x: jax.Array, rope: RopeTable) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The normed, RoPE'd queries and keys and the values of ``x``: [B, T, H or KV, D]."""
        q, k, v = (project(x, w[...], name=name) for w, name in ((self.wq, "q_proj"), (self.wk, "k_proj"),
                                                                     (self.wv, "v_proj")))
        q = constrain(rotary(self.q_norm(q), rope), ("batch", "length", "act_heads", "head_dim"))
        return q, rotary(self.k_norm(k), rope), v

    def decode(self, x: jax.Array, rope: RopeTable, window: int, layer: LayerKV,
               cache: KVCache) -> tuple[jax.Array, LayerKV]:
        """``__call__`` over this layer's cached keys and values (model/kv_cache.py): (output, updated k and v)."""
        q, k, v = self.qkv(x, rope)
        out, layer = attend_cached(q, k, v, layer, cache, window=window, scale=self.scale)
        return project(out, self.wo[...], n_in=2, name="o_proj"), layer


class Block(nnx.Module):
    """One layer; whether it is local or global is the caller's (static) ``window``, so all layers share one
    module structure and stack."""

    def __init__(self, cfg: Gemma3Config, rngs: nnx.Rngs):
        d, eps = cfg.d_model, cfg.norm_eps
        self.attn_norm = GemmaRMSNorm(d, eps)  # input_layernorm
        self.attn = Attention(cfg, rngs)
        self.post_attn_norm = GemmaRMSNorm(d, eps)  # post_attention_layernorm
        self.mlp_norm = GemmaRMSNorm(d, eps)  # pre_feedforward_layernorm
        self.mlp = GatedMLP(cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.init_std, "gelu_tanh", rngs)
        self.post_mlp_norm = GemmaRMSNorm(d, eps)  # post_feedforward_layernorm

    def __call__(self, x: jax.Array, rope: RopeTable, segments: Segments, window: int) -> jax.Array:
        x = x + self.post_attn_norm(self.attn(self.attn_norm(x), rope, segments, window))
        x = x + self.post_mlp_norm(self.mlp(self.mlp_norm(x)))
        return constrain(x, ("batch", "length", "act_embed"))

    def decode(self, x: jax.Array, rope: RopeTable, window: int, layer: LayerKV,
               cache: KVCache) -> tuple[jax.Array, LayerKV]:
        attn, layer = self.attn.decode(self.attn_norm(x), rope, window, layer, cache)
        x = x + self.post_attn_norm(attn)
        return x + self.post_mlp_norm(self.mlp(self.mlp_norm(x))), layer


class Decoder(CausalLM):
    def __init__(self, cfg: Gemma3Config, vocab_size: int, rngs: nnx.Rngs):
        self.vocab_size, self.remat, self.d_model = vocab_size, cfg.remat, cfg.d_model
        self.scanned, self.scan_unroll, self.n_layers = cfg.scan_layers, cfg.scan_unroll, cfg.n_layers
        # a tuple, not a dict: static attributes are part of the graphdef, which jit hashes
        self.head_dim, self.ropes = cfg.resolved_head_dim, tuple(sorted(ropes_of(cfg).items()))
        self.pattern, self.sliding_window, self.n_kv_heads = cfg.pattern, cfg.sliding_window, cfg.n_kv_heads
        self.embed = param(rngs, (vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std)
        # scanned (model/stacking.py): one Block whose parameters carry a leading layer axis; else a list.
        # ``stacked`` gives layer i the values the list's i-th Block gets: init is the same in either layout
        self.blocks = layer_stack(lambda layer_rngs: Block(cfg, layer_rngs), cfg.n_layers, rngs, cfg.scan_layers)
        self.final_norm = GemmaRMSNorm(cfg.d_model, cfg.norm_eps)

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        """tokens [B, T] int32 -> the final-normed hidden states [B, T, D] the output projection reads."""
        positions = default_positions(tokens, positions)
        ropes = {kind: rope_angles(positions, self.head_dim, rope) for kind, rope in self.ropes}
        x = constrain(self.embedded(tokens), ("batch", "length", "act_embed"))
        layer = self.layer_fn(ropes, segment_ids)
        if self.scanned:
            x = scan_groups(self.blocks, x, self.pattern, layer, unroll=self.unroll())
        else:
            for i, block in enumerate(self.blocks):
                x = layer(block, x, self.pattern[i % len(self.pattern)])
        return self.final_norm(x)

    def embedded(self, tokens: jax.Array) -> jax.Array:
        """The embeddings [B, T, D] of ``tokens``, scaled by sqrt(d_model)."""
        table = self.embed[...]
        # Transformers multiplies by sqrt(d_model) made a float32 tensor and then cast to the weights' dtype
        # (Gemma3TextScaledWordEmbedding): in bf16 that is bf16(sqrt(d)), e.g. 55.5 for sqrt(3072) = 55.43
        normalizer = jnp.asarray(np.float32(math.sqrt(self.d_model))).astype(table.dtype)
        return jnp.take(table, tokens, axis=0) * normalizer

    def decode_hidden(self, tokens: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """``hidden`` of tokens [B, T] that continue the sequences in ``cache`` (``CausalLM.decode``): each layer
        reads and writes its own slice of the cache, in the scanned layout through the same groups and tail."""
        t = tokens.shape[1]
        positions = cache.positions(t)
        ropes = {kind: rope_angles(positions, self.head_dim, rope, length=cache.length) for kind, rope in self.ropes}

        def layer(block: Block, h: jax.Array, kind: str, kv: LayerKV) -> tuple[jax.Array, LayerKV]:
            return block.decode(h, ropes[kind], self.window(kind), kv, cache)

        x = self.embedded(tokens)
        if self.scanned:
            x, (k, v) = scan_groups_xs(self.blocks, x, (cache.k, cache.v), self.pattern, layer, unroll=self.unroll())
        else:
            layers = []
            for i, block in enumerate(self.blocks):
                x, kv = layer(block, x, self.pattern[i % len(self.pattern)], (cache.k[i], cache.v[i]))
                layers.append(kv)
            k, v = (jnp.stack(kv) for kv in zip(*layers, strict=True))
        return self.final_norm(x), cache.advanced(k, v, t)

    def window(self, kind: str) -> int:
        """A layer type's attention window (0: global, causal over the whole sequence)."""
        return 0 if kind == GLOBAL else self.sliding_window

    def layer_fn(self, ropes: dict[str, RopeTable], segments: Segments) -> Callable[[Block, jax.Array, str], jax.Array]:
        """(block, x, layer type) -> x through that layer, under ``model.remat``'s policy (per layer, as Llama's)."""
        def run(block: Block, x: jax.Array, kind: str) -> jax.Array:
            return block(x, ropes[kind], segments, self.window(kind))

        if self.remat == "none":
            return run
        policy = REMAT_POLICIES[self.remat]
        # one checkpointed function per layer type: the type fixes the window and RoPE, static to the trace
        def checkpointed(kind: str) -> Callable[[Block, jax.Array], jax.Array]:
            return nnx.remat(lambda blk, h: run(blk, h, kind), policy=policy, prevent_cse=False)

        by_kind = {kind: checkpointed(kind) for kind in set(self.pattern)}
        return lambda block, x, kind: by_kind[kind](block, x)

    def unroll(self) -> int:
        """Groups per scan iteration: ``model.scan_unroll``, or by the platform compiled for: all of them on a
        CPU (XLA:CPU fuses across layers, as Llama's scan), one elsewhere (one group's program, compile time
        flat in depth)."""
        n_groups = self.n_layers // len(self.pattern)
        return (min(self.scan_unroll, n_groups) if self.scan_unroll
                else (n_groups if compiled_platform() == "cpu" else 1))

    def output_weight(self) -> jax.Array:
        """The output projection [D, V]: the embedding table transposed (Gemma 3 ties them)."""
        return self.embed[...].T
