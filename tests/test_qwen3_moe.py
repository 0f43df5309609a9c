"""The qwen3_moe family (model/qwen3_moe/): config load, the two layer layouts with the router statistics carried out
of the scan, the auxiliary losses against Transformers' formula, dropless and capacity routing, FLOPs by active
parameters, the parameter count, KV-cache generation, the Hugging Face round trip (numpy and safetensors only) and
training.

The tiny preset throughout (2 layers, d_model 64, 4 heads / 2 KV heads of 16, 4 experts of 32, top 2, untied), its
parameters moved by N(0, 0.2) where the numbers are compared (tests/tiny_models.py's ``perturb``), so that the router
is far from uniform and the q/k norms' scales count.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiment.config import load_config
from experiment.errors import ConfigError, DataError
from model.family import AuxLossModel, CachedDecoding, FamilyModel
from model.qwen3_moe import flops
from model.qwen3_moe.config import PRESETS, Qwen3MoeConfig
from model.registry import family_of, get_family
from model.stacking import path_keys, stack_tree, unrolled_pure
from tests.tiny_models import perturb

VOCAB, SEQ, BATCH = 97, 16, 2
QWEN3_MOE = get_family("qwen3_moe")
CFG = dataclasses.replace(Qwen3MoeConfig(), **PRESETS["tiny"], router_aux_loss_coef=0.01, router_z_loss_coef=0.001)


def tokens(seed: int = 0, batch: int = BATCH, length: int = SEQ) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, (batch, length)), jnp.int32)


def flat_params(model: nnx.Module) -> dict[str, np.ndarray]:
    """Parameters by unrolled path (``blocks/<i>/...``), whichever layout the model has."""
    pure = unrolled_pure(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    return {"/".join(map(str, path_keys(p))): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(pure)[0]}


def pair(cfg: Qwen3MoeConfig = CFG, seed: int = 3) -> tuple[nnx.Module, nnx.Module]:
    """(unrolled, scanned) with the same perturbed parameters (tests/tiny_models.py's ``tiny_pair``, for ``cfg``)."""
    unrolled = QWEN3_MOE.init(dataclasses.replace(cfg, scan_layers=False), VOCAB, seed=seed)
    perturb(unrolled, seed)
    graphdef, like = nnx.split(QWEN3_MOE.abstract(dataclasses.replace(cfg, scan_layers=True), VOCAB), nnx.Param)
    return unrolled, nnx.merge(graphdef, stack_tree(nnx.state(unrolled, nnx.Param), like, QWEN3_MOE.roles.layers))


@pytest.fixture(scope="module")
def layouts() -> tuple[nnx.Module, nnx.Module]:
    return pair()


def test_config_load_with_the_tiny_preset(tmp_path: Path) -> None:
    config = tmp_path / "moe.yaml"
    config.write_text("experiment: {name: moe}\nmodel: {family: qwen3_moe, preset: tiny}\n", encoding="utf-8")
    cfg = load_config(config)
    model = cfg.model
    assert isinstance(model, Qwen3MoeConfig) and family_of(model) is QWEN3_MOE
    assert (model.d_model, model.n_layers, model.n_heads, model.n_kv_heads, model.head_dim, model.n_experts,
            model.top_k, model.d_expert) == (64, 2, 4, 2, 16, 4, 2, 32)
    assert (model.norm_topk_prob, model.tie_embeddings, model.routing, model.router_aux_loss_coef) == \
        (True, False, "dropless", 0.001)
    # the family's own mesh axis: added at 1 (not split) when the config does not size it; the batch is split over it
    assert cfg.train.mesh.axes == {"expert": 1}
    rules = QWEN3_MOE.mesh_rules(cfg.train.mesh.rules)
    assert rules["expert"] == ["expert"] and rules["batch"] == ["data", "fsdp", "expert"]
    sized = load_config(config, ["train.mesh.axes={\"expert\": 2}", "model.preset=30b-a3b", "model.max_seq_len=128"])
    assert sized.train.mesh.axes == {"expert": 2} and sized.model.max_seq_len == 128
    big = sized.model
    assert (big.d_model, big.n_layers, big.n_heads, big.n_kv_heads, big.head_dim, big.n_experts, big.top_k,
            big.d_expert) == (2048, 48, 32, 4, 128, 128, 8, 768)
    huge = load_config(config, ["model.preset=235b-a22b"]).model
    assert (huge.d_model, huge.n_layers, huge.n_heads, huge.n_kv_heads, huge.head_dim, huge.n_experts, huge.top_k,
            huge.d_expert) == (4096, 94, 64, 4, 128, 128, 8, 1536)
    # the published totals: 30.5B (3.3B active), 235B (22B active; 234B without the embeddings)
    assert flops.param_count(big, 151_936) == pytest.approx(30.5e9, rel=2e-3)
    assert flops.active_param_count(big, 151_936) == pytest.approx(3.35e9, rel=5e-3)
    assert flops.param_count(huge, 0) == pytest.approx(234e9, rel=2e-3)
    assert flops.active_param_count(huge, 151_936) == pytest.approx(22.2e9, rel=5e-3)


@pytest.mark.parametrize(("override", "message"), [
    ("model.top_k=5", "config key 'model.top_k': 5 is more than n_experts=4"),
    ("model.n_kv_heads=3", "config key 'model.n_kv_heads': 3 does not divide n_heads=4"),
    ("model.routing=topk", "config key 'model.routing'"),
    ("model.capacity_factor=0", "config key 'model.capacity_factor': must be positive"),
    ("model.router_aux_loss_coef=-1", "config key 'model.router_aux_loss_coef': must be >= 0"),
    ("model.mlp_only_layers=[0]", "unknown config key 'model.mlp_only_layers'"),  # dense layers are not built
])
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, override: str, message: str) -> None:
    config = tmp_path / "moe.yaml"
    config.write_text("experiment: {name: moe}\nmodel: {family: qwen3_moe, preset: tiny}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        load_config(config, [override])
    assert "\n" not in str(caught.value)


def test_scanned_and_unrolled_give_the_same_logits_statistics_and_gradients(layouts: Any) -> None:
    unrolled, scanned = layouts
    assert isinstance(scanned, FamilyModel) and isinstance(scanned, AuxLossModel)
    assert isinstance(scanned, CachedDecoding)
    # the scanned layout in remat (full) with one layer per scan iteration: a real loop, checkpointed per layer
    graphdef, state = nnx.split(scanned)
    remat_cfg = dataclasses.replace(CFG, remat="full", scan_unroll=1)
    looped = nnx.merge(nnx.graphdef(QWEN3_MOE.abstract(remat_cfg, VOCAB)), state)
    batch = tokens()
    targets = jnp.roll(batch, -1, axis=1)

    def loss(model: nnx.Module) -> tuple[jax.Array, Any]:
        hidden, stats = model.hidden_with_stats(batch)
        logits = jnp.einsum("btd,dv->btv", hidden, model.output_weight())
        aux = model.aux_losses(stats)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1).mean()
        return nll + sum(aux.values()), (logits, stats, aux)

    out = {}
    for name, model in (("unrolled", unrolled), ("scanned", scanned), ("looped", looped)):
        (total, (logits, stats, aux)), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
        out[name] = (total, logits, stats, aux, flat_params(nnx.merge(nnx.graphdef(model), grads)))
    want = out["unrolled"]
    assert np.abs(np.asarray(want[1])).max() > 1  # logits that vary: a difference cannot hide
    assert want[2].expert_load.shape == (2, 4) and want[2].router_probs.shape == (2, 4)
    for name in ("scanned", "looped"):
        got = out[name]
        np.testing.assert_allclose(got[1], want[1], atol=1e-5, rtol=1e-5, err_msg=name)
        np.testing.assert_array_equal(got[2].expert_load, want[2].expert_load, err_msg=name)  # same routing
        for a, b in zip(got[2][1:], want[2][1:], strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5, err_msg=name)
        for key in ("load_balance", "router_z"):
            np.testing.assert_allclose(got[3][key], want[3][key], rtol=1e-5, err_msg=f"{name} {key}")
        assert got[4].keys() == want[4].keys()
        for param in want[4]:
            np.testing.assert_allclose(got[4][param], want[4][param], atol=2e-5, rtol=1e-4, err_msg=f"{name} {param}")
    # the router's gradient includes the load-balancing and z-loss terms
    assert np.abs(want[4]["blocks/0/mlp/router"]).max() > 0


def hf_load_balancing_loss(router_logits: list[np.ndarray], n_experts: int, top_k: int) -> float:
    """Transformers' ``load_balancing_loss_func`` (models/qwen3_moe/modeling_qwen3_moe.py, no attention mask) in numpy:
    per layer, the softmax of the logits, its top_k experts counted per expert and its probabilities summed per
    expert; both divided by every layer's tokens; n_experts x sum over experts of their product."""
    counts, probs, rows = np.zeros(n_experts), np.zeros(n_experts), 0
    for logits in router_logits:
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        chosen = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
        counts += np.bincount(chosen.ravel(), minlength=n_experts)
        probs += p.sum(0)
        rows += logits.shape[0]
    return float(n_experts * np.sum((counts / rows) * (probs / rows)))


def router_logits_by_hand(model: nnx.Module, batch: jax.Array) -> list[np.ndarray]:
    """Each layer's router logits [B T, E] of an unrolled model, its layers run one by one here."""
    from model.layers import default_positions, rope_angles

    rope = rope_angles(default_positions(batch, None), model.head_dim, model.rope)
    x = jnp.take(model.embed[...], batch, axis=0)
    logits = []
    for block in model.blocks:
        x = x + block.attn(block.attn_norm(x), rope, None)
        h = block.mlp_norm(x)
        logits.append(np.asarray(h.reshape(-1, h.shape[-1]) @ block.mlp.router[...], np.float64))
        x = x + block.mlp(h)[0]
    return logits


def test_aux_losses_are_transformers_load_balance_and_the_z_loss(layouts: Any) -> None:
    unrolled, scanned = layouts
    batch = tokens(1)
    hidden, aux = nnx.jit(lambda m, t: m.hidden_with_aux(t))(scanned, batch)
    assert QWEN3_MOE.aux_losses == ("load_balance", "router_z")
    assert set(aux) == {"load_balance", "router_z", "router/dropped_fraction", "router/load_max",
                        "router/load_max_layer_00", "router/load_max_layer_01"}
    assert all(np.isfinite(float(v)) and float(v) > 0 for v in aux.values() if v is not aux["router/dropped_fraction"])
    np.testing.assert_allclose(hidden, nnx.jit(lambda m, t: m.hidden(t))(scanned, batch), atol=1e-6)
    logits = router_logits_by_hand(unrolled, batch)
    # each layer's busiest expert over the mean per expert, from the top-k choices of the logits by hand
    for i, layer_logits in enumerate(logits):
        counts = np.bincount(np.argsort(-layer_logits, axis=-1)[:, :CFG.top_k].ravel(), minlength=CFG.n_experts)
        np.testing.assert_allclose(float(aux[f"router/load_max_layer_{i:02d}"]),
                                   CFG.n_experts * counts.max() / counts.sum(), rtol=1e-6)
    assert float(aux["router/dropped_fraction"]) == 0.0
    want = CFG.router_aux_loss_coef * hf_load_balancing_loss(logits, CFG.n_experts, CFG.top_k)
    np.testing.assert_allclose(float(aux["load_balance"]), want, rtol=1e-5)
    lse = [np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1) for lg in logits]
    np.testing.assert_allclose(float(aux["router_z"]), CFG.router_z_loss_coef * np.mean([np.mean(z ** 2) for z in lse]),
                               rtol=1e-5)
    # model/moe.py's Switch loss of one layer is 1 / top_k of Transformers' (whose fractions divide by the tokens)
    from model.moe import MoE

    block = unrolled.blocks[0]
    h = jax.random.normal(jax.random.key(0), (2, 8, CFG.d_model))
    with nnx.use_eager_sharding(False):
        single = MoE(CFG.d_model, dataclasses.replace(block.mlp.cfg, load_balance_loss_weight=1.0), 2, 0.02,
                     nnx.Rngs(0))
    single.router[...] = block.mlp.router[...]
    _, stats = single(h)
    theirs = hf_load_balancing_loss([np.asarray(h.reshape(16, -1) @ block.mlp.router[...], np.float64)], 4, 2)
    np.testing.assert_allclose(CFG.top_k * float(stats.aux_losses["load_balance"]), theirs, rtol=1e-5)


def test_dropless_drops_nothing_and_capacity_drops_past_each_experts_capacity(layouts: Any) -> None:
    unrolled, scanned = layouts
    batch = tokens(2, batch=4)
    n_slots = batch.size * CFG.top_k
    _, stats = nnx.jit(lambda m, t: m.hidden_with_stats(t))(scanned, batch)
    assert stats.dropped.tolist() == [0, 0]
    assert np.asarray(stats.expert_load).sum(axis=1).tolist() == [n_slots, n_slots]
    full = np.asarray(nnx.jit(lambda m, t: m(t))(scanned, batch))

    state = nnx.state(scanned)
    capacity = {}
    for factor in (0.5, CFG.n_experts / CFG.top_k):  # half the slots; every expert N slots (nothing can drop)
        cfg = dataclasses.replace(CFG, routing="capacity", capacity_factor=factor)
        model = nnx.merge(nnx.graphdef(QWEN3_MOE.abstract(cfg, VOCAB)), state)
        logits, (_, layer_stats), aux = nnx.jit(
            lambda m, t: (m(t), m.hidden_with_stats(t), m.hidden_with_aux(t)[1]))(model, batch)
        assert all(np.isfinite(float(v)) for v in aux.values())
        capacity[factor] = (np.asarray(logits), np.asarray(layer_stats.dropped), np.asarray(layer_stats.expert_load))
    logits, dropped, load = capacity[0.5]
    # ceil(0.5 * 64 tokens * 2 / 4) = 16 slots per expert: each layer drops what its experts got past 16
    np.testing.assert_array_equal(dropped, np.maximum(load - 16, 0).sum(axis=1))
    assert dropped.sum() > 0 and np.abs(logits - full).max() > 1e-3
    logits, dropped, _ = capacity[CFG.n_experts / CFG.top_k]
    assert dropped.tolist() == [0, 0]
    np.testing.assert_allclose(logits, full, atol=1e-5, rtol=1e-5)


def test_flops_by_active_parameters_and_the_parameter_count_by_hand() -> None:
    d, h, kv, hd, e, k, f, n = 64, 4, 2, 16, 4, 2, 32, 2
    attention = d * h * hd + 2 * d * kv * hd + h * hd * d  # q, k, v, o: 12288
    assert flops.attention_params(CFG) == attention == 12288
    per_layer = attention + 2 * hd + 2 * d + d * e + 3 * e * d * f
    assert flops.param_count(CFG, VOCAB) == n * per_layer + 2 * VOCAB * d + d
    assert flops.param_count(dataclasses.replace(CFG, tie_embeddings=True), VOCAB) == n * per_layer + VOCAB * d + d
    assert flops.active_param_count(CFG, VOCAB) == flops.param_count(CFG, VOCAB) - n * 3 * (e - k) * d * f
    for cfg in (CFG, dataclasses.replace(CFG, tie_embeddings=True)):  # against the built model
        built = sum(x.size for x in jax.tree.leaves(nnx.state(QWEN3_MOE.abstract(cfg, VOCAB), nnx.Param)))
        assert built == QWEN3_MOE.param_count(cfg, VOCAB)

    # per token: router (D x E) and top_k of the experts' 3 D F, attention projections and scores, the head
    router_and_experts = 2 * (d * e + 3 * d * f * k)  # 25088
    scores = 4 * SEQ * h * hd  # QK^T and PV, full T x T
    forward = n * (2 * attention + router_and_experts + scores) + 2 * d * VOCAB
    assert QWEN3_MOE.flops(CFG, VOCAB, SEQ) == 3 * forward
    costs = QWEN3_MOE.train_costs(dataclasses.replace(CFG, remat="save_dots"), VOCAB, SEQ, "cpu", "float32", 8)
    # save_dots recomputes attention's scores and the experts (ragged dots: not saved), the chunked loss the head
    experts = n * 2 * 3 * d * f * k
    assert costs.model_flops == 3 * forward
    assert costs.hardware_flops == 3 * forward + n * scores + experts + 2 * d * VOCAB
    full = dataclasses.replace(CFG, remat="full")
    assert flops.recompute_flops(full, VOCAB, SEQ, "dot_product") == forward - 2 * d * VOCAB
    assert flops.recompute_flops(CFG, VOCAB, SEQ, "dot_product") == 0
    # activations kept per token, per layer: residuals and norms (4 D), q and o (2 H hd), k and v (2 KV hd), the router
    # logits (E), each chosen expert's input and output rows (2 D) and gate, up and product (3 F)
    every = 4 * d + 2 * h * hd + 2 * kv * hd + e + k * (2 * d + 3 * f)
    assert QWEN3_MOE.saved_values(CFG, "none") == n * every
    assert QWEN3_MOE.saved_values(CFG, "save_dots") == n * (2 * d + h * hd + 2 * kv * hd + e)  # no expert output kept
    assert QWEN3_MOE.saved_values(CFG, "full") == n * d + every


@pytest.mark.parametrize("scan_layers", [True, False])
def test_kv_cache_generation_equals_greedy_full_forward_decoding(layouts: Any, scan_layers: bool) -> None:
    from model.generate import generate
    from model.kv_cache import cached_logits

    model = layouts[1 if scan_layers else 0]
    new = 8
    forward = nnx.jit(lambda m, t: m(t))
    rng = np.random.default_rng(5)
    # the cached prefill and 8 single-token steps give the full forward pass's logits
    row = rng.integers(1, VOCAB, size=(1, 12 + new)).astype(np.int32)
    full = np.asarray(forward(model, jnp.asarray(row)))
    np.testing.assert_allclose(np.asarray(cached_logits(model, row, 12)[0]), full, atol=1e-5, rtol=0)

    # greedy generation of prompts of different lengths = greedy decoding by full forward passes
    prompts = [rng.integers(1, VOCAB, size=m).tolist() for m in (3, 9, 6)]
    generated = generate(model, prompts, new)
    assert generated.finished == ["length"] * 3
    rows = np.zeros((3, 9 + new), np.int32)
    for r, ids in enumerate(prompts):
        rows[r, :len(ids)] = ids
    for step in range(new):
        logits = np.asarray(forward(model, jnp.asarray(rows)))
        for r, ids in enumerate(prompts):
            rows[r, len(ids) + step] = int(np.argmax(logits[r, len(ids) + step - 1]))
    assert generated.tokens == [rows[r, len(ids):len(ids) + new].tolist() for r, ids in enumerate(prompts)]


def write_folder(folder: Path, tensors: dict[str, np.ndarray], config: dict[str, Any]) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_hf_export_then_import_gives_identical_tensors(layouts: Any, tmp_path: Path) -> None:
    from model.hf_checkpoint import hf_model_config, load_hf_checkpoint

    unrolled, scanned = layouts
    adapter = QWEN3_MOE.hf_adapter
    assert adapter is not None and adapter.model_type == "qwen3_moe"
    tensors, config = adapter.export(scanned, CFG, VOCAB, {"bos": 1, "eos": 2})
    assert tensors.keys() == adapter.export(unrolled, CFG, VOCAB)[0].keys()
    # Transformers' names, one tensor per expert and projection, PyTorch's [out, in]
    assert tensors["model.layers.1.mlp.experts.3.gate_proj.weight"].shape == (32, 64)
    assert tensors["model.layers.1.mlp.experts.3.down_proj.weight"].shape == (64, 32)
    assert tensors["model.layers.0.mlp.gate.weight"].shape == (4, 64)
    assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (16,)
    assert len(tensors) == 1 + 2 * (5 + 2 + 1 + 1 + 3 * 4) + 2
    np.testing.assert_array_equal(tensors["model.layers.1.mlp.experts.3.up_proj.weight"],
                                  np.asarray(unrolled.blocks[1].mlp.w_up[...])[3].T)
    assert (config["model_type"], config["architectures"], config["num_experts"], config["num_experts_per_tok"],
            config["moe_intermediate_size"], config["norm_topk_prob"], config["router_aux_loss_coef"]) == \
        ("qwen3_moe", ["Qwen3MoeForCausalLM"], 4, 2, 32, True, 0.01)
    folder = write_folder(tmp_path / "hf", tensors, config)
    assert hf_model_config(config)[0] == "qwen3_moe"  # the planner's and fit check's reading of a config.json

    want = flat_params(unrolled)
    for scan_layers in (True, False):
        imported = load_hf_checkpoint(folder, scan_layers=scan_layers)
        assert imported.family == "qwen3_moe" and imported.vocab_size == VOCAB
        shape_keys = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "n_experts", "top_k", "d_expert",
                      "norm_topk_prob", "rope_theta", "norm_eps", "tie_embeddings", "router_aux_loss_coef",
                      "max_seq_len")
        assert all(getattr(imported.model_cfg, key) == getattr(CFG, key) for key in shape_keys)
        got = flat_params(imported.model())
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        again, _ = adapter.export(imported.model(), imported.model_cfg, VOCAB)
        assert again.keys() == tensors.keys()
        for name in tensors:
            np.testing.assert_array_equal(again[name], tensors[name], err_msg=name)
    # Transformers 5 writes num_local_experts and rope_parameters only: read alike
    newer = {k: v for k, v in config.items() if k not in ("num_experts", "rope_theta")} | {"num_local_experts": 4}
    assert hf_model_config(newer)[1] == hf_model_config(config)[1]


def test_bad_hf_folders_are_one_line(layouts: Any, tmp_path: Path) -> None:
    from model.hf_checkpoint import load_hf_checkpoint

    tensors, config = QWEN3_MOE.hf_adapter.export(layouts[0], CFG, VOCAB)  # type: ignore[union-attr]
    name = "model.layers.1.mlp.experts.2.down_proj.weight"
    for label, edit, message, error in (
            ("missing", lambda t, c: t.pop(name), f"tensor '{name}' is missing (Hugging Face qwen3_moe weights)",
             DataError),
            ("shape", lambda t, c: t.update({name: np.zeros((32, 64), np.float32)}),
             f"tensor '{name}' has shape (32, 64), the config implies (64, 32)", DataError),
            ("unknown", lambda t, c: t.update({"model.layers.1.mlp.experts.4.down_proj.weight": t[name]}),
             "tensor 'model.layers.1.mlp.experts.4.down_proj.weight' has no place in the qwen3_moe model", DataError),
            ("dense", lambda t, c: c.update(mlp_only_layers=[1]), "mlp_only_layers=[1] is not supported", ConfigError),
            ("sparse_step", lambda t, c: c.update(decoder_sparse_step=2), "decoder_sparse_step=2 is not supported",
             ConfigError),
            ("yarn", lambda t, c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}),
             "rope_type 'yarn' is not supported", ConfigError)):
        bad_tensors, bad_config = dict(tensors), dict(config)
        edit(bad_tensors, bad_config)
        folder = write_folder(tmp_path / label, bad_tensors, bad_config)
        with pytest.raises(error) as caught:
            load_hf_checkpoint(folder)
        text = str(caught.value)
        assert message in text and "\n" not in text, text
        if error is DataError:
            assert text.startswith(str(folder / "model.safetensors")), text


def test_train_steps_lower_the_loss_and_report_the_aux_losses() -> None:
    from experiment.sections.train import MeshConfig, TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch

    train_cfg = TrainConfig(steps=10, batch_size=4, learning_rate=1e-2, warmup_steps=1, checkpoint_every=10,
                            mesh=MeshConfig(data=1))
    model_cfg = dataclasses.replace(CFG, init_std=0.02, remat="save_dots")
    mesh = build_mesh(train_cfg.mesh, jax.devices()[:1], QWEN3_MOE.mesh_rules(train_cfg.mesh.rules))
    assert "expert" in mesh.axis_names  # the family's axis, at 1
    program = TrainProgram(model_cfg, train_cfg, VOCAB, mesh, seed=0)
    rows = np.random.default_rng(0).integers(0, VOCAB, (4, SEQ + 1)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding)
    state = program.init_state()
    losses, balance = [], []
    for _ in range(6):
        state, metrics = program.step(state, batch)
        losses.append(float(metrics["loss"]))
        balance.append(float(metrics["aux/load_balance"]))
        assert "aux/router_z" in metrics and np.isfinite(float(metrics["aux/router_z"]))
        # the router statistics are logged beside the losses, not added to the loss
        np.testing.assert_allclose(float(metrics["total_loss"]),
                                   losses[-1] + balance[-1] + float(metrics["aux/router_z"]), rtol=1e-5)
        assert float(metrics["aux/router/dropped_fraction"]) == 0.0  # dropless, counted
        per_layer = [float(metrics[f"aux/router/load_max_layer_{i:02d}"]) for i in range(CFG.n_layers)]
        assert all(1.0 <= x <= CFG.n_experts / CFG.top_k for x in per_layer)
        assert float(metrics["aux/router/load_max"]) == pytest.approx(max(per_layer))
    assert losses[0] == pytest.approx(np.log(VOCAB), rel=0.1)
    assert losses[-1] < losses[0] - 0.3, losses
    # near a uniform router (init_std 0.02) the load balance is about its minimum, router_aux_loss_coef x top_k
    assert balance[0] == pytest.approx(CFG.router_aux_loss_coef * CFG.top_k, rel=0.05)


# name -> (data, fsdp, tensor, expert, grad_accum_steps): the family's own axis splits the experts and the batch;
# with micro-batches the load-balancing loss is each micro-batch's (its routing statistics are), so those runs
# are compared with one device taking the same micro-batches
MESHES = {
    "one": (1, 1, 1, 1, 1), "data_fsdp_tensor": (2, 2, 2, 1, 1), "data_fsdp_expert": (2, 2, 1, 2, 1),
    "expert_tensor": (1, 1, 2, 4, 1), "one_accum": (1, 1, 1, 1, 2), "fsdp_tensor_expert_accum": (1, 2, 2, 2, 2),
    "data_expert_4": (2, 1, 1, 4, 1),
}
# capacity routing on a mesh: each expert's capacity is of the tokens its expert group routes (model/moe.py).
# With n_experts / top_k = 2 nothing can drop and the steps are the dropless ones; at 0.5 some slots drop
CAPACITY = {"capacity_no_drop": ((2, 2, 1, 2, 1), 2.0), "capacity_drops": ((2, 2, 1, 2, 1), 0.5),
            "capacity_drops_one": ((1, 1, 1, 1, 1), 0.5)}
STEP_METRICS = ("loss", "grad_norm", "aux/load_balance", "aux/router/dropped_fraction", "aux/router/load_max_layer_00",
                "aux/router/load_max_layer_01")
MESH_VOCAB = 96  # even: the vocabulary is split over the tensor axis


def train_steps_on_meshes() -> dict[str, Any]:
    """In the 8-device worker: two train steps of the tiny shape on each of ``MESHES`` from the same step-0
    parameters and batches (the mesh built with the family's rules, which add its ``expert`` axis): the losses,
    gradient norms and load-balancing losses, the mesh and how many parameters it split."""
    from experiment.sections.train import MeshConfig, TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch

    rng = np.random.default_rng(0)
    batches = [rng.integers(0, MESH_VOCAB, (8, SEQ + 1)).astype(np.int32) for _ in range(2)]
    out: dict[str, Any] = {"devices": jax.device_count()}
    runs = {**{name: (mesh, {}) for name, mesh in MESHES.items()},
            **{name: (mesh, {"routing": "capacity", "capacity_factor": factor})
               for name, (mesh, factor) in CAPACITY.items()}}
    for name, ((data, fsdp, tensor, expert, accum), routing) in runs.items():
        mesh_cfg = MeshConfig(data=data, fsdp=fsdp, tensor=tensor, axes={"expert": expert})
        train = TrainConfig(steps=10, batch_size=8, learning_rate=1e-2, warmup_steps=1, mesh=mesh_cfg,
                            grad_accum_steps=accum)
        devices = jax.devices()[:data * fsdp * tensor * expert]
        mesh = build_mesh(mesh_cfg, devices, QWEN3_MOE.mesh_rules(mesh_cfg.rules))
        program = TrainProgram(QWEN3_MOE.tiny_config(**routing), train, MESH_VOCAB, mesh, seed=0)
        state = program.init_state()
        steps = []
        for rows in batches:
            state, m = program.step(state, global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]},
                                                        program.batch_sharding))
            steps.append([float(m[k]) for k in STEP_METRICS])
        split = sum(not leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(state["params"]))
        out[name] = {"steps": steps, "mesh": dict(program.mesh.shape), "split": split}
    return out


def test_train_steps_sharded_over_8_devices_with_the_expert_axis_give_the_one_device_ones(eight_devices: Any) -> None:
    out = eight_devices.run(train_steps_on_meshes)
    assert out["devices"] == 8
    for name, (data, fsdp, tensor, expert, accum) in MESHES.items():
        one = out["one" if accum == 1 else "one_accum"]["steps"]
        assert out[name]["mesh"] == {"data": data, "fsdp": fsdp, "expert": expert, "tensor": tensor}
        assert (out[name]["split"] > 0) == (not name.startswith("one"))  # the mesh really splits parameters
        for sharded, single in zip(out[name]["steps"], one, strict=True):  # step 1, then a step after an update
            assert abs(sharded[0] - single[0]) < 1e-5, (name, out[name]["steps"], one)
            assert sharded[1] == pytest.approx(single[1], rel=1e-4)
            assert sharded[2] == pytest.approx(single[2], rel=1e-5)
            assert sharded[3] == single[3] == 0.0  # dropless: no token-slot dropped, counted on every mesh
            assert sharded[4:] == pytest.approx(single[4:], rel=1e-6)  # each layer's expert load: the same routing
    dropless = out["one"]["steps"]
    for sharded, single in zip(out["capacity_no_drop"]["steps"], dropless, strict=True):
        assert sharded[3] == 0.0 and abs(sharded[0] - single[0]) < 1e-5 and sharded[1] == pytest.approx(single[1],
                                                                                                           rel=1e-4)
    for name in ("capacity_drops", "capacity_drops_one"):
        assert all(0.0 < step[3] < 1.0 and np.isfinite(step[0]) for step in out[name]["steps"]), out[name]


def test_continuing_a_base_model_keeps_the_runs_routing_and_loss_weights(tmp_path: Path) -> None:
    """Under model.init_from the shape comes from the base model's config.json; the family's run keys (routing,
    capacity, the aux-loss weights) are the run's own, as max_seq_len is: the YAML's values are kept."""
    from trainer.init_from import merge_model_config

    config = tmp_path / "moe.yaml"
    config.write_text("experiment: {name: moe}\nmodel: {family: qwen3_moe, routing: capacity, capacity_factor: 2.0, "
                      "router_aux_loss_coef: 0.01, max_seq_len: 64}\n", encoding="utf-8")
    base = dataclasses.replace(CFG, router_aux_loss_coef=0.001)  # as a base's config.json would give it
    merged = merge_model_config(load_config(config), base, "the base's config.json")
    assert (merged.routing, merged.capacity_factor, merged.router_aux_loss_coef, merged.max_seq_len) == \
        ("capacity", 2.0, 0.01, 64)
    assert (merged.d_model, merged.n_experts, merged.top_k) == (base.d_model, base.n_experts, base.top_k)
