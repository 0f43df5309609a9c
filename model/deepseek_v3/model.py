"""DeepSeek-V3's decoder in Flax NNX (GigaChat 3's architecture): multi-head latent attention, dense first layers,
then mixtures of experts with shared experts.

    tokens -> embedding -> first_k_dense x [RMSNorm -> MLA -> +residual, RMSNorm -> SwiGLU MLP -> +residual]
                        -> the rest     x [RMSNorm -> MLA -> +residual, RMSNorm -> MoE (sigmoid, group-limited top-k,
                                           selection bias, routed_scaling_factor) + shared experts -> +residual]
           -> RMSNorm -> output head (untied) -> logits

As Transformers' ``models/deepseek_v3/modeling_deepseek_v3.py`` defines it (``DeepseekV3ForCausalLM``).

Multi-head latent attention, per token x [D]:

    q = wq_b(RMSNorm(wq_a(x)))  [H, nope + rope]      (q_lora_rank 0: q = wq(x))
    c, k_rope = wkv_a(x)         [kv_lora], [rope]     c is RMS-normed: the latent a KV cache would hold
    k_nope, v = wkv_b(c)         [H, nope], [H, v]
    k = [k_nope, RoPE(k_rope) broadcast over the heads], q = [q_nope, RoPE(q_rope)]
    out = wo(attention(q, k, v))                       scale (nope + rope) ** -0.5

With ``rope_interleave`` (every DeepSeek checkpoint) the rope part's rotation pairs are (x0, x1), (x2, x3), ...:
it is de-interleaved into (evens, odds) halves and rotated as our other families' RoPE rotates halves, which is
Transformers' ``apply_rotary_pos_emb_interleave`` exactly. The values are zero-padded to the query/key width so
every attention kernel (which takes one head width) runs them; the output's padding is dropped (the PV matmul
does (nope + rope) / v times its work: 1.5x at DeepSeek-V3's 192 / 128). Generation caches per token the latent
and the rope key (``LatentAttention.decode``); a step attends in the latent space (``absorbed_attention``) or expands
them into keys and values, whichever takes fewer multiply-adds under ``model.mla_decode: auto`` (absorbed for one
token over a long cache, expanded for a long prefill; bench/README.md times both forms).

The dense first layers (1 to 3 in the published models) are a list run one by one, scanned or not; the mixture-of-
experts layers are one stack (model/stacking.py) when ``scan_layers``. Each MoE layer reports its router's
statistics (model/moe.py's ``LayerStats``), carried out of the scan as [L, ...] arrays: the load-balancing loss
(``router_aux_loss_coef``, Transformers' definition; 0 by default) and the router metrics come from them.

Multi-token prediction (the DeepSeek-V3 report's section 2.2; trained only, ``hidden_with_aux`` with the batch's
labels), depth k = 1..D, position i:

    h_k[i] = head_norm_k(MoE layer_k(eh_proj_k([enorm_k(embed(token[i + k])), hnorm_k(h_(k-1)[i])])))
    loss_k = cross-entropy(h_k @ output head, token[i + k + 1])      masked where i + k leaves the document
    h_0 = the main model's final hidden state (after its final norm, as Megatron-LM and vLLM feed it)

The embedding and output head are the main model's (the report's sharing; the checkpoints hold copies, which import
checks equal and export writes). The MoE layer's selection bias moves with the step's load like the others'; its
router statistics are not among the logged ones. The loss added is ``mtp_loss_weight`` x the depths' mean
cross-entropy; each depth's unweighted loss is logged as ``mtp/loss_<k>``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import jax
import jax.numpy as jnp
from flax import nnx

from experiment.sections.rope import rope_of_config
from model.attention import attend, einsum_attention, resolve_attention
from model.deepseek_v3.config import DeepseekV3Config
from model.family import EXPERT_LOAD
from model.kv_cache import KVCache, LayerKV, cache_mask, decode_layers
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
    yarn_mscale,
)
from model.linear import project
from model.loss import Labels, chunked_cross_entropy, targets_ahead
from model.moe import (
    LayerStats,
    MoE,
    MoEConfig,
    layer_stats,
    pooled_load_balance,
    router_metric_names,
    router_metrics,
    updated_bias,
)
from model.sharding import compiled_platform, constrain
from model.stacking import layer_stack, run_layers_ys

AUX_LOSSES = ("load_balance", "mtp")  # ModelFamily.aux_losses: what hidden_with_aux adds to the loss

Segments = jax.Array | None
RopeTable = tuple[jax.Array, jax.Array]  # sin, cos [B, T, 1, qk_rope_head_dim / 2]
LayerFn = Callable[["Block", jax.Array], tuple[jax.Array, "LayerStats | None"]]  # (layer, x) -> (x, statistics)


def aux_metrics(cfg: DeepseekV3Config) -> tuple[str, ...]:
    """ModelFamily.aux_metrics: the MoE layers' router statistics (model/moe.py's ``router_metrics``) and each
    multi-token prediction depth's cross-entropy, unweighted (when the modules run)."""
    return (*router_metric_names(cfg.n_moe_layers), *(f"mtp/loss_{k}" for k in range(1, cfg.mtp_depth + 1)))


def moe_config(cfg: DeepseekV3Config) -> MoEConfig:
    """model/moe.py's layer as DeepSeek-V3 routes: sigmoid scores, the selection bias, group-limited top-k,
    renormalised and scaled weights, shared experts. Its own losses are not used (the decoder pools the
    statistics); its z-loss comes out unweighted."""
    return MoEConfig(n_experts=cfg.n_experts, top_k=cfg.top_k, d_expert=cfg.d_expert,
                     n_shared_experts=cfg.n_shared_experts, score_func="sigmoid", norm_topk_prob=cfg.norm_topk_prob,
                     routed_scaling_factor=cfg.routed_scaling_factor, routing=cfg.routing,
                     capacity_factor=cfg.capacity_factor, router_z_loss_weight=1.0, load_balance_loss_weight=0.0,
                     aux_free_bias=True, n_group=cfg.n_group, topk_group=cfg.topk_group)


def rope_of(cfg: DeepseekV3Config) -> Rope:
    """The rope part's frequencies: plain, or YaRN's (experiment/sections/rope.py's Rope)."""
    return rope_of_config(cfg)


def softmax_scale(cfg: DeepseekV3Config) -> float:
    """(nope + rope) ** -0.5, times YaRN's mscale(factor, mscale_all_dim) squared where the config sets it
    (DeepSeek-V3's reference code and Transformers' ``yarn_apply_mscale``: every dimension's scores, not only the
    rotated ones, see the longer context's temperature)."""
    scale = cfg.qk_head_dim ** -0.5
    if cfg.rope_scaling == "yarn" and cfg.rope_mscale_all_dim:
        scale *= yarn_mscale(cfg.rope_factor, cfg.rope_mscale_all_dim) ** 2
    return scale


class LatentAttention(nnx.Module):
    """Multi-head latent attention (the module docstring); its parameters' names follow Transformers'."""

    def __init__(self, cfg: DeepseekV3Config, rngs: nnx.Rngs):
        d, h, std = cfg.d_model, cfg.n_heads, cfg.init_std
        self.nope, self.rope_dim, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.kv_rank, self.interleave, self.impl = cfg.kv_lora_rank, cfg.rope_interleave, cfg.attention
        self.decode_form, self.n_heads = cfg.mla_decode, cfg.n_heads
        qk = cfg.qk_head_dim
        self.scale = softmax_scale(cfg)
        if cfg.q_lora_rank:
            self.wq_a = param(rngs, (d, cfg.q_lora_rank), ("embed", "q_lora"), std)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps, "q_lora")
            self.wq_b = param(rngs, (cfg.q_lora_rank, h, qk), ("q_lora", "heads", "head_dim"), std)
            self.wq = None
        else:
            self.wq_a, self.q_norm, self.wq_b = None, None, None
            self.wq = param(rngs, (d, h, qk), ("embed", "heads", "head_dim"), std)
        self.wkv_a = param(rngs, (d, cfg.kv_lora_rank + cfg.qk_rope_head_dim), ("embed", "kv_lora"), std)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg.norm_eps, "kv_lora")
        self.wkv_b = param(rngs, (cfg.kv_lora_rank, h, cfg.qk_nope_head_dim + cfg.v_head_dim),
                           ("kv_lora", "heads", "head_dim"), std)
        self.wo = param(rngs, (h, cfg.v_head_dim, d), ("heads", "head_dim", "embed"), std / (2 * cfg.n_layers) ** 0.5)

    def __call__(self, x: jax.Array, rope: RopeTable, segments: Segments) -> jax.Array:
        q, k, v = self.qkv(x, rope)
        impl = resolve_attention(self.impl, compiled_platform(), x.dtype, q.shape[-1], x.shape[1])
        out = attend(impl, q, k, v, segments, scale=self.scale)
        out = constrain(out[..., :self.v_dim], ("batch", "length", "act_heads", "head_dim"))
        return project(out, self.wo[...], n_in=2, name="o_proj")

    def qkv(self, x: jax.Array, rope: RopeTable) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries and keys [B, T, H, nope + rope] (RoPE'd) and values zero-padded to that width."""
        q = self.queries(x, rope)
        latent, k_rope = self.latent(x, rope)
        k, v = self.keys_values(latent, k_rope, q.shape[-1])
        return q, k, v

    def queries(self, x: jax.Array, rope: RopeTable) -> jax.Array:
        """[B, T, H, nope + rope], the rope part RoPE'd."""
        if self.wq is None:
            q = project(self.q_norm(project(x, self.wq_a[...], name="q_a_proj")), self.wq_b[...], name="q_b_proj")
        else:
            q = project(x, self.wq[...], name="q_proj")
        q = jnp.concatenate([q[..., :self.nope], self.rotate(q[..., self.nope:], rope)], axis=-1)
        return constrain(q, ("batch", "length", "act_heads", "head_dim"))

    def latent(self, x: jax.Array, rope: RopeTable) -> tuple[jax.Array, jax.Array]:
        """What a token leaves for later ones: its normed latent [B, T, kv_lora] and RoPE'd key [B, T, 1, rope]."""
        compressed = project(x, self.wkv_a[...], name="kv_a_proj")
        return self.kv_norm(compressed[..., :self.kv_rank]), self.rotate(compressed[..., None, self.kv_rank:], rope)

    def keys_values(self, latent: jax.Array, k_rope: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
        """Keys [B, S, H, nope + rope] (the rope key shared by the heads) and values zero-padded to ``width``."""
        kv = project(latent, self.wkv_b[...], name="kv_b_proj")  # [B, S, H, nope + v]
        k = jnp.concatenate([kv[..., :self.nope], jnp.broadcast_to(k_rope, (*kv.shape[:3], self.rope_dim))], axis=-1)
        v = kv[..., self.nope:]
        return k, jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, width - self.v_dim)))

    def rotate(self, x: jax.Array, rope: RopeTable) -> jax.Array:
        """RoPE of the rope part; interleaved pairs are de-interleaved into halves first (the module docstring)."""
        if self.interleave:
            x = jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        return rotary(x, rope)

    def decode(self, x: jax.Array, rope: RopeTable, layer: LayerKV, cache: KVCache) -> tuple[jax.Array, LayerKV]:
        """``__call__`` over this layer's cache, which holds per token the normed latent [1, kv_lora] (as ``k``) and
        the RoPE'd shared key [1, rope] (as ``v``), not the expanded keys and values: (output, updated cache).
        Attends in the latent space (``absorbed_attention``) or expands every cached latent through ``wkv_b``, as
        ``__call__`` does, as ``absorbed_for`` chooses."""
        q = self.queries(x, rope)
        latent, k_rope = self.latent(x, rope)
        at = (0, cache.index, 0, 0)
        cached_latent = jax.lax.dynamic_update_slice(layer[0], latent[:, :, None].astype(layer[0].dtype), at)
        cached_rope = jax.lax.dynamic_update_slice(layer[1], k_rope.astype(layer[1].dtype), at)
        mask = cache_mask(cache, x.shape[1])
        if self.absorbed_for(x.shape[1], cache.length):
            out = self.absorbed_attention(q, cached_latent[:, :, 0].astype(q.dtype),
                                          cached_rope[:, :, 0].astype(q.dtype), mask)
        else:
            k, v = self.keys_values(cached_latent[:, :, 0].astype(q.dtype), cached_rope.astype(q.dtype), q.shape[-1])
            out = einsum_attention(q, k, v, mask, self.scale)[..., :self.v_dim]
        return project(out, self.wo[...], n_in=2, name="o_proj"), (cached_latent, cached_rope)

    def absorbed_for(self, t: int, s: int) -> bool:
        """Whether ``t`` new tokens over ``s`` cache slots attend absorbed: as ``model.mla_decode`` says, or under
        ``auto`` the form of fewer multiply-adds per layer (``absorbed_attention``'s docstring: absorbed for a
        decode step over a long cache, expanded for a long prefill)."""
        if self.decode_form != "auto":
            return self.decode_form == "absorbed"
        h, c, r = self.n_heads, self.kv_rank, self.rope_dim
        expanded = s * c * h * (self.nope + self.v_dim) + t * s * h * (self.nope + r + self.v_dim)
        absorbed = t * h * c * (self.nope + self.v_dim) + t * s * h * (2 * c + r)
        return absorbed < expanded

    def absorbed_attention(self, q: jax.Array, latent: jax.Array, k_rope: jax.Array, mask: jax.Array) -> jax.Array:
        """Attention of queries [B, T, H, nope + rope] over cached latents [B, S, kv_lora] and rope keys [B, S, rope]
        without expanding them (DeepSeek-V2 report, section 2.1.2: ``wkv_b``'s key part absorbed into the query,
        its value part applied after the weighted sum of latents): the same scores, as k_nope = latent @ W_k makes
        q_nope . k_nope = (q_nope @ W_k^T) . latent. Per step it costs H x kv_lora x (nope + v) per new token plus
        T x S x H x (2 kv_lora + rope), where expanding costs S x kv_lora x H x (nope + v) plus T x S x H x (nope + rope
        + v): far less for a step of one token over a long cache, more for a prefill of many. -> [B, T, H, v]"""
        w = self.wkv_b[...].astype(q.dtype)  # [kv_lora, H, nope + v]
        q_latent = jnp.einsum("bthn,chn->bthc", q[..., :self.nope], w[..., :self.nope])
        scores = (jnp.einsum("bthc,bsc->bhts", q_latent, latent)
                  + jnp.einsum("bthr,bsr->bhts", q[..., self.nope:], k_rope)).astype(jnp.float32) * self.scale
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(latent.dtype)
        return jnp.einsum("bthc,chv->bthv", jnp.einsum("bhts,bsc->bthc", probs, latent), w[..., self.nope:])


class Block(nnx.Module):
    """One layer: latent attention, then a dense SwiGLU MLP (``moe=False``) or the mixture of experts."""

    def __init__(self, cfg: DeepseekV3Config, moe: bool, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)  # input_layernorm
        self.attn = LatentAttention(cfg, rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)  # post_attention_layernorm
        self.mlp = (MoE(cfg.d_model, moe_config(cfg), cfg.n_layers, cfg.init_std, rngs) if moe
                    else GatedMLP(cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.init_std, "silu", rngs))

    def __call__(self, x: jax.Array, rope: RopeTable, segments: Segments) -> tuple[jax.Array, LayerStats | None]:
        x = x + self.attn(self.attn_norm(x), rope, segments)
        y, stats = self.ffn(self.mlp_norm(x))
        return constrain(x + y, ("batch", "length", "act_embed")), stats

    def ffn(self, h: jax.Array) -> tuple[jax.Array, LayerStats | None]:
        if isinstance(self.mlp, MoE):
            y, stats = self.mlp(h)
            return y, layer_stats(stats)
        return self.mlp(h), None

    def decode(self, x: jax.Array, rope: RopeTable, layer: LayerKV, cache: KVCache) -> tuple[jax.Array, LayerKV]:
        attn, layer = self.attn.decode(self.attn_norm(x), rope, layer, cache)
        x = x + attn
        return x + self.ffn(self.mlp_norm(x))[0], layer


class MultiTokenPredictor(nnx.Module):
    """One multi-token prediction depth (the module docstring); Transformers' checkpoint layer
    ``model.layers.<n_layers + j>``: ``enorm``, ``hnorm``, ``eh_proj`` [D, 2D], a MoE decoder layer,
    ``shared_head.norm`` (its ``embed_tokens`` and ``shared_head.head`` are the main model's)."""

    def __init__(self, cfg: DeepseekV3Config, rngs: nnx.Rngs):
        d = cfg.d_model
        self.enorm = RMSNorm(d, cfg.norm_eps)
        self.hnorm = RMSNorm(d, cfg.norm_eps)
        self.eh_proj = param(rngs, (2 * d, d), ("mtp_in", "embed"), cfg.init_std)  # [embedding; hidden] -> D
        self.block = Block(cfg, True, rngs)
        self.head_norm = RMSNorm(d, cfg.norm_eps)  # shared_head.norm

    def __call__(self, embedded: jax.Array, hidden: jax.Array, layer: LayerFn) -> tuple[jax.Array, LayerStats]:
        """(the depth's normed hidden state [B, T, D] the output head reads, its MoE layer's statistics)."""
        x = project(jnp.concatenate([self.enorm(embedded), self.hnorm(hidden)], axis=-1), self.eh_proj[...],
                    name="eh_proj")
        x, stats = layer(self.block, constrain(x, ("batch", "length", "act_embed")))
        return self.head_norm(x), cast(LayerStats, stats)


class Decoder(CausalLM):
    def __init__(self, cfg: DeepseekV3Config, vocab_size: int, rngs: nnx.Rngs):
        self.vocab_size, self.remat = vocab_size, cfg.remat
        self.scanned, self.scan_unroll, self.n_layers = cfg.scan_layers, cfg.scan_unroll, cfg.n_layers
        self.first_k_dense, self.rope_dim, self.rope = cfg.first_k_dense, cfg.qk_rope_head_dim, rope_of(cfg)
        self.n_experts, self.top_k, self.aux_coef = cfg.n_experts, cfg.top_k, cfg.router_aux_loss_coef
        self.balancing = cfg.router_bias_update_rate > 0  # hidden_with_aux returns the load the biases move by
        self.kv_rank = cfg.kv_lora_rank  # the generation cache holds the latent and the rope key per token
        self.embed = param(rngs, (vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std)
        self.dense_blocks = nnx.List([Block(cfg, False, rngs) for _ in range(cfg.first_k_dense)])
        # the mixture-of-experts layers: one stacked Block when scanned (model/stacking.py), else a list
        self.blocks = layer_stack(lambda layer_rngs: Block(cfg, True, layer_rngs), cfg.n_moe_layers, rngs,
                                  cfg.scan_layers)
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = (None if cfg.tie_embeddings
                        else param(rngs, (cfg.d_model, vocab_size), ("embed", "vocab"), cfg.init_std))
        # built last, so that a model with and without them starts from the same main-model weights
        self.mtp = nnx.List([MultiTokenPredictor(cfg, rngs) for _ in range(cfg.mtp_layers)])
        self.mtp_depth, self.mtp_weight = cfg.mtp_depth, cfg.mtp_loss_weight

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        return self.hidden_with_stats(tokens, segment_ids, positions)[0]

    def hidden_with_aux(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                        positions: jax.Array | None = None, labels: Labels | None = None
                        ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``hidden``'s states, the load-balancing and multi-token prediction losses (weighted) and the metrics
        (model.family.AuxLossModel). The multi-token prediction modules run when ``mtp_loss_weight`` > 0 and
        need ``labels`` (model.family.PredictsAhead: the train step passes them)."""
        hidden, stats = self.hidden_with_stats(tokens, segment_ids, positions)
        balance = pooled_load_balance(stats, self.n_experts, self.top_k)
        aux = {"load_balance": self.aux_coef * balance, **router_metrics(stats, self.n_experts)}
        load, mtp = stats.expert_load, jnp.zeros((), jnp.float32)
        if self.mtp_depth:
            if labels is None:
                raise ValueError("deepseek_v3: multi-token prediction (model.mtp_loss_weight > 0) needs the batch's "
                                 "labels: hidden_with_aux(..., labels=model.loss.Labels(...))")
            losses, mtp_load = self.mtp_losses(hidden, tokens, segment_ids, positions, labels)
            aux.update({f"mtp/loss_{k}": loss for k, loss in enumerate(losses, start=1)})
            mtp = self.mtp_weight * sum(losses) / len(losses)
            load = jnp.concatenate([load, mtp_load])
        aux["mtp"] = mtp
        if self.balancing:
            # [L_moe (+ D), E]: model.family.BalancedRouter; the prediction modules' layers after the main ones
            aux[EXPERT_LOAD] = load.astype(jnp.float32)
        return hidden, aux

    def mtp_losses(self, hidden: jax.Array, tokens: jax.Array, segment_ids: jax.Array | None,
                   positions: jax.Array | None, labels: Labels) -> tuple[list[jax.Array], jax.Array]:
        """Each depth's cross-entropy (the module docstring) and its MoE layer's expert load [D, E]."""
        head, losses, loads = self.output_weight(), [], []
        for k, (state, stats) in enumerate(self.mtp_states(hidden, tokens, segment_ids, positions), start=1):
            targets, weights = targets_ahead(labels, segment_ids, k)
            losses.append(chunked_cross_entropy(state, head, targets, labels.chunk_len, weights=weights)[0])
            loads.append(stats.expert_load)
        return losses, jnp.stack(loads)

    def mtp_states(self, hidden: jax.Array, tokens: jax.Array, segment_ids: jax.Array | None = None,
                   positions: jax.Array | None = None) -> list[tuple[jax.Array, LayerStats]]:
        """Each depth k's normed hidden state [B, T, D] (position i predicts token i + k + 1 from it) and its MoE
        layer's statistics; ``hidden``: the main model's (``hidden``)."""
        positions = default_positions(tokens, positions)
        layer = self.layer_fn(rope_angles(positions, self.rope_dim, self.rope), segment_ids)
        out = []
        for k, module in enumerate(list(self.mtp)[:self.mtp_depth], start=1):
            ahead = jnp.pad(tokens[:, k:], ((0, 0), (0, k)))  # token i + k (the row's end padded; not trained)
            embedded = constrain(jnp.take(self.embed[...], ahead, axis=0), ("batch", "length", "act_embed"))
            hidden, stats = module(embedded, hidden, layer)
            out.append((hidden, stats))
        return out

    def update_router_biases(self, expert_load: jax.Array, rate: float) -> None:
        """Each MoE layer's selection bias moved by ``rate`` against its experts' load ``expert_load`` [L_moe, E],
        then the multi-token prediction layers' ([D, E] more rows, when they ran) (model/moe.py's
        ``updated_bias``; model.family.BalancedRouter: the train step calls it)."""
        n = self.n_layers - self.first_k_dense
        mtp = [(module.block.mlp.router_bias, expert_load[n + j])
               for j, module in enumerate(list(self.mtp)[:expert_load.shape[0] - n])]
        if self.scanned:
            stacked = self.blocks.mlp.router_bias
            stacked[...] = updated_bias(stacked[...], expert_load[:n], rate).astype(stacked[...].dtype)
            layers = mtp
        else:
            layers = [(block.mlp.router_bias, expert_load[i]) for i, block in enumerate(self.blocks)] + mtp
        for bias, load in layers:
            bias[...] = updated_bias(bias[...], load, rate).astype(bias[...].dtype)

    def hidden_with_stats(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                          positions: jax.Array | None = None) -> tuple[jax.Array, LayerStats]:
        """``hidden``'s states and every MoE layer's router statistics (``LayerStats``, [L_moe, ...] each)."""
        positions = default_positions(tokens, positions)
        rope = rope_angles(positions, self.rope_dim, self.rope)
        x = constrain(jnp.take(self.embed[...], tokens, axis=0), ("batch", "length", "act_embed"))
        layer = self.layer_fn(rope, segment_ids)
        for block in self.dense_blocks:
            x, _ = layer(block, x)
        x, stats = run_layers_ys(self.blocks, x, layer, self.scanned, self.unroll())  # stats stacked [L_moe, ...]
        return self.final_norm(x), stats

    def layer_fn(self, rope: RopeTable, segments: Segments) -> LayerFn:
        """(block, x) -> (x through that layer, its statistics), under ``model.remat``'s policy (per layer)."""
        def run(block: Block, x: jax.Array) -> tuple[jax.Array, LayerStats | None]:
            return block(x, rope, segments)

        if self.remat == "none":
            return run
        return nnx.remat(run, policy=REMAT_POLICIES[self.remat], prevent_cse=False)

    def decode_hidden(self, tokens: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """``hidden`` of tokens [B, T] continuing the sequences in ``cache`` (``CausalLM.decode``): the dense layers'
        keys and values are the cache's first ``first_k_dense`` layers, the MoE layers' the rest."""
        t = tokens.shape[1]
        rope = rope_angles(cache.positions(t), self.rope_dim, self.rope, length=cache.length)
        x = jnp.take(self.embed[...], tokens, axis=0)

        def run(block: Block, h: jax.Array, layer: LayerKV) -> tuple[jax.Array, LayerKV]:
            return block.decode(h, rope, layer, cache)

        k_dense, v_dense = [], []
        for i, block in enumerate(self.dense_blocks):
            x, (k, v) = run(block, x, (cache.k[i], cache.v[i]))
            k_dense.append(k)
            v_dense.append(v)
        moe_cache = cache._replace(k=cache.k[self.first_k_dense:], v=cache.v[self.first_k_dense:])
        x, k, v = decode_layers(self.blocks, x, moe_cache, run, self.scanned, self.unroll())
        if k_dense:
            k, v = jnp.concatenate([jnp.stack(k_dense), k]), jnp.concatenate([jnp.stack(v_dense), v])
        return self.final_norm(x), cache.advanced(k, v, t)

    def cache_shape(self) -> tuple[int, int, int, int]:
        """Per token and layer the latent [kv_lora_rank] and the rope key [qk_rope_head_dim] (model/kv_cache.py's
        k and v), not every head's keys and values."""
        return self.n_layers, 1, self.kv_rank, self.rope_dim

    def unroll(self) -> int:
        """MoE layers per scan iteration: ``model.scan_unroll``, or all of them on a CPU, one elsewhere."""
        return self.scan_unroll or (self.n_layers - self.first_k_dense if compiled_platform() == "cpu" else 1)

    def output_weight(self) -> jax.Array:
        return self.embed[...].T if self.lm_head is None else self.lm_head[...]
