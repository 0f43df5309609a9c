"""Qwen3-MoE's decoder in Flax NNX: Qwen3's attention, and a mixture of experts as every layer's MLP.

    tokens -> embedding -> n_layers x [RMSNorm -> GQA attention (q/k RMS-normed per head, RoPE) -> +residual,
                                       RMSNorm -> MoE: softmax router, top_k of n_experts SwiGLU experts -> +residual]
           -> RMSNorm -> output head (untied by default) -> logits

As Transformers' ``models/qwen3_moe/modeling_qwen3_moe.py`` defines it (``Qwen3MoeForCausalLM``). The experts are
model/moe.py's ``MoE`` (Qwen3-MoE's routing: softmax scores, top-k, ``norm_topk_prob``, no shared expert); the
attention is built here from model/layers.py's and model/attention.py's pieces (a family's folder imports no other
family's: model/llama's attention is Qwen3's too, but the import contracts keep the folders apart).

Each layer also reports its router's statistics (``LayerStats``: the token-slots each expert was chosen for, the
mean router probability of each expert, the router z-loss, the slots capacity routing dropped). With
``scan_layers`` the layers are one stack run by model/stacking.py's ``scan_layers_xs``, whose per-layer outputs
carry those statistics out of the scan as [L, ...] arrays; unrolled, a loop stacks them the same way. The
auxiliary losses the train step adds (``hidden_with_aux``) are computed from them after the last layer:

- ``load_balance`` = ``router_aux_loss_coef`` x Transformers' ``load_balancing_loss_func`` of the layers' router
  logits: n_experts x sum_e F_e P_e, with F_e the token-slots chosen for expert e over all layers divided by the
  tokens over all layers (so sum_e F_e = top_k) and P_e the mean probability of e over all layers' tokens. Per
  layer that is ``top_k`` times model/moe.py's Switch loss (whose f_e divides by the slots, not the tokens); over
  layers Transformers pools the counts and probabilities before multiplying, and so does this. A coefficient
  imported from a config.json (0.001 in the published ones) thus trains Transformers' objective; the value at a
  perfectly balanced router is ``router_aux_loss_coef * top_k``. Every position counts (Transformers' without an
  attention mask).
- ``router_z`` = ``router_z_loss_coef`` x the mean over layers of ST-MoE's mean(logsumexp(router logits)^2).

Eval and export call ``__call__`` / ``hidden``, which drop the statistics (XLA removes their computation).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from model.attention import attend, resolve_attention
from model.kv_cache import KVCache, LayerKV, attend_cached, decode_layers
from model.layers import REMAT_POLICIES, CausalLM, RMSNorm, Rope, default_positions, param, rope_angles, rotary
from model.linear import project
from model.moe import (
    LayerStats,
    MoE,
    MoEConfig,
    layer_stats,
    pooled_load_balance,
    router_metric_names,
    router_metrics,
)
from model.qwen3_moe.config import Qwen3MoeConfig
from model.sharding import compiled_platform, constrain
from model.stacking import layer_stack, run_layers_ys

# the submodules whose matmuls quantized training quantizes (model.family.ModelFamily.quantized_modules): attention's
# projections; the experts' matmuls are ragged_dots and einsums (model/moe.py), and the router stays in fp32

AUX_LOSSES = ("load_balance", "router_z")  # ModelFamily.aux_losses: what hidden_with_aux adds to the loss


def aux_metrics(cfg: Qwen3MoeConfig) -> tuple[str, ...]:
    """ModelFamily.aux_metrics: the router statistics hidden_with_aux also returns, logged as train/aux/<name>
    (model/moe.py's ``router_metrics``)."""
    return router_metric_names(cfg.n_layers)

Segments = jax.Array | None  # packed documents' segment ids [B, T]; None: plain causal attention
RopeTable = tuple[jax.Array, jax.Array]  # sin, cos [B, T, 1, head_dim / 2]
LayerFn = Callable[["Block", jax.Array], tuple[jax.Array, "LayerStats"]]  # (layer, x) -> (x, its statistics)


def moe_config(cfg: Qwen3MoeConfig) -> MoEConfig:
    """model/moe.py's layer as Qwen3-MoE routes: softmax scores, top-k, ``norm_topk_prob``, no shared expert. Its
    own weighted losses are not used (the decoder pools the statistics over layers); its z-loss comes out unweighted."""
    return MoEConfig(n_experts=cfg.n_experts, top_k=cfg.top_k, d_expert=cfg.d_expert, n_shared_experts=0,
                     score_func="softmax", norm_topk_prob=cfg.norm_topk_prob, routing=cfg.routing,
                     capacity_factor=cfg.capacity_factor, router_z_loss_weight=1.0, load_balance_loss_weight=0.0)


class Attention(nnx.Module):
    """Qwen3's attention: grouped-query, each query and key head RMS-normed (one scale per head dimension, shared
    by the heads) before RoPE, no biases."""

    def __init__(self, cfg: Qwen3MoeConfig, rngs: nnx.Rngs):
        d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
        self.head_dim, self.impl = hd, cfg.attention
        self.wq = param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), cfg.init_std)
        self.wk = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), cfg.init_std)
        self.wv = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), cfg.init_std)
        # scaled init of the projection that writes into the residual stream (GPT-2), as the other families'
        self.wo = param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), cfg.init_std / (2 * cfg.n_layers) ** 0.5)
        self.q_norm = RMSNorm(hd, cfg.norm_eps, "head_dim")
        self.k_norm = RMSNorm(hd, cfg.norm_eps, "head_dim")

    def __call__(self, x: jax.Array, rope: RopeTable, segments: Segments) -> jax.Array:
        q, k, v = self.qkv(x, rope)
        impl = resolve_attention(self.impl, compiled_platform(), x.dtype, self.head_dim, x.shape[1])
        out = constrain(attend(impl, q, k, v, segments), ("batch", "length", "act_heads", "head_dim"))
        return project(out, self.wo[...], n_in=2, name="o_proj")

    def qkv(self, x: jax.Array, rope: RopeTable) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The normed, RoPE'd queries and keys and the values of ``x``: [B, T, H or KV, D]."""
        q, k, v = (project(x, w[...], name=name) for w, name in ((self.wq, "q_proj"), (self.wk, "k_proj"),
                                                                     (self.wv, "v_proj")))
        q = constrain(rotary(self.q_norm(q), rope), ("batch", "length", "act_heads", "head_dim"))
        return q, rotary(self.k_norm(k), rope), v

    def decode(self, x: jax.Array, rope: RopeTable, layer: LayerKV, cache: KVCache) -> tuple[jax.Array, LayerKV]:
        """``__call__`` over this layer's cached keys and values (model/kv_cache.py): (output, updated k and v)."""
        q, k, v = self.qkv(x, rope)
        out, layer = attend_cached(q, k, v, layer, cache)
        return project(out, self.wo[...], n_in=2, name="o_proj"), layer


class Block(nnx.Module):
    """One layer: attention, then the mixture of experts, each after an RMSNorm and added to the residual stream."""

    def __init__(self, cfg: Qwen3MoeConfig, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)  # input_layernorm
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)  # post_attention_layernorm
        self.mlp = MoE(cfg.d_model, moe_config(cfg), cfg.n_layers, cfg.init_std, rngs)

    def __call__(self, x: jax.Array, rope: RopeTable, segments: Segments) -> tuple[jax.Array, LayerStats]:
        x = x + self.attn(self.attn_norm(x), rope, segments)
        y, stats = self.experts(self.mlp_norm(x))
        return constrain(x + y, ("batch", "length", "act_embed")), stats

    def experts(self, h: jax.Array) -> tuple[jax.Array, LayerStats]:
        """The mixture of experts of ``h`` [B, T, D] and its router statistics (model/moe.py's ``MoEStats``: the
        load, the mean router probabilities, the unweighted z-loss and the drops)."""
        y, stats = self.mlp(h)
        return y, layer_stats(stats)

    def decode(self, x: jax.Array, rope: RopeTable, layer: LayerKV, cache: KVCache) -> tuple[jax.Array, LayerKV]:
        attn, layer = self.attn.decode(self.attn_norm(x), rope, layer, cache)
        x = x + attn
        y, _ = self.mlp(self.mlp_norm(x))
        return x + y, layer


class Decoder(CausalLM):
    def __init__(self, cfg: Qwen3MoeConfig, vocab_size: int, rngs: nnx.Rngs):
        self.vocab_size, self.remat = vocab_size, cfg.remat
        self.scanned, self.scan_unroll, self.n_layers = cfg.scan_layers, cfg.scan_unroll, cfg.n_layers
        self.head_dim, self.rope, self.n_kv_heads = cfg.resolved_head_dim, Rope(cfg.rope_theta), cfg.n_kv_heads
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.aux_coef, self.z_coef = cfg.router_aux_loss_coef, cfg.router_z_loss_coef
        self.embed = param(rngs, (vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std)
        # scanned (model/stacking.py): one Block whose parameters carry a leading layer axis; else a list.
        # ``stacked`` gives layer i the values the list's i-th Block gets: init is the same in either layout
        self.blocks = layer_stack(lambda layer_rngs: Block(cfg, layer_rngs), cfg.n_layers, rngs, cfg.scan_layers)
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = (None if cfg.tie_embeddings
                        else param(rngs, (cfg.d_model, vocab_size), ("embed", "vocab"), cfg.init_std))

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        """tokens [B, T] int32 -> the final-normed hidden states [B, T, D] the output projection reads."""
        return self.hidden_with_stats(tokens, segment_ids, positions)[0]

    def hidden_with_aux(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                        positions: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``hidden``'s states, the family's auxiliary losses (``AUX_LOSSES``), weighted by the config, and its router
        statistics (``aux_metrics``): the train step adds the losses to the loss and logs all of them as
        train/aux/<name> (model.family.AuxLossModel)."""
        hidden, stats = self.hidden_with_stats(tokens, segment_ids, positions)
        return hidden, {**self.aux_losses(stats), **router_metrics(stats, self.n_experts)}

    def hidden_with_stats(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                          positions: jax.Array | None = None) -> tuple[jax.Array, LayerStats]:
        """``hidden``'s states and every layer's router statistics (``LayerStats``, [L, ...] each)."""
        positions = default_positions(tokens, positions)
        rope = rope_angles(positions, self.head_dim, self.rope)
        x = constrain(jnp.take(self.embed[...], tokens, axis=0), ("batch", "length", "act_embed"))
        layer = self.layer_fn(rope, segment_ids)
        # the statistics are each layer's output, stacked [L, ...] (by the scan when scanned: model/stacking.py)
        x, stats = run_layers_ys(self.blocks, x, layer, self.scanned, self.unroll())
        return self.final_norm(x), stats

    def aux_losses(self, stats: LayerStats) -> dict[str, jax.Array]:
        """The weighted auxiliary losses of every layer's statistics (the module docstring has the formulas)."""
        balance = pooled_load_balance(stats, self.n_experts, self.top_k)
        return {"load_balance": self.aux_coef * balance, "router_z": self.z_coef * jnp.mean(stats.router_z)}

    def layer_fn(self, rope: RopeTable, segments: Segments) -> LayerFn:
        """(block, x) -> (x through that layer, its statistics), under ``model.remat``'s policy (per layer). Under
        save_dots the experts' ragged_dots and batched einsums are not saved (they are no plain dots): their forward
        is recomputed in the backward pass (model/qwen3_moe/flops.py counts it)."""
        def run(block: Block, x: jax.Array) -> tuple[jax.Array, LayerStats]:
            return block(x, rope, segments)

        if self.remat == "none":
            return run
        return nnx.remat(run, policy=REMAT_POLICIES[self.remat], prevent_cse=False)

    def decode_hidden(self, tokens: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """``hidden`` of tokens [B, T] that continue the sequences in ``cache`` (``CausalLM.decode``). The experts
        route the step's tokens as the forward pass routes its batch: with dropless routing (the default) a cached
        decode gives the full forward pass's logits; capacity routing computes each step's capacity from its own
        tokens."""
        t = tokens.shape[1]
        rope = rope_angles(cache.positions(t), self.head_dim, self.rope, length=cache.length)
        x = jnp.take(self.embed[...], tokens, axis=0)

        def run(block: Block, h: jax.Array, layer: LayerKV) -> tuple[jax.Array, LayerKV]:
            return block.decode(h, rope, layer, cache)

        x, k, v = decode_layers(self.blocks, x, cache, run, self.scanned, self.unroll())
        return self.final_norm(x), cache.advanced(k, v, t)

    def unroll(self) -> int:
        """Layers per scan iteration: ``model.scan_unroll``, or by the platform compiled for: all of them on a CPU
        (XLA:CPU fuses across layers, as Llama's scan), one elsewhere (compile time flat in depth)."""
        return self.scan_unroll or (self.n_layers if compiled_platform() == "cpu" else 1)

    def output_weight(self) -> jax.Array:
        """The output projection [D, V]: the embedding table transposed when tied."""
        return self.embed[...].T if self.lm_head is None else self.lm_head[...]
