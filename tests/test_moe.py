"""The MoE layer (model/moe.py) against a per-token reference written here: outputs, gradients, capacity drops,
Qwen3-MoE's and DeepSeek-V3's routing formulas, the auxiliary losses, the aux-loss-free bias, FLOPs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from model.moe import MoE, MoEConfig, RouterBias, moe_flops_per_token, updated_bias

D, E, K, F = 16, 4, 2, 32  # d_model, experts, top_k, d_expert
B, T = 2, 8
N = B * T
QWEN3 = {"score_func": "softmax", "norm_topk_prob": True}
QWEN15 = {"score_func": "softmax", "norm_topk_prob": False}
DEEPSEEK = {"score_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_shared_experts": 1,
            "aux_free_bias": True}


def build(d_model: int = D, **overrides: object) -> MoE:
    cfg = MoEConfig(**{"n_experts": E, "top_k": K, "d_expert": F, **overrides})
    with nnx.use_eager_sharding(False):
        return MoE(d_model, cfg, n_layers=2, init_std=0.3, rngs=nnx.Rngs(0))


def inputs(seed: int = 1) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (B, T, D), jnp.float32)


def weights_of(moe: MoE) -> dict[str, jax.Array]:
    p = {name: getattr(moe, name)[...] for name in ("router", "w_gate", "w_up", "w_down")}
    if moe.shared is not None:
        p |= {"s_gate": moe.shared.w_gate[...], "s_up": moe.shared.w_up[...], "s_down": moe.shared.w_down[...]}
    return p


def np_scores(p: dict[str, jax.Array], x: jax.Array, cfg: MoEConfig) -> np.ndarray:
    logits = np.asarray(x, np.float64).reshape(-1, x.shape[-1]) @ np.asarray(p["router"], np.float64)
    if cfg.score_func == "softmax":
        return np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return 1 / (1 + np.exp(-logits))


def choose(p: dict[str, jax.Array], x: jax.Array, cfg: MoEConfig, bias: np.ndarray | None = None) -> np.ndarray:
    """Each token's top_k experts [N, k], best first, by scores (+ the selection bias) in numpy."""
    scores = np_scores(p, x, cfg) + (0 if bias is None else bias)
    return np.argsort(-scores, axis=-1, kind="stable")[:, :cfg.top_k]


def swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    return (jax.nn.silu(x @ gate) * (x @ up)) @ down


def reference(p: dict[str, jax.Array], x: jax.Array, cfg: MoEConfig, chosen: np.ndarray,
              kept: np.ndarray | None = None) -> jax.Array:
    """The layer token by token, in the formulas of Hugging Face's modeling files:
    Qwen3MoeSparseMoeBlock: w = softmax(logits); w, idx = topk(w); if norm_topk_prob: w /= w.sum(-1).
    DeepseekV3TopkRouter: s = sigmoid(logits); idx = topk(s + e_score_correction_bias); w = s.gather(idx);
    if norm_topk_prob: w /= w.sum(-1) + 1e-20; w *= routed_scaling_factor. DeepseekV3MoE adds shared_experts(x).
    ``kept`` [N, k]: False where capacity routing dropped the slot (it adds nothing)."""
    tokens = x.reshape(-1, x.shape[-1])
    logits = tokens @ p["router"]
    scores = jax.nn.softmax(logits, axis=-1) if cfg.score_func == "softmax" else jax.nn.sigmoid(logits)
    rows = []
    for n in range(tokens.shape[0]):
        w = scores[n, chosen[n]]
        w = (w / w.sum() if cfg.norm_topk_prob else w) * cfg.routed_scaling_factor
        y = jnp.zeros(tokens.shape[1])
        for j, e in enumerate(chosen[n]):
            if kept is None or kept[n, j]:
                y = y + w[j] * swiglu(tokens[n], p["w_gate"][e], p["w_up"][e], p["w_down"][e])
        if "s_gate" in p:
            y = y + swiglu(tokens[n], p["s_gate"], p["s_up"], p["s_down"])
        rows.append(y)
    return jnp.stack(rows).reshape(x.shape)


def kept_by_capacity(chosen: np.ndarray, capacity: int) -> np.ndarray:
    """The capacity rule by hand: each expert keeps its first ``capacity`` slots in token order."""
    taken = np.zeros(E, int)
    kept = np.zeros(chosen.shape, bool)
    for n in range(chosen.shape[0]):
        for j, e in enumerate(chosen[n]):
            kept[n, j] = taken[e] < capacity
            taken[e] += 1
    return kept


def skew(moe: MoE, x: jax.Array) -> jax.Array:
    """Every token's first choice expert 0, second expert 1 (logits about 15 and 10 against about 0)."""
    router = 0.01 * np.array(jax.random.normal(jax.random.key(7), (D, E)))
    router[0, 0], router[0, 1] = 3.0, 2.0
    moe.router[...] = jnp.asarray(router, jnp.float32)
    return x.at[..., 0].set(5.0)


@pytest.mark.parametrize("routing", [QWEN3, QWEN15, DEEPSEEK], ids=["qwen3", "qwen1.5", "deepseek_v3"])
def test_dropless_matches_the_per_token_reference(routing: dict[str, object]) -> None:
    moe, x = build(**routing), inputs()
    if moe.router_bias is not None:
        moe.router_bias[...] = jnp.asarray([0.3, -0.2, 0.1, 0.0])
    p = weights_of(moe)
    bias = None if moe.router_bias is None else np.asarray(moe.router_bias[...])
    chosen = choose(p, x, moe.cfg, bias)
    y, stats = moe(x)
    np.testing.assert_allclose(y, reference(p, x, moe.cfg, chosen), atol=1e-5, rtol=1e-5)
    routing_out = moe.route(x.reshape(N, D))
    np.testing.assert_array_equal(np.sort(routing_out.experts, -1), np.sort(chosen, -1))
    np.testing.assert_array_equal(stats.expert_load, np.bincount(chosen.ravel(), minlength=E))
    assert int(stats.dropped) == 0


def test_gradients_reach_router_and_experts_and_match_the_reference() -> None:
    moe, x = build(), inputs()
    cotangent = jax.random.normal(jax.random.key(3), x.shape)
    graphdef, params, rest = nnx.split(moe, nnx.Param, ...)

    def loss(params: nnx.State) -> jax.Array:
        return jnp.sum(nnx.merge(graphdef, params, rest)(x)[0] * cotangent)

    grads = nnx.to_pure_dict(jax.grad(loss)(params))
    p = weights_of(moe)
    chosen = choose(p, x, moe.cfg)
    expected = jax.grad(lambda q: jnp.sum(reference(q, x, moe.cfg, chosen) * cotangent))(p)
    for name in ("router", "w_gate", "w_up", "w_down"):
        got = np.asarray(grads[name])
        assert np.isfinite(got).all() and np.abs(got).sum() > 0, name
        np.testing.assert_allclose(got, expected[name], atol=1e-4, rtol=1e-4, err_msg=name)


def test_dropless_drops_nothing_on_a_skewed_router() -> None:
    moe = build()
    x = skew(moe, inputs())
    y, stats = moe(x)
    assert int(stats.dropped) == 0
    np.testing.assert_array_equal(stats.expert_load, [N, N, 0, 0])
    assert int(stats.expert_load.sum()) == B * T * K
    chosen = np.tile([0, 1], (N, 1))
    np.testing.assert_allclose(y, reference(weights_of(moe), x, moe.cfg, chosen), atol=1e-5, rtol=1e-5)


def test_capacity_drops_the_slots_past_each_experts_capacity() -> None:
    moe = build(routing="capacity", capacity_factor=0.5)  # ceil(0.5 * 16 tokens * 2 / 4 experts) = 4 slots each
    x = skew(moe, inputs())
    y, stats = moe(x)
    # experts 0 and 1 are each chosen by all 16 tokens and keep tokens 0-3: 2 * (16 - 4) slots dropped
    assert int(stats.dropped) == 24
    np.testing.assert_array_equal(stats.expert_load, [N, N, 0, 0])
    chosen = np.tile([0, 1], (N, 1))
    kept = np.arange(N)[:, None].repeat(2, 1) < 4
    np.testing.assert_array_equal(kept, kept_by_capacity(chosen, 4))
    np.testing.assert_allclose(y, reference(weights_of(moe), x, moe.cfg, chosen, kept), atol=1e-5, rtol=1e-5)
    assert np.all(np.asarray(y).reshape(N, D)[4:] == 0)  # no shared expert: a token with no slot left gets 0


@pytest.mark.parametrize("factor", [0.5, 0.75, 2.0])
def test_capacity_on_a_random_router_matches_the_rule(factor: float) -> None:
    moe, x = build(routing="capacity", capacity_factor=factor), inputs()
    p = weights_of(moe)
    chosen = choose(p, x, moe.cfg)
    capacity = math.ceil(factor * N * K / E)
    kept = kept_by_capacity(chosen, capacity)
    y, stats = moe(x)
    assert int(stats.dropped) == (~kept).sum() == sum(max(0, c - capacity) for c in np.bincount(chosen.ravel()))
    np.testing.assert_allclose(y, reference(p, x, moe.cfg, chosen, kept), atol=1e-5, rtol=1e-5)
    if factor == 2.0:  # capacity N: nothing can drop
        assert int(stats.dropped) == 0


@pytest.mark.parametrize("routing", [QWEN3, QWEN15, DEEPSEEK], ids=["qwen3", "qwen1.5", "deepseek_v3"])
def test_combine_weights_follow_the_hugging_face_formulas(routing: dict[str, object]) -> None:
    moe, x = build(**routing), inputs()
    p, cfg = weights_of(moe), moe.cfg
    out = moe.route(x.reshape(N, D))
    scores = np_scores(p, x, cfg)
    chosen = np.asarray(out.experts)
    np.testing.assert_array_equal(chosen, choose(p, x, cfg))  # best first
    w = np.take_along_axis(scores, chosen, -1)
    if cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
    np.testing.assert_allclose(out.weights, w * cfg.routed_scaling_factor, rtol=1e-5)
    total = np.asarray(out.weights).sum(-1)
    if cfg.norm_topk_prob:
        np.testing.assert_allclose(total, cfg.routed_scaling_factor, rtol=1e-5)
    else:
        assert np.all(total < 1)  # Qwen1.5-MoE style: the chosen softmax mass, not renormalised


def test_load_balance_and_z_loss_on_a_hand_example() -> None:
    moe = build(d_model=2, n_experts=2, top_k=1, load_balance_loss_weight=0.1, router_z_loss_weight=0.01)
    moe.router[...] = jnp.asarray([[2.0, 0.0], [1.0, 0.0]])
    x = jnp.asarray([[[1.0, 0.0], [0.0, 1.0]]])  # logits: token 0 [2, 0], token 1 [1, 0]: both choose expert 0
    _, stats = moe(x)
    sigmoid_2, sigmoid_1 = 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(-1))  # softmax([a, 0])[0] = sigmoid(a)
    # f = [1, 0], P_0 = (sigmoid(2) + sigmoid(1)) / 2: the loss is 2 experts * f_0 * P_0
    assert float(stats.aux_losses["load_balance"]) == pytest.approx(0.1 * (sigmoid_2 + sigmoid_1), rel=1e-6)
    z = (math.log(math.exp(2) + 1) ** 2 + math.log(math.exp(1) + 1) ** 2) / 2
    assert float(stats.aux_losses["router_z"]) == pytest.approx(0.01 * z, rel=1e-6)


@pytest.mark.parametrize("routing", [QWEN3, DEEPSEEK], ids=["softmax", "sigmoid"])
def test_load_balance_loss_definition_and_its_uniform_value(routing: dict[str, object]) -> None:
    moe, x = build(**routing, load_balance_loss_weight=0.5, router_z_loss_weight=0.2), inputs()
    p = weights_of(moe)
    _, stats = moe(x)
    scores = np_scores(p, x, moe.cfg)
    probs = scores / scores.sum(-1, keepdims=True)  # sigmoid scores as a distribution (DeepSeek-V3's s')
    fraction = np.bincount(choose(p, x, moe.cfg).ravel(), minlength=E) / (N * K)
    balance = E * np.sum(fraction * probs.mean(0))
    assert float(stats.aux_losses["load_balance"]) == pytest.approx(0.5 * balance, rel=1e-5)
    logits = np.asarray(x, np.float64).reshape(N, D) @ np.asarray(p["router"], np.float64)
    z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    assert float(stats.aux_losses["router_z"]) == pytest.approx(0.2 * z, rel=1e-5)
    moe.router[...] = jnp.zeros((D, E))  # a uniform router: P_e = 1 / E whatever the choice, the minimum 1
    _, stats = moe(x)
    assert float(stats.aux_losses["load_balance"]) == pytest.approx(0.5, rel=1e-6)
    assert float(stats.aux_losses["router_z"]) == pytest.approx(0.2 * math.log(E) ** 2, rel=1e-6)


def test_aux_free_bias_steers_selection_not_weights() -> None:
    moe, x = build(**DEEPSEEK), inputs()
    tokens = x.reshape(N, D)
    p, cfg = weights_of(moe), moe.cfg
    before = np.asarray(moe.route(tokens).experts)
    assert not (before == 3).any(-1).all()
    moe.router_bias[...] = jnp.asarray([0.0, 0.0, 0.0, 10.0])
    after = moe.route(tokens)
    assert (np.asarray(after.experts) == 3).any(-1).all()  # sigmoid scores < 1: a bias of 10 wins every token
    # the weights are the unbiased scores of the chosen experts, renormalised and scaled
    w = np.take_along_axis(np_scores(p, x, cfg), np.asarray(after.experts), -1)
    np.testing.assert_allclose(after.weights, w / w.sum(-1, keepdims=True) * 2.5, rtol=1e-5)
    y, stats = moe(x)
    chosen = choose(p, x, cfg, np.asarray([0.0, 0.0, 0.0, 10.0]))
    np.testing.assert_allclose(y, reference(p, x, cfg, chosen), atol=1e-5, rtol=1e-5)
    assert int(stats.expert_load[3]) == N  # overloaded: the mean is N * K / E = 8
    new = np.asarray(updated_bias(moe.router_bias[...], stats.expert_load, 0.01))
    assert new[3] == pytest.approx(10.0 - 0.01)
    np.testing.assert_allclose(updated_bias(jnp.zeros(4), jnp.asarray([10, 2, 2, 2]), 0.1), [-0.1, 0.1, 0.1, 0.1])
    np.testing.assert_array_equal(updated_bias(jnp.ones(4), jnp.asarray([4, 4, 4, 4]), 0.1), np.ones(4))


def test_router_bias_is_a_parameter_no_gradient_reaches_and_axes_are_named() -> None:
    moe = build(**DEEPSEEK)
    assert "router_bias" in nnx.to_pure_dict(nnx.state(moe, nnx.Param))  # checkpointed, imported, exported
    assert list(nnx.to_pure_dict(nnx.state(moe, RouterBias))) == ["router_bias"]
    moe.router_bias[...] = jnp.asarray([0.3, -0.2, 0.1, 0.0])
    graphdef, params = nnx.split(moe, nnx.Param)
    grads = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p)(inputs())[0] ** 2))(params)
    assert not np.any(np.asarray(grads["router_bias"][...]))  # the optimizer never moves it
    assert np.any(np.asarray(grads["router"][...]))
    axes = {name: getattr(moe, name).get_metadata()["out_sharding"]
            for name in ("router", "w_gate", "w_up", "w_down", "router_bias")}
    assert axes == {"router": ("embed", "expert"), "w_gate": ("expert", "embed", "mlp"),
                    "w_up": ("expert", "embed", "mlp"), "w_down": ("expert", "mlp", "embed"),
                    "router_bias": ("expert",)}
    assert build().router_bias is None


@pytest.mark.parametrize("routing", ["dropless", "capacity"])
def test_jit_gives_the_eager_result(routing: str) -> None:
    moe, x = build(routing=routing, capacity_factor=0.75), inputs()
    y, stats = moe(x)
    y_jit, stats_jit = nnx.jit(lambda m, v: m(v))(moe, x)
    np.testing.assert_allclose(y_jit, y, atol=1e-6, rtol=1e-6)
    np.testing.assert_array_equal(stats_jit.expert_load, stats.expert_load)
    assert int(stats_jit.dropped) == int(stats.dropped)


def test_shared_experts_add_a_dense_swiglu() -> None:
    moe, x = build(n_shared_experts=2), inputs()
    assert moe.shared.w_gate[...].shape == (D, 2 * F)
    p = weights_of(moe)
    y, _ = moe(x)
    np.testing.assert_allclose(y, reference(p, x, moe.cfg, choose(p, x, moe.cfg)), atol=1e-5, rtol=1e-5)
    moe.w_down[...] = jnp.zeros_like(moe.w_down[...])  # routed experts silenced: what is left is the shared path
    y, _ = moe(x)
    xs = np.asarray(x, np.float64)
    gate, up = xs @ np.asarray(p["s_gate"]), xs @ np.asarray(p["s_up"])
    dense = (gate / (1 + np.exp(-gate)) * up) @ np.asarray(p["s_down"])
    np.testing.assert_allclose(y, dense, atol=1e-5, rtol=1e-5)


def test_flops_per_token_by_hand() -> None:
    # d_model 4, d_expert 3, top_k 2, 1 shared, 8 experts: router 4 * 8 = 32 multiply-adds; each of the 2 + 1
    # active experts gate 4 * 3 + up 4 * 3 + down 3 * 4 = 36; (32 + 3 * 36) * 2 FLOPs
    assert moe_flops_per_token(4, 3, 2, 1, 8) == 280


def test_config_rejects_impossible_routing() -> None:
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(n_experts=4, top_k=5)
    with pytest.raises(ValueError, match="capacity_factor"):
        MoEConfig(capacity_factor=0)


def test_group_limited_routing_picks_inside_each_tokens_best_groups() -> None:
    """DeepSeek-V3's node-limited routing: 8 experts in 4 groups of 2, each token's top 2 chosen among the experts
    of its 2 best groups (a group's score: its two best experts' biased scores summed), written out per token in
    numpy; with one group the same router is plain top-k."""
    cfg_fields = {**DEEPSEEK, "n_experts": 8, "n_group": 4, "topk_group": 2}
    moe = build(**cfg_fields)
    bias = np.linspace(-0.3, 0.3, 8).astype(np.float32)
    moe.router_bias[...] = jnp.asarray(bias)
    x = inputs(7)
    scores = np_scores(weights_of(moe), x, moe.cfg) + bias
    want = []
    for row in scores:
        groups = row.reshape(4, 2)
        best_groups = np.argsort(-groups.sum(-1))[:2]  # two experts per group: the top-2 sum is the group's sum
        allowed = np.concatenate([np.arange(2 * g, 2 * g + 2) for g in best_groups])
        want.append(sorted(allowed[np.argsort(-row[allowed])[:2]].tolist()))
    got = np.sort(np.asarray(moe.route(x.reshape(N, D)).experts), axis=-1).tolist()
    assert got == want
    plain = build(**{**cfg_fields, "n_group": 1, "topk_group": 1})
    plain.router[...], plain.router_bias[...] = moe.router[...], moe.router_bias[...]
    ungrouped = np.sort(np.argsort(-scores, axis=-1)[:, :2], axis=-1).tolist()
    assert np.sort(np.asarray(plain.route(x.reshape(N, D)).experts), axis=-1).tolist() == ungrouped
    assert got != ungrouped  # the groups changed some token's choice: the limit is not vacuous here
    for bad, message in (({"n_group": 3}, "must divide"), ({"n_group": 8}, "2 experts or more"),
                         ({"n_group": 4, "topk_group": 5}, "between 1 and n_group"),
                         ({"n_group": 4, "topk_group": 1, "top_k": 3}, "at most the topk_group")):
        with pytest.raises(ValueError, match=message):
            MoEConfig(**{**cfg_fields, **bad})
