"""The deepseek_v3 family (model/deepseek_v3/, GigaChat 3's architecture) beyond the family contract: config load and
its one-line errors, the parameter count against DeepSeek-V3's published figures and the built model, FLOPs by
active parameters from the module's own shapes, the Hugging Face config it refuses, the multi-token prediction
tensors it leaves out, and training with the router statistics. Transformers' logits, greedy tokens and the export
round trip are tests/test_hf_parity_deepseek_v3.py's (the hf lane)."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from experiment.config import load_config
from experiment.errors import ConfigError
from experiment.presets import preset_model_config
from model.deepseek_v3 import flops
from model.registry import get_family

VOCAB, SEQ = 97, 16
DEEPSEEK = get_family("deepseek_v3")
TINY = DEEPSEEK.tiny_config()


def test_deepseek_v3_preset_has_the_published_parameter_counts() -> None:
    """DeepSeek-V3: 671B parameters, 37B activated per token, without the multi-token prediction module (its
    technical report); 685B with it, as the model card counts the checkpoint (the module's copies of the embedding
    and head included, which are shared here)."""
    cfg = preset_model_config("deepseek-v3", "deepseek_v3")
    main = dataclasses.replace(cfg, mtp_layers=0)
    assert DEEPSEEK.param_count(main, 129_280) == pytest.approx(671e9, rel=0.001)
    assert DEEPSEEK.active_params(main, 129_280) == pytest.approx(37.5e9, rel=0.01)
    copies = 2 * 129_280 * cfg.d_model
    assert cfg.mtp_layers == 1 and DEEPSEEK.param_count(cfg, 129_280) + copies == pytest.approx(685e9, rel=0.001)


def test_gigachat3_lightning_preset_has_the_checkpoints_parameter_count() -> None:
    """GigaChat 3 Lightning, "10B-A1.8B" by its model cards: the preset's shapes give exactly the 11,479,750,784
    parameters of the published checkpoint's tensors (the MTP layer and its embedding and head copies included, as
    read from the checkpoint by the public audit the preset cites), 10.7B and 1.8B active without the MTP layer."""
    cfg = preset_model_config("gigachat3-lightning", "deepseek_v3")
    vocab = 128_256
    assert DEEPSEEK.param_count(cfg, vocab) + 2 * vocab * cfg.d_model == 11_479_750_784
    main = dataclasses.replace(cfg, mtp_layers=0)
    assert DEEPSEEK.param_count(main, vocab) == pytest.approx(10.7e9, rel=0.01)
    assert DEEPSEEK.active_params(main, vocab) == pytest.approx(1.8e9, rel=0.02)


def sizes(model: nnx.Module) -> dict[str, int]:
    state = nnx.state(model, nnx.Param)
    return {jax.tree_util.keystr(path): math.prod(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


def test_the_parameter_count_and_flops_follow_the_modules_own_shapes() -> None:
    """The formula against the built tiny model (unrolled: one entry per layer); the forward FLOPs against 2 x the
    matmul parameters a token goes through, counted from the shapes (the norm scales and selection biases are no
    matmul, the untied table is a gather, only top_k of the routed experts run) plus attention's T x T scores
    and values and the head."""
    cfg = dataclasses.replace(TINY, scan_layers=False)
    model = DEEPSEEK.init(cfg, VOCAB, seed=0)
    params = sizes(model)
    assert sum(params.values()) == flops.param_count(cfg, VOCAB)
    assert sum(params.values()) == sum(sizes(DEEPSEEK.init(TINY, VOCAB, seed=0)).values())  # scanned alike
    assert cfg.mtp_layers == 1 and cfg.mtp_depth == 1 and any("'mtp'" in path for path in params)
    idle_experts = sum(size for path, size in params.items() if "'w_gate'" in path or "'w_up'" in path
                       or "'w_down'" in path if "'shared'" not in path and "'dense_blocks'" not in path) \
        * (cfg.n_experts - cfg.top_k) // cfg.n_experts
    not_matmul = sum(size for path, size in params.items() if "norm" in path or "router_bias" in path)
    matmul = sum(params.values()) - not_matmul - idle_experts - VOCAB * cfg.d_model  # the embedding: a gather
    # the prediction module: one more attention layer, one more pass through the (shared) head
    attention = 2 * SEQ * cfg.n_heads * (cfg.qk_head_dim + cfg.v_head_dim) * (cfg.n_layers + 1)
    forward = 2 * (matmul + cfg.d_model * VOCAB) + attention
    assert flops.forward_flops_per_token(cfg, VOCAB, SEQ) == forward
    assert DEEPSEEK.flops(cfg, VOCAB, SEQ) == 3 * forward
    assert DEEPSEEK.active_params(cfg, VOCAB) == sum(params.values()) - idle_experts
    # kept but not trained (weight 0): counted among the parameters, not in the work or the active ones
    kept = dataclasses.replace(cfg, mtp_loss_weight=0.0)
    mtp = sum(size for path, size in params.items() if "'mtp'" in path)
    assert DEEPSEEK.param_count(kept, VOCAB) == sum(params.values())
    idle_main = idle_experts * cfg.n_moe_layers // (cfg.n_moe_layers + cfg.mtp_layers)
    assert DEEPSEEK.active_params(kept, VOCAB) == DEEPSEEK.active_params(
        dataclasses.replace(cfg, mtp_layers=0), VOCAB) == sum(params.values()) - mtp - idle_main


@pytest.mark.parametrize(("override", "message"), [
    ("model.first_k_dense=3", "config key 'model.first_k_dense': 3 must be between 0 and n_layers - 1 = 2"),
    ("model.n_group=3", "config key 'model.n_group': 3 groups of n_experts=4"),
    ("model.qk_rope_head_dim=7", "config key 'model.qk_rope_head_dim': RoPE needs an even width, got 7"),
    ("model.top_k=3", "config key 'model.top_k': 3 is more than the experts of topk_group=1 groups"),
])
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, override: str, message: str) -> None:
    config = tmp_path / "ds.yaml"
    config.write_text("experiment: {name: ds}\nmodel: {family: deepseek_v3, preset: tiny}\n", encoding="utf-8")
    assert load_config(config).model.d_model == TINY.d_model
    with pytest.raises(ConfigError) as caught:
        load_config(config, [override])
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_hf_config_refuses_what_is_not_built_and_the_prediction_modules_share_the_embedding_and_head(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from experiment.errors import DataError
    from model.deepseek_v3.hf import DEEPSEEK_V3_HF

    model = DEEPSEEK.init(dataclasses.replace(TINY, scan_layers=False), VOCAB, seed=0)
    tensors, config = DEEPSEEK_V3_HF.export(model, TINY, VOCAB)
    for edit, message in (({"rope_parameters": {"rope_type": "longrope", "factor": 4.0, "rope_theta": 1e4}},
                           "rope_type 'longrope' is not supported (only default and yarn)"),
                          ({"scoring_func": "softmax"}, "scoring_func='softmax' is not supported"),
                          ({"num_key_value_heads": 2}, "num_key_value_heads=2 is not supported")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            DEEPSEEK_V3_HF.config({**config, **edit})
    # the checkpoint's layout: layer n_layers is the prediction module, with copies of the embedding and head
    mtp = f"model.layers.{TINY.n_layers}"
    assert config["num_nextn_predict_layers"] == 1
    assert tensors[f"{mtp}.eh_proj.weight"].shape == (TINY.d_model, 2 * TINY.d_model)
    np.testing.assert_array_equal(tensors[f"{mtp}.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
    np.testing.assert_array_equal(tensors[f"{mtp}.shared_head.head.weight"], tensors["lm_head.weight"])
    assert f"{mtp}.mlp.experts.3.down_proj.weight" in tensors and f"{mtp}.shared_head.norm.weight" in tensors
    cfg, state = DEEPSEEK_V3_HF.import_(config, tensors)
    assert cfg.mtp_layers == 1
    got = jax.tree.leaves(state)
    want = jax.tree.leaves(nnx.state(DEEPSEEK.init(cfg, VOCAB, seed=0), nnx.Param))  # its layout, the same init
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want, strict=True))
    # a copy that is not the main model's (the module would predict with another head) or none: one line each
    other = {**tensors, f"{mtp}.shared_head.head.weight": tensors["lm_head.weight"] + 1}
    with pytest.raises(DataError, match=re.escape(f"tensor '{mtp}.shared_head.head.weight' differs from "
                                                  "'lm_head.weight'")):
        DEEPSEEK_V3_HF.import_(config, other)
    with pytest.raises(DataError, match=re.escape(f"tensor '{mtp}.embed_tokens.weight' is missing")):
        DEEPSEEK_V3_HF.import_(config, {k: v for k, v in tensors.items() if k != f"{mtp}.embed_tokens.weight"})
    # a checkpoint re-saved by Transformers (which drops the layer) under a config.json still declaring it: the
    # model it holds, without the module, and a warning; a layer with some of its tensors is an error
    saved = {k: v for k, v in tensors.items() if not k.startswith(f"{mtp}.")}
    with caplog.at_level(logging.WARNING):
        assert DEEPSEEK_V3_HF.import_(config, saved)[0].mtp_layers == 0
    assert "imported without the multi-token prediction module" in caplog.text
    with pytest.raises(DataError, match=re.escape(f"tensor '{mtp}.eh_proj.weight' is missing")):
        DEEPSEEK_V3_HF.import_(config, {k: v for k, v in tensors.items() if k != f"{mtp}.eh_proj.weight"})
    # without the config's say-so the module's tensors have no place
    with pytest.raises(DataError, match="has no place in the deepseek_v3 model"):
        DEEPSEEK_V3_HF.import_({**config, "num_nextn_predict_layers": 0}, tensors)


def test_train_steps_lower_the_loss_and_log_the_router_statistics() -> None:
    from experiment.sections.train import MeshConfig, TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch

    train_cfg = TrainConfig(steps=10, batch_size=4, learning_rate=1e-2, warmup_steps=1, mesh=MeshConfig(data=1))
    cfg = dataclasses.replace(TINY, router_aux_loss_coef=0.01, remat="full", router_bias_update_rate=0.0)
    mesh = build_mesh(train_cfg.mesh, jax.devices()[:1], DEEPSEEK.mesh_rules(train_cfg.mesh.rules))
    program = TrainProgram(cfg, train_cfg, VOCAB, mesh, seed=0)
    rows = np.random.default_rng(0).integers(0, VOCAB, (4, SEQ + 1)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding)
    state = program.init_state()
    bias = np.asarray(state["params"]["blocks"]["mlp"]["router_bias"][...])
    losses = []
    for _ in range(6):
        state, metrics = program.step(state, batch)
        losses.append(float(metrics["loss"]))
        assert float(metrics["aux/router/dropped_fraction"]) == 0.0
        assert 1.0 <= float(metrics["aux/router/load_max_layer_01"]) <= cfg.n_experts / cfg.top_k
        np.testing.assert_allclose(float(metrics["total_loss"]), losses[-1] + float(metrics["aux/load_balance"])
                                   + float(metrics["aux/mtp"]), rtol=1e-5)
        assert float(metrics["aux/mtp"]) == pytest.approx(cfg.mtp_loss_weight * float(metrics["aux/mtp/loss_1"]))
    assert losses[-1] < losses[0] - 0.3, losses
    # the selection bias is a parameter no gradient reaches: at a balancing rate of 0, six steps leave it as it was
    np.testing.assert_array_equal(np.asarray(state["params"]["blocks"]["mlp"]["router_bias"][...]), bias)


def program_and_batch(rate: float, **train: object) -> tuple[Any, dict[str, jax.Array], Any]:
    from experiment.sections.train import MeshConfig, TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch

    train_cfg = TrainConfig(**{"steps": 10, "batch_size": 4, "learning_rate": 1e-2, "warmup_steps": 1,
                               "mesh": MeshConfig(data=1), **train})
    cfg = dataclasses.replace(TINY, router_bias_update_rate=rate)
    mesh = build_mesh(train_cfg.mesh, jax.devices()[:1], DEEPSEEK.mesh_rules(train_cfg.mesh.rules))
    program = TrainProgram(cfg, train_cfg, VOCAB, mesh, seed=0)
    rows = np.random.default_rng(1).integers(0, VOCAB, (4, SEQ + 1)).astype(np.int32)
    return program, global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding), cfg


@pytest.mark.parametrize("accum", [1, 2])
def test_each_step_moves_the_selection_biases_against_the_load_outside_the_optimizer(accum: int) -> None:
    """DeepSeek-V3's aux-loss-free balancing: after the optimizer step each MoE layer's bias moves by the rate, down
    for an expert loaded above its layer's mean, up below, by the load of the step's batch (the micro-batches'
    mean), written out here from the router's choices on the step's parameters; a skipped step leaves it."""
    from model.family import EXPERT_LOAD
    from model.loss import Labels

    rate = 0.05
    program, batch, cfg = program_and_batch(rate, grad_accum_steps=accum)
    state = program.init_state()
    before = np.asarray(state["params"]["blocks"]["mlp"]["router_bias"][...])  # [L_moe, E]
    before_mtp = np.asarray(state["params"]["mtp"][0]["block"]["mlp"]["router_bias"][...])
    model = nnx.merge(program.graphdef, state["params"])
    _, aux = model.hidden_with_aux(batch["inputs"], labels=Labels(batch["targets"], None, 0))
    load = np.asarray(aux[EXPERT_LOAD])  # the main MoE layers', then the prediction module's
    layers = cfg.n_moe_layers + cfg.mtp_layers
    assert load.shape == (layers, cfg.n_experts) and load.sum() == layers * 4 * SEQ * cfg.top_k
    want = np.concatenate([before, before_mtp[None]]) + rate * np.sign(load.mean(axis=1, keepdims=True) - load)
    state, metrics = program.step(state, batch)
    assert EXPERT_LOAD not in metrics and f"aux/{EXPERT_LOAD}" not in metrics  # not a scalar to log
    got = np.concatenate([np.asarray(state["params"]["blocks"]["mlp"]["router_bias"][...]),
                          np.asarray(state["params"]["mtp"][0]["block"]["mlp"]["router_bias"][...])[None]])
    np.testing.assert_allclose(got, want, atol=1e-7)
    assert np.abs(got - want).max() < 1e-7 and np.abs(got[-1] - before_mtp).max() == pytest.approx(rate)


def test_a_skipped_step_or_a_frozen_body_leaves_the_selection_biases() -> None:
    program, batch, _ = program_and_batch(0.05, nan_policy="skip", trainable="embeddings")
    state = program.init_state()
    before = np.asarray(state["params"]["blocks"]["mlp"]["router_bias"][...])
    state, _ = program.step(state, batch)
    np.testing.assert_array_equal(np.asarray(state["params"]["blocks"]["mlp"]["router_bias"][...]), before)
    program, batch, _ = program_and_batch(0.05, nan_policy="skip", learning_rate=1e39, warmup_steps=0,
                                          schedule="constant", grad_clip=0.0)  # the weights overflow: skipped
    state = program.init_state()
    before = np.asarray(state["params"]["blocks"]["mlp"]["router_bias"][...])
    state, metrics = program.step(state, batch)
    assert not bool(metrics["finite"])
    np.testing.assert_array_equal(np.asarray(state["params"]["blocks"]["mlp"]["router_bias"][...]), before)


def test_yarn_keeps_the_fast_dimensions_slows_the_slow_ones_and_scales_the_temperature() -> None:
    """YaRN (experiment/sections/rope.py's Rope) at DeepSeek-V3's setting (factor 40 over 4,096 positions, beta
    32 / 1, rope part 64 wide, base 10,000): a dimension that turns more than 32 times over the original context
    keeps its frequency, one that turns less than once is slowed 40x, those between are mixed; sin and cos are scaled by
    mscale(40, 1) / mscale(40, 1) = 1, and the softmax by mscale(40, 1)^2 = (0.1 ln 40 + 1)^2."""
    from model.deepseek_v3.model import softmax_scale
    from model.layers import Rope

    plain = Rope(10_000.0).frequencies(64)
    yarn = Rope(10_000.0, "yarn", factor=40.0, original_max_len=4096, beta_fast=32, beta_slow=1, mscale=1.0,
                mscale_all_dim=1.0)
    scaled = yarn.frequencies(64)
    turns = plain * 4096 / (2 * np.pi)
    np.testing.assert_array_equal(scaled[turns > 32], plain[turns > 32])
    np.testing.assert_allclose(scaled[turns < 1], plain[turns < 1] / 40, rtol=1e-6)
    between = (turns <= 32) & (turns >= 1)
    assert between.any() and np.all((scaled[between] < plain[between]) & (scaled[between] > plain[between] / 40))
    assert yarn.attention_factor() == 1.0 and Rope(10_000.0, "yarn", factor=40.0).attention_factor() == \
        pytest.approx(0.1 * np.log(40) + 1)
    cfg = dataclasses.replace(preset_model_config("deepseek-v3", "deepseek_v3"), rope_scaling="yarn", rope_factor=40.0,
                              rope_mscale=1.0, rope_mscale_all_dim=1.0)
    assert softmax_scale(cfg) == pytest.approx(192 ** -0.5 * (0.1 * np.log(40) + 1) ** 2)


def test_the_generation_cache_holds_the_latent_and_the_rope_key_not_the_heads() -> None:
    """Per token and layer the cache keeps kv_lora_rank + qk_rope_head_dim values (16 + 8 at the tiny shape), where
    expanded keys and values would take 2 x heads x (nope + rope) (2 x 4 x 24); decoding from it gives the full
    forward pass's logits (the family contract's KV-cache test, tests/test_family_contract.py)."""
    from model.kv_cache import init_cache

    model = DEEPSEEK.init(TINY, VOCAB, seed=0)
    cache = init_cache(model, 2, 32)
    assert cache.k.shape == (TINY.n_layers, 2, 32, 1, TINY.kv_lora_rank)
    assert cache.v.shape == (TINY.n_layers, 2, 32, 1, TINY.qk_rope_head_dim)
    assert TINY.kv_lora_rank + TINY.qk_rope_head_dim < 2 * TINY.n_heads * TINY.qk_head_dim


def test_absorbed_and_expanded_decoding_give_the_full_forward_passs_logits() -> None:
    """A 9-token prefill and 7 one-token steps over the latent cache, attending absorbed or expanded (or as
    ``model.mla_decode: auto`` chooses), against the full forward pass of the 16 tokens; at GigaChat 3
    Lightning's shape auto attends absorbed for a step of one token and expanded for a prefill as long as the
    cache."""
    import jax.numpy as jnp

    from model.kv_cache import cached_logits

    lightning = preset_model_config("gigachat3-lightning", "deepseek_v3")
    attention = DEEPSEEK.abstract(lightning, 128_256).dense_blocks[0].attn  # shapes only
    assert attention.absorbed_for(1, 4096) and attention.absorbed_for(16, 4096)
    assert not attention.absorbed_for(4096, 4096)

    tokens = np.random.default_rng(4).integers(0, VOCAB, (2, 16)).astype(np.int32)
    outputs = {}
    for form in ("absorbed", "expanded", "auto"):
        cfg = dataclasses.replace(TINY, mla_decode=form)
        model = DEEPSEEK.init(cfg, VOCAB, seed=0)
        full = np.asarray(nnx.jit(lambda m, t: m(t))(model, jnp.asarray(tokens)))
        outputs[form] = np.asarray(cached_logits(model, tokens, 9)[0])
        np.testing.assert_allclose(outputs[form], full, atol=1e-5, rtol=0)
    assert not np.array_equal(outputs["absorbed"], outputs["expanded"])  # two computations, not one
