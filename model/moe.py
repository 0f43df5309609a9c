"""A mixture-of-experts feed-forward layer: a router sends each token to ``top_k`` of ``n_experts`` SwiGLU experts.

    x [B, T, D] -> router logits [N, E] -> scores (softmax or sigmoid) -> top-k experts per token and their weights
               -> each token-slot through its expert (SwiGLU, as model/layers.py's GatedMLP) -> weighted sum over k
               (+ shared experts: one dense SwiGLU every token goes through)

Why a layer of its own: a family swaps it in for ``GatedMLP`` to grow parameters without growing FLOPs per token.
Two routers in one config: Qwen3-MoE (softmax scores, top-k, ``norm_topk_prob``, no shared expert) and DeepSeek-V3
(sigmoid scores, an aux-loss-free balancing bias added for selection only, renormalised, ``routed_scaling_factor``,
shared experts). Left out: DeepSeek-V3's group-limited routing (``n_group``/``topk_group``: choose expert groups
first, to bound cross-node traffic; with one group it is plain top-k), an all-to-all dispatch (see below), router
noise, Qwen2-MoE's gated shared expert, and quantized training of the experts' matmuls (they are ``ragged_dot``s
and einsums, not ``model.linear.project``).

On a mesh (a trainer's layout, ``model.sharding``) the router runs on the global batch, so its statistics and
losses are the global batch's, and the experts run per device inside ``shard_map`` (``MoE.experts_local``): each
device sorts and computes its own tokens' slots, so its memory follows its share of the batch (sorting the global
batch under GSPMD made every device hold every token-slot: 206 GiB of temporaries per chip for Qwen3-30B-A3B at
256 x 4,096 tokens on v5p-64, 73 GiB this way). With an ``expert`` mesh axis the experts are split over it and
the tokens of an expert group (the devices along that axis) are all-gathered, each device computes the slots of
its own experts, and a reduce-scatter returns each token's sum: Megatron's all-gather dispatcher. Every token
goes to every device of its group (an all-to-all would send each token-slot only to its expert's device), and each
device's buffers hold all the group's slots, most of them for experts elsewhere (73 GiB above, against 43 GiB with
the experts under FSDP alone): what a ragged all-to-all (``jax.lax.ragged_all_to_all``) would save is not built
or measured here.

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

import functools
import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, PartitionSpec

from experiment.errors import ConfigError
from model.layers import GatedMLP, param
from model.linear import project
from model.sharding import current_layout, logical_to_spec, spec_axes


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
    # DeepSeek-V3's group-limited routing: the experts in n_group equal groups, each token choosing among the
    # experts of its topk_group best groups (a group's score: the sum of its two best experts' selection scores);
    # 1 and 1: plain top-k
    n_group: int = 1
    topk_group: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"MoE top_k={self.top_k} must be between 1 and n_experts={self.n_experts}")
        if self.score_func not in ("softmax", "sigmoid") or self.routing not in ("dropless", "capacity"):
            raise ValueError(f"MoE score_func={self.score_func!r} / routing={self.routing!r} unknown")
        if self.capacity_factor <= 0:
            raise ValueError(f"MoE capacity_factor={self.capacity_factor} must be positive")
        if self.n_group < 1 or self.n_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"MoE n_group={self.n_group} must divide n_experts={self.n_experts} and topk_group="
                             f"{self.topk_group} be between 1 and n_group")
        if self.n_group > 1 and (self.n_experts // self.n_group < 2
                                 or self.top_k > self.topk_group * (self.n_experts // self.n_group)):
            raise ValueError(f"MoE group routing: each of the n_group={self.n_group} groups needs 2 experts or more, "
                             f"and top_k={self.top_k} at most the topk_group={self.topk_group} groups' experts")


class RouterBias(nnx.Param):
    """DeepSeek-V3's per-expert selection bias (Transformers' ``e_score_correction_bias``). A parameter, so it is
    checkpointed, restacked, imported and exported with the others, but no gradient reaches it (``MoE.route``
    stops it: it only decides which experts are chosen), so the optimizer never moves it (Adam's moments stay 0;
    a vector per layer, it is not weight-decayed); ``updated_bias`` is how it moves."""


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
    router_probs: jax.Array  # [n_experts] fp32: each expert's router probability, averaged over the tokens


class LayerStats(NamedTuple):
    """One MoE layer's router statistics as a decoder collects them; out of a decoder, every field with a leading
    layer axis [L, ...] (scans and loops stack them)."""

    expert_load: jax.Array  # [E] int32: token-slots each expert was chosen for (before capacity drops)
    router_probs: jax.Array  # [E] float32: each expert's router probability, averaged over the tokens
    router_z: jax.Array  # float32: mean over the tokens of logsumexp(router logits)^2
    dropped: jax.Array  # int32: token-slots capacity routing dropped (0 when dropless)


def layer_stats(stats: MoEStats) -> LayerStats:
    """A layer's ``LayerStats`` from its ``MoEStats`` (its router z-loss unweighted: the layer's weight 1)."""
    return LayerStats(stats.expert_load, stats.router_probs, stats.aux_losses["router_z"], stats.dropped)


def pooled_load_balance(stats: LayerStats, n_experts: int, top_k: int) -> jax.Array:
    """Transformers' ``load_balancing_loss_func`` of every layer's routing, unweighted: n_experts x sum_e F_e P_e,
    F_e the token-slots chosen for expert e over all layers divided by the tokens over all layers (sum_e F_e =
    top_k), P_e the mean probability of e over all layers' tokens (top_k at a balanced router). Per layer it is
    ``top_k`` times the Switch loss ``MoE`` computes (whose fractions divide by the slots)."""
    load = stats.expert_load.astype(jnp.float32)  # [L, E]
    fraction = jnp.sum(load, axis=0) / jnp.sum(load)  # of all layers' token-slots: F_e / top_k
    return top_k * n_experts * jnp.sum(fraction * jnp.mean(stats.router_probs, axis=0))


def router_metric_names(n_layers: int) -> tuple[str, ...]:
    """The names ``router_metrics`` returns (a family's ``ModelFamily.aux_metrics``)."""
    return ("router/dropped_fraction", "router/load_max",
            *(f"router/load_max_layer_{i:02d}" for i in range(n_layers)))


def router_metrics(stats: LayerStats, n_experts: int) -> dict[str, jax.Array]:
    """Each layer's expert load as its busiest expert's token-slots over the mean per expert (1: balanced;
    n_experts / top_k at most: every token chose that expert), the worst layer's, and the fraction of all layers'
    token-slots capacity routing dropped (0 when dropless: counted, not assumed)."""
    load = stats.expert_load.astype(jnp.float32)  # [L, E]
    busiest = n_experts * jnp.max(load, axis=1) / jnp.maximum(jnp.sum(load, axis=1), 1.0)  # [L]
    dropped = jnp.sum(stats.dropped).astype(jnp.float32) / jnp.maximum(jnp.sum(load), 1.0)
    return {"router/dropped_fraction": dropped, "router/load_max": jnp.max(busiest),
            **{f"router/load_max_layer_{i:02d}": busiest[i] for i in range(load.shape[0])}}


def updated_bias(bias: jax.Array, expert_load: jax.Array, rate: float) -> jax.Array:
    """DeepSeek-V3's aux-loss-free balancing step: an expert loaded above its layer's mean moves its bias down by
    ``rate``, one below moves up (arXiv 2412.19437, section 2.1.2); ``expert_load`` [E] or [L, E] (each layer
    against its own mean). The train step applies it after each optimizer step through the family's
    ``model.family.BalancedRouter`` (torchtitan also subtracts the deltas' mean; the paper does not)."""
    load = expert_load.astype(jnp.float32)  # [E], or [L, E]: each layer against its own mean
    return bias + rate * jnp.sign(jnp.mean(load, axis=-1, keepdims=True) - load)


def group_limited(choice: jax.Array, n_group: int, topk_group: int) -> jax.Array:
    """DeepSeek-V3's group-limited selection: the experts' scores [N, E] with every expert outside each token's
    ``topk_group`` best groups set to -inf (a group's score: the sum of its two best experts' scores), so the top-k
    that follows picks inside those groups (DeepSeek-V3 technical report, section 2.1.2; Transformers'
    ``DeepseekV3TopkRouter``)."""
    n, e = choice.shape
    grouped = choice.reshape(n, n_group, e // n_group)
    group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [N, G]
    _, best = jax.lax.top_k(group_scores, topk_group)
    keep = jnp.sum(jax.nn.one_hot(best, n_group, dtype=jnp.bool_), axis=1, dtype=jnp.bool_)  # [N, G]
    return jnp.where(keep[:, :, None], grouped, -jnp.inf).reshape(n, e)


def moe_flops_per_token(d_model: int, d_expert: int, top_k: int, n_shared_experts: int, n_experts: int) -> float:
    """Forward FLOPs per token (2 per multiply-add) of the work the model asks for: the router [D, E] and the
    gate, up and down projections of the ``top_k`` chosen and the shared experts (3 D d_expert each). Capacity
    routing's padding and dropped slots are not counted: this is model FLOPs, for MFU."""
    return 2.0 * (d_model * n_experts + 3 * d_model * d_expert * (top_k + n_shared_experts))


def expert_capacity(cfg: MoEConfig, n_tokens: int) -> int:
    """Token-slots each expert takes under capacity routing."""
    return math.ceil(cfg.capacity_factor * n_tokens * cfg.top_k / cfg.n_experts)


ExpertWeights = tuple[jax.Array, jax.Array, jax.Array]  # w_gate, w_up [E, D, F], w_down [E, F, D] (E: local)


def _experts_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array | None) -> jax.Array:
    """Each expert's rows of ``x`` times its weight ``w`` [E, in, out]: ``x`` [S, in] sorted by expert in groups
    of ``group_sizes`` (ragged), or ``x`` [E, C, in] one buffer per expert (``group_sizes`` None)."""
    w = w.astype(x.dtype)
    if group_sizes is None:
        return jnp.einsum("eci,eio->eco", x, w)
    return jax.lax.ragged_dot(x, w, group_sizes)


def experts_swiglu(xs: jax.Array, weights: ExpertWeights, group_sizes: jax.Array | None) -> jax.Array:
    """SwiGLU of each expert over its rows: down(silu(gate(x)) * up(x)). Sorted rows past the groups give 0."""
    w_gate, w_up, w_down = weights
    gate = _experts_matmul(xs, w_gate, group_sizes)
    up = _experts_matmul(xs, w_up, group_sizes)
    return _experts_matmul(jax.nn.silu(gate) * up, w_down, group_sizes)


def experts_with_capacity(sorted_x: jax.Array, sorted_expert: jax.Array, group_sizes: jax.Array,
                          weights: ExpertWeights, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Capacity routing: expert e's first ``capacity`` sorted slots fill its buffer row [C, D]; a later slot is
    dropped (its output 0). ``sorted_expert`` is each sorted slot's expert among the ``len(group_sizes)`` here; a
    slot of an expert elsewhere (its key ``len(group_sizes)``, sorted last) is neither computed nor counted.
    Returns the sorted slots' outputs and how many of this device's experts' slots were dropped."""
    n_slots, n_experts = sorted_x.shape[0], group_sizes.shape[0]
    starts = jnp.cumsum(group_sizes) - group_sizes  # where each expert's slots begin in the sorted order
    # gather each buffer cell (expert, c) from sorted slot starts[expert] + c, if the expert has that many
    cell = starts[:, None] + jnp.arange(capacity)[None, :]
    filled = jnp.arange(capacity)[None, :] < group_sizes[:, None]
    buffers = jnp.where(filled[..., None], sorted_x[jnp.minimum(cell, n_slots - 1)], 0)
    out = experts_swiglu(buffers, weights, None)  # [E, C, D]
    here = sorted_expert < n_experts
    expert = jnp.minimum(sorted_expert, n_experts - 1)
    position = jnp.arange(n_slots) - starts[expert]  # each sorted slot's place in its expert's queue
    kept = here & (position < capacity)
    sorted_y = jnp.where(kept[:, None], out[expert, jnp.clip(position, 0, capacity - 1)], 0)
    return sorted_y, (jnp.sum(group_sizes) - jnp.sum(kept)).astype(jnp.int32)


@dataclass(frozen=True)
class ExpertLayout:
    """How the experts' computation is laid out over the mesh of the step being traced (``model.sharding``'s
    layout): the specs ``shard_map`` gives the tokens and the expert weights, and the mesh axes the body's
    collectives run over. Built from the family's axis rules, so a run's ``train.mesh.rules`` move it too."""

    mesh: Mesh | AbstractMesh
    tokens: PartitionSpec  # x [B, T, D] and the routing [B, T, k]: split over the batch (and length) axes
    weights_in: PartitionSpec  # w_gate, w_up [E, D, F]: experts over the expert axes, F over the mlp axes
    weights_out: PartitionSpec  # w_down [E, F, D]
    token_axes: tuple[str, ...]  # every axis the tokens are split over
    gather_axes: tuple[str, ...]  # expert axes that also split the tokens: gathered in, reduce-scattered out
    expert_axes: tuple[str, ...]  # every axis the experts are split over (the local experts' offset)
    sum_axes: tuple[str, ...]  # axes whose partial outputs are summed: the mlp axes, expert axes not splitting tokens


def expert_layout() -> ExpertLayout | None:
    """The current step's ``ExpertLayout``; None outside a trainer's layout (one device: no collectives)."""
    layout = current_layout()
    if layout is None:
        return None
    mesh, rules = layout
    tokens = logical_to_spec(("batch", "length", None), rules)
    weights_in = logical_to_spec(("expert", None, "mlp"), rules)  # d_model gathered: FSDP's per-layer gather
    token_axes = tuple(a for entry in tokens for a in spec_axes(entry))
    expert_axes, mlp_axes = spec_axes(weights_in[0]), spec_axes(weights_in[2])
    if set(mlp_axes) & set(token_axes):
        raise ConfigError(f"train.mesh.rules: the experts' hidden width ('mlp' on {', '.join(mlp_axes)}) and the "
                          f"batch ({', '.join(token_axes)}) share a mesh axis; an expert's width splits over "
                          "an axis that does not split the tokens (tensor)")
    gather = tuple(a for a in expert_axes if a in token_axes)
    summed = mlp_axes + tuple(a for a in expert_axes if a not in token_axes)
    return ExpertLayout(mesh, tokens, weights_in, logical_to_spec(("expert", "mlp", None), rules), token_axes,
                        gather, expert_axes, summed)


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
        logits = project(tokens.astype(jnp.float32), self.router[...], name="router")
        if cfg.score_func == "softmax":
            scores = jax.nn.softmax(logits, axis=-1)
            probs = scores
        else:
            scores = jax.nn.sigmoid(logits)
            probs = scores / jnp.sum(scores, axis=-1, keepdims=True)  # DeepSeek-V3's normalised s'_i
        # the bias steers which experts are chosen; the weights are the unbiased scores (DeepSeek-V3)
        if self.router_bias is not None:
            choice = scores + jax.lax.stop_gradient(self.router_bias[...].astype(jnp.float32))
        else:
            choice = scores
        if cfg.n_group > 1:
            choice = group_limited(choice, cfg.n_group, cfg.topk_group)
        _, experts = jax.lax.top_k(choice, cfg.top_k)
        weights = jnp.take_along_axis(scores, experts, axis=-1)
        if cfg.norm_topk_prob:
            weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
        return Routing(experts.astype(jnp.int32), weights * cfg.routed_scaling_factor, logits, probs)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, MoEStats]:
        """Routing runs on the global batch (its statistics are global); the experts' computation runs per device
        under ``shard_map`` (``experts_local``), so a device sorts and computes only its own tokens' slots (its
        expert group's, with an expert axis): its memory follows its share of the batch, not the global batch."""
        cfg = self.cfg
        b, t, d = x.shape
        routing = self.route(x.reshape(b * t, d))
        experts, weights = (a.reshape(b, t, cfg.top_k) for a in (routing.experts, routing.weights))
        params = (self.w_gate[...], self.w_up[...], self.w_down[...])
        layout = expert_layout()
        if layout is None:
            y, dropped = self.experts_local(x, experts, weights, *params, layout=None)
        else:
            specs = layout.tokens
            y, dropped = jax.shard_map(
                functools.partial(self.experts_local, layout=layout), mesh=layout.mesh,
                in_specs=(specs, specs, specs, layout.weights_in, layout.weights_in, layout.weights_out),
                out_specs=(specs, PartitionSpec()))(x, experts, weights, *params)
        if self.shared is not None:
            y = y + self.shared(x)
        load = jnp.bincount(routing.experts.reshape(-1), length=cfg.n_experts).astype(jnp.int32)
        return y, MoEStats(self._aux_losses(routing, load), load, dropped, jnp.mean(routing.probs, axis=0))

    def experts_local(self, x: jax.Array, experts: jax.Array, weights: jax.Array, w_gate: jax.Array,
                      w_up: jax.Array, w_down: jax.Array, layout: ExpertLayout | None) -> tuple[jax.Array, jax.Array]:
        """One device's tokens x [b, t, D] through their experts (the weights of this device's experts, [E_l, ...]):
        ``(y [b, t, D], token-slots dropped over the whole batch)``.

        With an expert axis that splits the batch, the expert group's tokens are gathered first (every device of
        the group then holds them all), each device computes the slots routed to its own experts, and the partial
        outputs are summed back to the device that holds each token (a reduce-scatter): the all-gather form of
        expert parallelism (Megatron's allgather dispatcher), whose results are those of one device. A token-slot
        whose expert is elsewhere sorts after the local ones, past the ragged groups: ``ragged_dot`` gives it 0."""
        cfg, k = self.cfg, self.cfg.top_k
        b, t, d = x.shape
        n_local = w_gate.shape[0]
        tokens, slot_expert, slot_weight = x.reshape(b * t, d), experts.reshape(-1), weights.reshape(b * t, k)
        first = 0
        if layout is not None and layout.gather_axes:
            gather = functools.partial(jax.lax.all_gather, axis_name=layout.gather_axes, axis=0, tiled=True)
            tokens, slot_expert, slot_weight = gather(tokens), gather(slot_expert), gather(slot_weight)
        if layout is not None and layout.expert_axes:
            first = jax.lax.axis_index(layout.expert_axes) * n_local
        n = tokens.shape[0]
        local = slot_expert - first
        # token-slots (token i's j-th expert is slot i * k + j) sorted by local expert, the others last; a stable
        # sort keeps each expert's slots in token order, which is the priority capacity routing drops by
        key = jnp.where((local >= 0) & (local < n_local), local, n_local)
        order = jnp.argsort(key, stable=True)
        group_sizes = jnp.bincount(key, length=n_local + 1)[:n_local].astype(jnp.int32)
        sorted_x = tokens[order // k]
        w = (w_gate, w_up, w_down)
        if cfg.routing == "dropless":
            sorted_y = experts_swiglu(sorted_x, w, group_sizes)
            dropped = jnp.zeros((), jnp.int32)
        else:
            capacity = expert_capacity(cfg, n)  # per expert, of the tokens this device (its group) routes
            sorted_y, dropped = experts_with_capacity(sorted_x, key[order], group_sizes, w, capacity)
        inverse = jnp.zeros_like(order).at[order].set(jnp.arange(n * k, dtype=order.dtype))
        slot_y = sorted_y[inverse].reshape(n, k, d)  # back in slot order: a gather, so its gradient is one too
        y = jnp.einsum("nkd,nk->nd", slot_y, slot_weight.astype(slot_y.dtype), preferred_element_type=jnp.float32)
        if layout is not None:
            if layout.sum_axes:
                y = jax.lax.psum(y, layout.sum_axes)
            if layout.gather_axes:
                y = jax.lax.psum_scatter(y, layout.gather_axes, scatter_dimension=0, tiled=True)
            # each device counted the drops of its own experts in its group's slots: summed over the devices that
            # hold other tokens or other experts (not over the mlp axes, whose devices counted the same slots)
            dropped = jax.lax.psum(dropped, tuple(dict.fromkeys(layout.token_axes + layout.expert_axes)))
        return y.astype(x.dtype).reshape(b, t, d), dropped

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
