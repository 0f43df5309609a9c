"""A Llama-style decoder in Flax NNX, readable in one sitting.

    tokens -> embedding -> n_layers x [RMSNorm -> GQA attention with RoPE -> +residual,
                                       RMSNorm -> SwiGLU MLP (model/layers.py) -> +residual]
           -> RMSNorm -> tied (or separate) output projection -> logits

Options of the families built on it (model/llama/family.py): biases on the query/key/value
projections (``qkv_bias``, Qwen2), an RMSNorm over each query and key head before RoPE (``qk_norm``,
Qwen3) and Llama 3's RoPE frequency scaling (``rope_scaling: llama3``).

Every parameter carries logical axis names (``out_sharding`` metadata) that ``model.sharding``
maps onto the device mesh; key activations are pinned with ``constrain``. The model computes in
the dtype of the parameters it is given: the trainer casts fp32 master weights to bf16 before the
forward pass when ``train.compute_dtype`` is bfloat16. Norms, softmax and the logits stay fp32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from experiment.sections.rope import rope_of_config
from model.attention import attend, resolve_attention
from model.context import context_attention, context_parts, from_balanced, to_balanced
from model.kv_cache import KVCache, LayerKV, attend_cached, decode_layers
from model.layers import (
    REMAT_POLICIES,
    CausalLM,
    GatedMLP,
    RMSNorm,
    Rope,
    default_positions,
    param,
    rope_angles,
    rotary,
    zeros,
)
from model.linear import project
from model.llama.config import LlamaConfig
from model.sharding import compiled_platform, constrain
from model.stacking import layer_stack, scan_layers

# the submodules whose matmuls quantized training quantizes (model.family.ModelFamily.quantized_modules):
# attention's and the MLP's projections; attention's score and value einsums (activation x activation)
# and the output head (in the loss, outside ``hidden``) stay in the compute dtype
QUANTIZED_MODULES = r"blocks/(\d+/)?(attn|mlp)"  # unrolled blocks/<i>/attn, or the scanned stack's blocks/attn


def rope_of(cfg: LlamaConfig) -> Rope:
    """RoPE's frequencies as the config sets them."""
    return rope_of_config(cfg)


Segments = jax.Array | None  # packed documents' segment ids [B, T]; None: plain causal attention


class Attention(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
        d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = h, kv, hd
        self.impl, self.context_attention = cfg.attention, cfg.context_attention
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
        q, k, v = self.qkv(x, rope)
        if context_parts() > 1:  # the sequence split over the context axis, load-balanced (model/context.py)
            out = context_attention(q, k, v, segments, ring=self.context_attention == "ring")
        else:
            out = attend(resolve_attention(self.impl, compiled_platform(), x.dtype, self.head_dim, t), q, k, v,
                         segments)
        out = constrain(out, ("batch", "length", "act_heads", "head_dim"))
        return project(out, self.wo[...], n_in=2, name="o_proj")

    def qkv(self, x: jax.Array, rope: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The queries and keys (RoPE'd) and values of ``x``: [B, T, H or KV, D]."""
        q, k, v = (project(x, w[...], name=name) for w, name in ((self.wq, "q_proj"), (self.wk, "k_proj"),
                                                                     (self.wv, "v_proj")))
        if self.bq is not None:
            q, k, v = (y + bias[...].astype(y.dtype) for y, bias in ((q, self.bq), (k, self.bk), (v, self.bv)))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = constrain(rotary(q, rope), ("batch", "length", "act_heads", "head_dim"))
        return q, rotary(k, rope), v

    def decode(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], layer: LayerKV,
               cache: KVCache) -> tuple[jax.Array, LayerKV]:
        """``__call__`` over this layer's cached keys and values (model/kv_cache.py): (output, updated k and v)."""
        q, k, v = self.qkv(x, rope)
        out, layer = attend_cached(q, k, v, layer, cache)
        return project(out, self.wo[...], n_in=2, name="o_proj"), layer


class Block(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = GatedMLP(cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.init_std, "silu", rngs)

    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], segments: Segments) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), rope, segments)
        x = x + self.mlp(self.mlp_norm(x))
        return constrain(x, ("batch", "length", "act_embed"))

    def decode(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], layer: LayerKV,
               cache: KVCache) -> tuple[jax.Array, LayerKV]:
        attn, layer = self.attn.decode(self.attn_norm(x), rope, layer, cache)
        x = x + attn
        return x + self.mlp(self.mlp_norm(x)), layer


class Decoder(CausalLM):
    def __init__(self, cfg: LlamaConfig, vocab_size: int, rngs: nnx.Rngs):
        self.vocab_size, self.remat = vocab_size, cfg.remat
        self.scanned, self.scan_unroll, self.n_layers = cfg.scan_layers, cfg.scan_unroll, cfg.n_layers
        self.head_dim, self.rope, self.n_kv_heads = cfg.resolved_head_dim, rope_of(cfg), cfg.n_kv_heads
        self.embed = param(rngs, (vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std)
        # scanned (model/stacking.py): one Block whose parameters carry a leading layer axis; else a list
        self.blocks = layer_stack(lambda layer_rngs: Block(cfg, layer_rngs), cfg.n_layers, rngs, cfg.scan_layers)
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = (None if cfg.tie_embeddings
                        else param(rngs, (cfg.d_model, vocab_size), ("embed", "vocab"), cfg.init_std))

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        """tokens [B, T] int32 -> the final-normed hidden states [B, T, D] the output projection reads."""
        positions = default_positions(tokens, positions)
        # with the sequence split over a context axis the blocks see it in the load-balanced order (model/context.py),
        # each token with its own position and segment; the hidden states go back to sequence order at the end
        parts = context_parts()
        tokens, positions = (to_balanced(a, parts, ("batch", "length")) for a in (tokens, positions))
        segment_ids = None if segment_ids is None else to_balanced(segment_ids, parts, ("batch", "length"))
        rope = rope_angles(positions, self.head_dim, self.rope)
        x = constrain(jnp.take(self.embed[...], tokens, axis=0), ("batch", "length", "act_embed"))
        if self.scanned:
            x = scan_layers(self.blocks, x, lambda block, h: block(h, rope, segment_ids),
                            REMAT_POLICIES.get(self.remat), remat=self.remat != "none", unroll=self.unroll())
        else:
            for block in self.blocks:
                x = self.run_block(block, x, rope, segment_ids)
        return self.final_norm(from_balanced(x, parts, ("batch", "length", "act_embed")))

    def decode_hidden(self, tokens: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """``hidden`` of tokens [B, T] that continue the sequences in ``cache`` (``CausalLM.decode``)."""
        t = tokens.shape[1]
        rope = rope_angles(cache.positions(t), self.head_dim, self.rope, length=cache.length)
        x = jnp.take(self.embed[...], tokens, axis=0)

        def run(block: Block, h: jax.Array, layer: LayerKV) -> tuple[jax.Array, LayerKV]:
            return block.decode(h, rope, layer, cache)

        x, k, v = decode_layers(self.blocks, x, cache, run, self.scanned, self.unroll())
        return self.final_norm(x), cache.advanced(k, v, t)

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

