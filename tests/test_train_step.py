"""The compiled train step on one CPU device: no recompilation, accumulation, NaN guard, bf16, mesh errors."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from experiment.errors import ConfigError
from experiment.sections.train import MeshConfig, TrainConfig
from model.llama.config import LlamaConfig
from model.registry import family_of
from model.sharding import build_mesh, mesh_shape
from trainer.step import TrainProgram, global_batch

VOCAB, SEQ, BATCH = 64, 16, 4
MODEL = LlamaConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=SEQ)
TRAIN = TrainConfig(steps=50, batch_size=BATCH, learning_rate=1e-2, warmup_steps=1, checkpoint_every=10)


def program(**train_fields: object) -> TrainProgram:
    train_cfg = dataclasses.replace(TRAIN, **train_fields)
    return TrainProgram(MODEL, train_cfg, VOCAB, build_mesh(train_cfg.mesh), seed=0)


def batch(prog: TrainProgram, seed: int = 0, bad_target: bool = False) -> dict[str, jax.Array]:
    rows = np.random.default_rng(seed).integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    targets = rows[:, 1:].copy()
    if bad_target:
        targets[0, 0] = VOCAB  # out of the vocabulary: the gathered logit is NaN
    return global_batch({"inputs": rows[:, :-1], "targets": targets}, prog.batch_sharding)


@pytest.fixture(scope="module")
def plain() -> TrainProgram:
    return program()


def test_loss_falls_without_recompiling(plain: TrainProgram) -> None:
    state = plain.init_state()
    fixed = batch(plain)
    losses = []
    for _ in range(8):
        state, metrics = plain.step(state, fixed)
        losses.append(float(metrics["loss"]))
    assert losses[0] == pytest.approx(np.log(VOCAB), rel=0.05)  # small init: a uniform guess at first
    assert losses[-1] < losses[0] - 0.5
    assert int(state["step"]) == 8
    assert plain.step._cache_size() == 1  # the state's shardings came back unchanged


def test_a_row_with_zero_loss_weights_trains_nothing(plain: TrainProgram) -> None:
    """shards.on_corrupt=skip: the row standing in for a corrupt record changes neither loss nor weights."""
    weights = np.ones((BATCH, SEQ), np.float32)
    weights[-1] = 0.0
    results = []
    for filler_seed in (1, 2):  # two different fillers in the last row
        base = {k: np.array(v) for k, v in batch(plain).items()}
        filler = np.random.default_rng(filler_seed).integers(0, VOCAB, (2, SEQ)).astype(np.int32)
        base["inputs"][-1], base["targets"][-1] = filler
        state, metrics = plain.step(plain.init_state(),
                                          global_batch({**base, "loss_weights": weights}, plain.batch_sharding))
        results.append((float(metrics["loss"]), jax.tree.leaves(jax.device_get(state["params"]))))
    (loss_a, params_a), (loss_b, params_b) = results
    assert loss_a == loss_b
    assert all(np.array_equal(a, b) for a, b in zip(params_a, params_b, strict=True))


def test_grad_accumulation_matches_one_big_batch(plain: TrainProgram) -> None:
    accum = program(grad_accum_steps=2)
    one, _ = plain.step(plain.init_state(), batch(plain))
    two, metrics = accum.step(accum.init_state(), batch(accum))
    assert bool(metrics["finite"])
    for a, b in zip(jax.tree.leaves(one["params"]), jax.tree.leaves(two["params"]), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-6)


def test_nan_step_is_skipped_and_weights_kept() -> None:
    prog = program(nan_policy="skip")
    state = prog.init_state()
    before = jax.device_get(state["params"])
    state, metrics = prog.step(state, batch(prog, bad_target=True))
    assert not bool(metrics["finite"]) and np.isnan(float(metrics["loss"]))
    assert int(state["step"]) == 1
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state["params"]), strict=True):
        np.testing.assert_array_equal(a, b)
    state, metrics = prog.step(state, batch(prog, seed=1))  # training goes on
    assert bool(metrics["finite"])


@pytest.mark.parametrize("nan_policy", ["stop", "skip"])
def test_an_update_that_overflows_the_weights_is_not_finite(nan_policy: str) -> None:
    """A finite loss and gradient, but a rate that makes the updated parameters infinite: not a good step."""
    prog = program(learning_rate=1e39, warmup_steps=0, schedule="constant", grad_clip=0.0, nan_policy=nan_policy)
    state = prog.init_state()
    before = jax.device_get(state["params"])
    state, metrics = prog.step(state, batch(prog))
    assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
    assert not bool(metrics["finite"])
    params = jax.tree.leaves(jax.device_get(state["params"]))
    if nan_policy == "skip":  # the previous, finite, weights kept
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), params, strict=True))
    else:
        assert not all(np.isfinite(p).all() for p in params)


def test_bf16_compute_keeps_fp32_master_weights(plain: TrainProgram) -> None:
    bf16 = program(compute_dtype="bfloat16")
    state, metrics = bf16.step(bf16.init_state(), batch(bf16))
    _, reference = plain.step(plain.init_state(), batch(plain))
    assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(state["params"]))
    assert float(metrics["loss"]) == pytest.approx(float(reference["loss"]), rel=1e-2)


def test_mesh_shape_and_its_errors() -> None:
    assert mesh_shape(MeshConfig(fsdp=2, tensor=2), 8) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert mesh_shape(MeshConfig(data=2, dcn_data=2, tensor=2), 8) == {"data": 4, "fsdp": 1, "tensor": 2}
    with pytest.raises(ConfigError, match="does not divide the 8 devices"):
        mesh_shape(MeshConfig(tensor=3), 8)
    with pytest.raises(ConfigError, match="= 4 devices, but 8 are available"):
        mesh_shape(MeshConfig(data=2, fsdp=2), 8)


@pytest.mark.parametrize(("fields", "key"), [
    ({"batch_size": 6, "grad_accum_steps": 4}, "train.grad_accum_steps"),
    ({"warmup_steps": 50, "steps": 50}, "train.warmup_steps"),
    ({"mesh": {"tensor": 0}}, "train.mesh.tensor"),
    ({"mesh": {"rules": {"embed": ["fsdp", "model"]}}}, "train.mesh.rules.embed"),
    ({"nan_policy": "ignore"}, "train.nan_policy"),
])
def test_bad_train_config_names_the_key(fields: dict, key: str) -> None:
    from experiment.config import build_dataclass

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_dataclass(TrainConfig, fields, "train")


def test_partial_rules_keep_the_familys_other_defaults(tmp_path) -> None:
    from experiment.config import build_dataclass, load_config
    from model.registry import get_family

    mesh = build_dataclass(MeshConfig, {"rules": {"embed": []}}, "train.mesh")
    assert mesh.rules == {"embed": []}  # only what the YAML gives: the family has the rest
    rules = get_family("llama").mesh_rules(mesh.rules)
    assert rules["embed"] == [] and rules["mlp"] == ["tensor"] and rules["batch"] == ["data", "fsdp"]
    config = tmp_path / "c.yaml"
    config.write_text("experiment: {name: t}\ntrain: {mesh: {rules: {embd: [fsdp]}}}\n", encoding="utf-8")
    with pytest.raises(ConfigError,
                       match=r"^config key 'train\.mesh\.rules': unknown logical axes \['embd'\] for the llama"):
        load_config(config)


@pytest.mark.parametrize("fields", [{}, {"param_dtype": "bfloat16"}, {"quantization": "int8"},
                                    {"trainable": "embeddings"}])
def test_the_restore_target_is_the_initial_states_shape(fields: dict) -> None:
    """TrainProgram takes its state's shapes from the abstract module, not from tracing ``initial_state``: they
    must be what ``initial_state`` makes (tree, metadata, shapes, dtypes), or a restore or the init misplaces."""
    prog = program(**fields)
    made = jax.eval_shape(prog.initial_state)
    assert jax.tree.structure(made) == jax.tree.structure(prog.abstract_state)
    assert [(a.shape, a.dtype) for a in jax.tree.leaves(made)] == [
        (a.shape, a.dtype) for a in jax.tree.leaves(prog.abstract_state)]


def test_an_abstract_module_is_a_module_of_its_own_each_time() -> None:
    """The abstract build is traced once per configuration (cached): each call still gets its own module,
    and another configuration another shape."""
    from flax import nnx

    family = family_of(MODEL)
    first, second = family.abstract(MODEL, VOCAB), family.abstract(MODEL, VOCAB)
    state = nnx.state(first, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), nnx.to_pure_dict(state)))
    nnx.update(first, state)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(nnx.state(second, nnx.Param)))
    wider = family.abstract(dataclasses.replace(MODEL, d_ff=96), VOCAB)
    assert {leaf.shape for leaf in jax.tree.leaves(nnx.state(wider, nnx.Param))} != {
        leaf.shape for leaf in jax.tree.leaves(nnx.state(second, nnx.Param))}
    assert family.abstract(MODEL, VOCAB + 1).embed.shape == (VOCAB + 1, MODEL.d_model)
