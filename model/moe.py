"""A mixture-of-experts feed-forward layer: a router sends each token to ``top_k`` of ``n_experts`` SwiGLU experts.

    x [B, T, D] -> router logits [N, E] -> scores (softmax or sigmoid) -> top-k experts per token and their weights
               -> each token-slot through its expert (SwiGLU, as model/layers.py's GatedMLP) -> weighted sum over k
               (+ shared experts: one dense SwiGLU every token goes through)

Why a layer of its own: a family swaps it in for ``GatedMLP`` to grow parameters without growing FLOPs per token.
Two routers in one config: Qwen3-MoE (softmax scores, top-k, ``norm_topk_prob``, no shared expert) and DeepSeek-V3
(sigmoid scores, an aux-loss-free balancing bias added for selection only, renormalised, ``routed_scaling_factor``,
shared experts). Left out: DeepSeek-V3's group-limited routing (``n_group``/``topk_group``: choose expert groups
first, to bound cross-node traffic; with one group it is plain top-k), expert parallelism (an all-to-all over an
expert mesh axis), router noise, Qwen2-MoE's gated shared expert, and quantized training of the experts' matmuls
(they are ``ragged_dot``s and einsums, not ``model.linear.project``).

Two dispatches: ``dropless`` sorts the token-slots by expert and runs ``jax.lax.ragged_dot`` over the groups
(every slot computed, shapes static because the slot count is); ``capacity`` gives each expert a fixed buffer
of ``ceil(capacity_factor * N * top_k / n_experts)`` slots (GShard, Switch, MaxText): earlier tokens first,
the rest dropped (they add nothing; the residual stream carries those tokens on), so the expert matmuls are
dense batched einsums of a fixed size; ``capacity_factor = n_experts / top_k`` gives every expert N slots, so
nothing can drop. jax 0.10 has a grouped kernel for ``ragged_dot`` on TPU (and on GPU with
``jax_ragged_dot_use_gpu_pallas_triton_lowering``); on CPU it lowers to a masked dot over every expert, and the
capacity route with N slots trained 2x faster there (N=2048, D=256, E=8, k=2). Parameters carry logical axis
names: the experts' leading dim is ``expert`` (a family using this layer adds ``expert`` to its ``AXIS_RULES``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from model.layers import GatedMLP, param
from model.linear import project


@dataclass(frozen=True)
class MoEConfig:
    """One MoE layer's shape and routing. Qwen3-MoE: ``score_func="softmax"``, ``norm_topk_prob`` as its config.
    DeepSeek-V3: ``score_func="sigmoid"``, ``norm_topk_prob=True``, ``routed_scaling_factor=2.5``,
    ``n_shared_experts=1``, ``aux_free_bias=True``."""

    n_experts: int = 8
    top_k: int = 2
    d_expert: int = 512  # each routed expert's hidden width (HF: moe_intermediate_size)
    n_shared_experts: int = 0  # 0: none; else one dense SwiGLU of width n_shared_experts * d_expert
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    norm_topk_prob: bool = True  # the chosen weights renormalised to sum 1 per token
    routed_scaling_factor: float = 1.0  # the chosen weights' scale (DeepSeek-V3: 2.5)
    routing: Literal["dropless", "capacity"] = "dropless"
    capacity_factor: float = 1.25  # capacity routing: ceil(factor * N * top_k / n_experts) slots each, N = B * T
    router_z_loss_weight: float = 0.0  # ST-MoE: weight * mean(logsumexp(logits)^2)
    load_balance_loss_weight: float = 0.0  # Switch: weight * n_experts * sum_e f_e P_e
    aux_free_bias: bool = False  # DeepSeek-V3: a per-expert bias on the scores, for selection only
    bias_update_rate: float = 1e-3  # DeepSeek-V3's gamma, for ``updated_bias``

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"MoE top_k={self.top_k} must be between 1 and n_experts={self.n_experts}")
        if self.score_func not in ("softmax", "sigmoid") or self.routing not in ("dropless", "capacity"):
            raise ValueError(f"MoE score_func={self.score_func!r} / routing={self.routing!r} unknown")
        if self.capacity_factor <= 0:
            raise ValueError(f"MoE capacity_factor={self.capacity_factor} must be positive")


class RouterBias(nnx.Variable):
    """DeepSeek-V3's per-expert selection bias: state, not a parameter. ``nnx.Param`` filters (the optimizer's
    ``wrt``, gradients) leave it out; the trainer moves it with ``updated_bias`` and checkpoints it."""


class Routing(NamedTuple):
    experts: jax.Array  # [N, top_k] int32: each token's experts, best first
    weights: jax.Array  # [N, top_k] fp32: their combine weights
    logits: jax.Array  # [N, n_experts] fp32: the router's logits
    probs: jax.Array  # [N, n_experts] fp32: scores as a distribution per token, for the load-balance loss


class MoEStats(NamedTuple):
    """What a forward pass reports besides its output (a pytree of arrays: scans and jits carry it)."""

    aux_losses: dict[str, jax.Array]  # already weighted: "load_balance", "router_z" (add them to the loss)
    expert_load: jax.Array  # [n_experts] int32: token-slots each expert was chosen for (before capacity drops)
    dropped: jax.Array  # int32: token-slots dropped by capacity routing (0 when dropless)


def updated_bias(bias: jax.Array, expert_load: jax.Array, rate: float) -> jax.Array:
    """DeepSeek-V3's aux-loss-free balancing step: an expert loaded above the mean moves its bias down by
    ``rate``, one below moves up (arXiv 2412.19437, section 2.1.2). Call it after each optimizer step with the
    step's load summed over micro-batches: ``moe.router_bias[...] = updated_bias(moe.router_bias[...], load,
    cfg.bias_update_rate)`` (torchtitan also subtracts the deltas' mean; the paper does not)."""
    load = expert_load.astype(jnp.float32)
    return bias + rate * jnp.sign(jnp.mean(load) - load)


def moe_flops_per_token(d_model: int, d_expert: int, top_k: int, n_shared_experts: int, n_experts: int) -> float:
    """Forward FLOPs per token (2 per multiply-add) of the work the model asks for: the router [D, E] and the
    gate, up and down projections of the ``top_k`` chosen and the shared experts (3 D d_expert each). Capacity
    routing's padding and dropped slots are not counted: this is model FLOPs, for MFU."""
    return 2.0 * (d_model * n_experts + 3 * d_model * d_expert * (top_k + n_shared_experts))


def expert_capacity(cfg: MoEConfig, n_tokens: int) -> int:
    """Token-slots each expert takes under capacity routing."""
    return math.ceil(cfg.capacity_factor * n_tokens * cfg.top_k / cfg.n_experts)


def _experts_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array | None) -> jax.Array:
    """Each expert's rows of ``x`` times its weight ``w`` [E, in, out]: ``x`` [S, in] sorted by expert in groups
    of ``group_sizes`` (ragged), or ``x`` [E, C, in] one buffer per expert (``group_sizes`` None)."""
    w = w.astype(x.dtype)
    if group_sizes is None:
        return jnp.einsum("eci,eio->eco", x, w)
    return jax.lax.ragged_dot(x, w, group_sizes)


class MoE(nnx.Module):
    """``__call__(x [B, T, D]) -> (y [B, T, D], MoEStats)``; init as GatedMLP's (the down projections, which
    write into the residual stream, start scaled down by sqrt(2 n_layers))."""

    def __init__(self, d_model: int, cfg: MoEConfig, n_layers: int, init_std: float, rngs: nnx.Rngs):
        e, f = cfg.n_experts, cfg.d_expert
        self.cfg = cfg
        self.router = param(rngs, (d_model, e), ("embed", "expert"), init_std)
        self.w_gate = param(rngs, (e, d_model, f), ("expert", "embed", "mlp"), init_std)
        self.w_up = param(rngs, (e, d_model, f), ("expert", "embed", "mlp"), init_std)
        self.w_down = param(rngs, (e, f, d_model), ("expert", "mlp", "embed"), init_std / (2 * n_layers) ** 0.5)
        self.router_bias = (RouterBias(jnp.zeros((e,), jnp.float32), out_sharding=("expert",))
                            if cfg.aux_free_bias else None)
        self.shared = (GatedMLP(d_model, cfg.n_shared_experts * f, n_layers, init_std, "silu", rngs)
                       if cfg.n_shared_experts else None)

    def route(self, tokens: jax.Array) -> Routing:
        """tokens [N, D] -> their experts and combine weights; the router computes in fp32 whatever the dtype."""
        cfg = self.cfg
        logits = project(tokens.astype(jnp.float32), self.router[...])
        if cfg.score_func == "softmax":
            scores = jax.nn.softmax(logits, axis=-1)
            probs = scores
        else:
            scores = jax.nn.sigmoid(logits)
            probs = scores / jnp.sum(scores, axis=-1, keepdims=True)  # DeepSeek-V3's normalised s'_i
        # the bias steers which experts are chosen; the weights are the unbiased scores (DeepSeek-V3)
        choice = scores if self.router_bias is None else scores + self.router_bias[...].astype(jnp.float32)
        _, experts = jax.lax.top_k(choice, cfg.top_k)
        weights = jnp.take_along_axis(scores, experts, axis=-1)
        if cfg.norm_topk_prob:
            weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
        return Routing(experts.astype(jnp.int32), weights * cfg.routed_scaling_factor, logits, probs)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, MoEStats]:
        cfg = self.cfg
        b, t, d = x.shape
        tokens = x.reshape(b * t, d)
        routing = self.route(tokens)
        n, k = tokens.shape[0], cfg.top_k
        # token-slots (token n's j-th expert is slot n * k + j) sorted by expert; a stable sort keeps each
        # expert's slots in token order, which is the priority capacity routing drops by
        slot_expert = routing.experts.reshape(n * k)
        order = jnp.argsort(slot_expert, stable=True)
        group_sizes = jnp.bincount(slot_expert, length=cfg.n_experts).astype(jnp.int32)
        sorted_x = tokens[order // k]
        if cfg.routing == "dropless":
            sorted_y = self._experts(sorted_x, group_sizes)
            dropped = jnp.zeros((), jnp.int32)
        else:
            sorted_y, dropped = self._experts_with_capacity(sorted_x, slot_expert[order], group_sizes)
        inverse = jnp.zeros_like(order).at[order].set(jnp.arange(n * k, dtype=order.dtype))
        slot_y = sorted_y[inverse].reshape(n, k, d)  # back in slot order: a gather, so its gradient is one too
        y = jnp.einsum("nkd,nk->nd", slot_y, routing.weights.astype(slot_y.dtype),
                       preferred_element_type=jnp.float32).astype(x.dtype)
        y = y.reshape(b, t, d)
        if self.shared is not None:
            y = y + self.shared(x)
        return y, MoEStats(self._aux_losses(routing, group_sizes), group_sizes, dropped)

    def _experts(self, xs: jax.Array, group_sizes: jax.Array | None) -> jax.Array:
        """SwiGLU of each expert over its rows: down(silu(gate(x)) * up(x))."""
        gate = _experts_matmul(xs, self.w_gate[...], group_sizes)
        up = _experts_matmul(xs, self.w_up[...], group_sizes)
        return _experts_matmul(jax.nn.silu(gate) * up, self.w_down[...], group_sizes)

    def _experts_with_capacity(self, sorted_x: jax.Array, sorted_expert: jax.Array,
                               group_sizes: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Capacity routing: expert e's first C sorted slots fill its buffer row [C, D]; a later slot is dropped
        (its output 0). Returns the sorted slots' outputs and how many were dropped."""
        n_slots = sorted_x.shape[0]
        capacity = expert_capacity(self.cfg, n_slots // self.cfg.top_k)
        starts = jnp.cumsum(group_sizes) - group_sizes  # where each expert's slots begin in the sorted order
        # gather each buffer cell (expert, c) from sorted slot starts[expert] + c, if the expert has that many
        cell = starts[:, None] + jnp.arange(capacity)[None, :]
        filled = jnp.arange(capacity)[None, :] < group_sizes[:, None]
        buffers = jnp.where(filled[..., None], sorted_x[jnp.minimum(cell, n_slots - 1)], 0)
        out = self._experts(buffers, None)  # [E, C, D]
        position = jnp.arange(n_slots) - starts[sorted_expert]  # each sorted slot's place in its expert's queue
        kept = position < capacity
        sorted_y = jnp.where(kept[:, None], out[sorted_expert, jnp.minimum(position, capacity - 1)], 0)
        return sorted_y, (n_slots - jnp.sum(kept)).astype(jnp.int32)

    def _aux_losses(self, routing: Routing, expert_load: jax.Array) -> dict[str, jax.Array]:
        """Switch/GShard load balance: n_experts * sum_e f_e P_e, f_e the fraction of token-slots chosen for e and
        P_e the mean probability of e (Megatron's switch_load_balancing_loss_func; Hugging Face's Qwen3-MoE
        ``load_balancing_loss_func`` is top_k times it), 1 at a uniform router; ST-MoE's router z-loss,
        mean(logsumexp(logits)^2), keeping the logits small."""
        cfg = self.cfg
        fraction = expert_load.astype(jnp.float32) / jnp.sum(expert_load)
        balance = cfg.n_experts * jnp.sum(fraction * jnp.mean(routing.probs, axis=0))
        z = jnp.mean(jnp.square(jax.nn.logsumexp(routing.logits, axis=-1)))
        return {"load_balance": cfg.load_balance_loss_weight * balance, "router_z": cfg.router_z_loss_weight * z}
