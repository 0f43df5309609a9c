"""The gemma3 family (model/gemma3/): config load, the two layer layouts, sliding windows, counts, training.

Tiny shapes throughout: 8 layers in groups of 3 (two scanned groups and a tail of 2), a window of 4 over
16 tokens so that local and global layers see different keys, head_dim != d_model / n_heads and
query_pre_attn_scalar != head_dim.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiment.config import load_config
from experiment.errors import ConfigError
from model.family import FamilyModel
from model.gemma3 import flops
from model.gemma3.config import Gemma3Config
from model.registry import family_of, get_family
from model.stacking import stack_tree, unrolled_pure
from tests.recipe_runner import REPO

VOCAB, SEQ = 61, 16
CFG = Gemma3Config(d_model=32, n_layers=5, n_heads=4, n_kv_heads=2, head_dim=12, d_ff=48, max_seq_len=SEQ,
                   sliding_window=4, global_every=2, query_pre_attn_scalar=10, init_std=0.3)
GEMMA3 = get_family("gemma3")


def tokens(seed: int = 0, batch: int = 2) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, (batch, SEQ)), jnp.int32)


def flat_params(model: nnx.Module) -> dict[str, np.ndarray]:
    """Parameters by unrolled path (``blocks/<i>/...``), whichever layout the model has."""
    pure = unrolled_pure(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    return {"/".join(map(str, path)): np.asarray(leaf) for path, leaf in
            ((tuple(getattr(k, "key", k) for k in p), v) for p, v in jax.tree_util.tree_flatten_with_path(pure)[0])}


def test_config_load_with_a_preset_and_overrides() -> None:
    tiny = REPO / "tests" / "configs" / "tiny.yaml"
    cfg = load_config(tiny, ['model={"family": "gemma3", "preset": "1b", "max_seq_len": 64}',
                             "model.sliding_window=32"])
    model = cfg.model
    assert isinstance(model, Gemma3Config) and family_of(model) is GEMMA3
    assert (model.d_model, model.n_layers, model.n_heads, model.n_kv_heads, model.head_dim, model.d_ff) == \
        (1152, 26, 4, 1, 256, 6912)
    assert model.sliding_window == 32 and model.max_seq_len == 64  # the keys the config sets win
    assert model.layer_types() == "LLLLLG" * 4 + "LL"
    assert load_config(tiny, ['model={"family": "gemma3", "preset": "27b"}']).model.attn_scale == 168 ** -0.5
    assert load_config(tiny, ['model={"family": "gemma3", "preset": "4b"}']).model.rope_scaling == "linear"
    rules = family_of(model).mesh_rules(load_config(tiny, ['model={"family": "gemma3"}',
                                                           'train.mesh.rules={"kv_heads": []}']).train.mesh.rules)
    assert rules["kv_heads"] == [] and rules["heads"] == ["tensor"]


@pytest.mark.parametrize(("fields", "message"), [
    ({"layer_pattern": "LLX"}, r"config key 'model.layer_pattern': letters L \(local\) and G \(global\) only"),
    ({"tie_embeddings": False}, "config key 'model.tie_embeddings': Gemma 3 ties the output head"),
    ({"global_every": 0}, "config key 'model.global_every': must be positive"),
    ({"sliding_window": 0}, "config key 'model.sliding_window': local layers need a positive window"),
    ({"n_kv_heads": 3}, "config key 'model.n_kv_heads': 3 does not divide n_heads=4"),
    ({"rope_scaling": "yarn"}, "config key 'model.rope_scaling'"),
])
def test_bad_config_is_one_line_naming_the_key(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(REPO / "tests" / "configs" / "tiny.yaml", [f"model={json.dumps({'family': 'gemma3', **fields})}"])
    assert "\n" not in str(caught.value)


@pytest.fixture(scope="module")
def layouts() -> tuple[nnx.Module, nnx.Module]:
    """The same config scanned (with remat: its checkpointed group scan) and unrolled, from one seed."""
    # one group per scan iteration: a real loop (on a CPU the default unrolls every group)
    scanned = GEMMA3.init(dataclasses.replace(CFG, remat="full", scan_unroll=1), VOCAB, seed=3)
    unrolled = GEMMA3.init(dataclasses.replace(CFG, scan_layers=False), VOCAB, seed=3)
    return scanned, unrolled


def test_scanned_and_unrolled_layouts_agree(layouts: tuple[nnx.Module, nnx.Module]) -> None:
    scanned, unrolled = layouts
    a, b = flat_params(scanned), flat_params(unrolled)
    assert a.keys() == b.keys() and len(a) == 2 + 5 * 13
    for name in a:  # model.stacking.stacked: bit-identical initialisation in either layout
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    # the generic [L, ...] layout: checkpoints restack between the layouts (trainer.checkpoint.restore_any_layout)
    restacked = stack_tree(nnx.state(unrolled, nnx.Param), nnx.state(scanned, nnx.Param))
    for x, y in zip(jax.tree.leaves(restacked), jax.tree.leaves(nnx.state(scanned, nnx.Param)), strict=True):
        np.testing.assert_array_equal(x, y)
    assert isinstance(scanned, FamilyModel)
    hash(nnx.graphdef(scanned)), hash(nnx.graphdef(unrolled))  # eval jits with the graphdef as a static argument
    assert sum(x.size for x in jax.tree.leaves(nnx.state(scanned, nnx.Param))) == GEMMA3.param_count(CFG, VOCAB)

    batch = tokens()
    targets = jnp.roll(batch, -1, axis=1)

    def loss(model: nnx.Module) -> tuple[jax.Array, jax.Array]:
        logits = model(batch)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1).mean(), logits

    grads, logits = {}, {}
    for name, model in (("scanned", scanned), ("unrolled", unrolled)):  # one compile each: logits and gradients
        (_, out), grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
        logits[name], grads[name] = np.asarray(out), flat_params(nnx.merge(nnx.graphdef(model), grad))
    assert np.abs(logits["scanned"]).max() > 1  # not a near-zero output that would hide differences
    np.testing.assert_allclose(logits["scanned"], logits["unrolled"], atol=2e-5, rtol=1e-5)
    for name in grads["scanned"]:
        np.testing.assert_allclose(grads["scanned"][name], grads["unrolled"][name], atol=2e-5, rtol=1e-4, err_msg=name)


def test_sliding_window_limits_what_local_layers_see() -> None:
    """With only local layers of window 4, position t sees back to t - n_layers * 3: changing token 0 changes
    no logit from position 7 on (2 layers); one global layer makes every later position see it."""
    local = dataclasses.replace(CFG, n_layers=2, layer_pattern="L", scan_layers=False)
    base = tokens(1, batch=1)
    changed = base.at[0, 0].set((base[0, 0] + 1) % VOCAB)
    for cfg, unaffected_from in ((local, 7), (dataclasses.replace(local, layer_pattern="LG"), SEQ)):
        logits = np.asarray(nnx.jit(lambda m: m(jnp.concatenate([base, changed])))(GEMMA3.init(cfg, VOCAB, seed=0)))
        diff = np.abs(logits[0] - logits[1]).max(axis=-1)
        assert (diff[:unaffected_from] > 1e-6).all(), diff
        assert (diff[unaffected_from:] == 0).all(), diff


def test_flops_and_parameters_by_hand() -> None:
    cfg = dataclasses.replace(CFG, remat="save_dots")
    d, h, kv, hd, f, n = 32, 4, 2, 12, 48, 5
    per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    assert flops.param_count(cfg, VOCAB) == n * per_layer + VOCAB * d + n * (4 * d + 2 * hd) + d
    # layers 1 and 3 global (T = 16 keys per query), the three others local (window 4)
    keys = 2 * 16 + 3 * 4
    attention = 4 * h * hd * keys
    forward = 2 * (n * per_layer + d * VOCAB) + attention
    assert flops.train_flops_per_token(cfg, VOCAB, 16) == 3 * forward
    assert flops.recompute_flops(cfg, VOCAB, 16, "dot_product") == attention
    assert flops.recompute_flops(cfg, VOCAB, 16, "splash") == attention * 1.5
    full = dataclasses.replace(cfg, remat="full")
    assert flops.recompute_flops(full, VOCAB, 16, "dot_product") == forward - 2 * d * VOCAB
    # at T within the window local and global layers count alike
    assert flops.keys_per_query(cfg, 3) == 5 * 3
    costs = GEMMA3.train_costs(cfg, VOCAB, 16, "cpu", "float32", 8)
    assert costs.model_flops == 3 * forward and costs.hardware_flops == 3 * forward + attention + 2 * d * VOCAB


def test_train_step_lowers_the_loss() -> None:
    from experiment.sections.train import TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch

    train_cfg = TrainConfig(steps=10, batch_size=4, learning_rate=1e-2, warmup_steps=1, checkpoint_every=10)
    model_cfg = dataclasses.replace(CFG, init_std=0.02)
    program = TrainProgram(model_cfg, train_cfg, VOCAB, build_mesh(train_cfg.mesh), seed=0)
    rows = np.random.default_rng(0).integers(0, VOCAB, (4, SEQ + 1)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding)
    state = program.init_state()
    losses = []
    for _ in range(6):
        state, metrics = program.step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[0] == pytest.approx(np.log(VOCAB), rel=0.1)
    assert losses[-1] < losses[0] - 0.3, losses


def test_quantized_training_quantizes_the_projections_of_every_layer() -> None:
    """int8 (trainer/quantization.py, Qwix): forward, input- and weight-gradient dot of the 7 projections of
    each layer in the lowered step: the scan body's 2 layers (one group per iteration) and the tail layer."""
    from experiment.sections.train import TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram

    train_cfg = TrainConfig(steps=10, batch_size=2, warmup_steps=1, checkpoint_every=10, quantization="int8")
    program = TrainProgram(dataclasses.replace(CFG, scan_unroll=1), train_cfg, VOCAB, build_mesh(train_cfg.mesh),
                           seed=0)
    text = program.lower(program.abstract_batch(2, SEQ)).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert len([line for line in dots if re.search(r"tensor<[0-9x]*xi8>", line)]) == 3 * 7 * (2 + 1)


@pytest.mark.integration
def test_recipes_train_evaluate_and_export_gemma3(fixture_stages: Path, tmp_path: Path) -> None:
    """Recipe 04 trains the family for 2 steps on the fixture stages; recipe 05 scores it and exports it as
    a Gemma3ForCausalLM folder that imports back to the trained parameters."""
    import yaml

    from model.hf_checkpoint import load_hf_checkpoint
    from tests.fixture_run import checkpoint_contents, run_copy
    from tests.recipe_runner import run_recipe
    from trainer.trained_model import load_trained_model

    heldout = REPO / "tests" / "fixtures" / "corpus" / "ru_news.txt"
    config = run_copy(fixture_stages, tmp_path,
                      train={"steps": 2, "checkpoint_every": 2, "warmup_steps": 1, "log_every": 1},
                      eval={"tasks": [], "export_hf": True, "heldout_text_files": [str(heldout)]})
    tree = yaml.safe_load(config.read_text(encoding="utf-8"))
    tree["model"] = {"family": "gemma3", "d_model": 32, "n_layers": 4, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16,
                     "d_ff": 64, "sliding_window": 8, "global_every": 3, "max_seq_len": 64}
    config.write_text(yaml.safe_dump(tree, allow_unicode=True), encoding="utf-8")
    run_dir = tmp_path / "runs" / "tiny"
    run_recipe("04_pretrain.py", config)
    _, items = checkpoint_contents(run_dir, 2)
    meta = items["meta"]
    assert meta["family"] == "gemma3" and meta["layout"]["scan_layers"] is True
    assert meta["n_params"] == GEMMA3.param_count(Gemma3Config(**meta["model"]), meta["vocab_size"])

    run_recipe("05_evaluate.py", config)
    results = json.loads((run_dir / "eval" / "step_0000002.json").read_text(encoding="utf-8"))
    assert 0 < results["heldout"][str(heldout)]["bits_per_byte"] < 20
    folder = Path(results["hf_export"])
    exported = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert exported["architectures"] == ["Gemma3ForCausalLM"] and exported["model_type"] == "gemma3_text"
    trained, _, _ = load_trained_model(SimpleNamespace(checkpoints=run_dir / "checkpoints"))
    imported = load_hf_checkpoint(folder).model()
    for a, b in zip(jax.tree.leaves(nnx.state(imported, nnx.Param)), jax.tree.leaves(nnx.state(trained, nnx.Param)),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
