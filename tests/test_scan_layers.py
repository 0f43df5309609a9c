"""Scanned layers (model/stacking.py) against the unrolled loop, and checkpoints of either layout.

The unrolled path is the reference: the same parameters, stacked, must give the same logits and
gradients; a run folder written by the code before scanned layers (tests/fixtures/unrolled_run, made by
tests/fixtures/make_unrolled_run.py at that commit) must resume on the scanned code and continue as
that code's own continuation did.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiment.sections.train import TrainConfig
from model.llama.config import LlamaConfig
from model.registry import get_family
from model.sharding import build_mesh
from model.stacking import stack_tree, unrolled_pure, unstack_tree
from tests.fixture_run import DETERMINISTIC_KEYS, FIXTURE_STAGES, log_records
from tests.recipe_runner import run_recipe, tiny_config
from trainer.checkpoint import open_manager, read_meta
from trainer.step import TrainProgram
from trainer.trained_model import load_trained_model

VOCAB, SEQ = 61, 16
SHAPE = dict(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=SEQ, init_std=0.1)
UNROLLED_RUN = Path(__file__).parent / "fixtures" / "unrolled_run"


def pair(family: str, **overrides: object) -> tuple[nnx.Module, nnx.Module]:
    """(unrolled model, scanned model) of ``family`` with the same parameters (the unrolled ones, stacked)."""
    fam = get_family(family)
    cfg = fam.config_cls(**{**SHAPE, **overrides})
    unrolled = fam.init(dataclasses.replace(cfg, scan_layers=False), VOCAB, seed=1)
    scanned_abstract = fam.abstract(dataclasses.replace(cfg, scan_layers=True), VOCAB)
    graphdef, like = nnx.split(scanned_abstract, nnx.Param)
    return unrolled, nnx.merge(graphdef, stack_tree(nnx.state(unrolled, nnx.Param), like))


@pytest.mark.parametrize("family,overrides", [
    ("llama", {}),  # scan_unroll 0: on a CPU all layers in one loop iteration
    ("llama", {"scan_unroll": 1}),  # the rolled loop, as on TPUs and GPUs
    ("llama", {"remat": "full", "scan_unroll": 1}),
    ("llama", {"remat": "save_dots", "scan_unroll": 2}),
    ("qwen2", {"tie_embeddings": False, "scan_unroll": 1}),  # q/k/v biases
    ("qwen3", {"head_dim": 16}),  # q/k norms
])
def test_scanned_logits_and_gradients_equal_the_unrolled_loop(family: str, overrides: dict) -> None:
    unrolled, scanned = pair(family, **overrides)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, VOCAB, (2, SEQ)), jnp.int32)
    segments = jnp.asarray(np.repeat([[1, 2]], SEQ // 2, axis=1).repeat(2, axis=0), jnp.int32)
    # jitted: one compile per model instead of op-by-op dispatch (the same computation, several times faster)
    forward = nnx.jit(lambda m, t, s: m(t, s))
    np.testing.assert_allclose(forward(scanned, tokens, segments), forward(unrolled, tokens, segments),
                               rtol=1e-5, atol=1e-5)

    @nnx.jit
    def grads(model: nnx.Module) -> nnx.State:
        def loss(m: nnx.Module) -> jax.Array:
            logits = m(tokens)
            return -jnp.mean(jax.nn.log_softmax(logits)[:, :-1].reshape(-1, VOCAB)[jnp.arange(2 * (SEQ - 1)),
                                                                                   tokens[:, 1:].reshape(-1)])
        return nnx.grad(loss)(model)

    got, want = grads(scanned), grads(unrolled)
    want_stacked = stack_tree(want, got)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want_stacked), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7, err_msg=jax.tree_util.keystr(path))


def test_layer_axis_is_axis_0_with_its_own_logical_name_and_the_unrolled_init_per_layer() -> None:
    """A scanned build draws what an unrolled build draws: layer i of every stacked parameter is the
    unrolled layer i, bit for bit, and the parameters after the blocks (the untied head) too."""
    fam = get_family("llama")
    cfg = LlamaConfig(**{**SHAPE, "n_layers": 8, "d_model": 64, "d_ff": 128, "init_std": 0.02, "tie_embeddings": False,
                         "qkv_bias": True, "qk_norm": True})
    scanned = nnx.state(fam.init(cfg, VOCAB, seed=5), nnx.Param)
    unrolled = nnx.state(fam.init(dataclasses.replace(cfg, scan_layers=False), VOCAB, seed=5), nnx.Param)
    wq = scanned["blocks"]["attn"]["wq"]
    assert wq.shape == (8, 64, 4, 16) and wq.get_metadata()["out_sharding"] == ("layers", "embed", "heads", "head_dim")
    flat = unrolled_pure(jax.tree.map(np.asarray, nnx.to_pure_dict(scanned)))
    want = jax.tree.map(np.asarray, nnx.to_pure_dict(unrolled))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(flat), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    stacked = np.asarray(wq[...])
    assert len({stacked[i].tobytes() for i in range(8)}) == 8  # each layer drew its own values
    # the residual-stream projections keep their depth-scaled init (a truncated normal: std 0.88 x its scale)
    assert np.std(np.asarray(scanned["blocks"]["mlp"]["w_down"][...])) == pytest.approx(0.88 * 0.02 / (2 * 8) ** 0.5,
                                                                                       rel=0.05)


def test_a_train_state_unstacks_and_restacks_exactly() -> None:
    train = TrainConfig(steps=4, batch_size=2, warmup_steps=1)
    mesh = build_mesh(train.mesh)
    cfg = LlamaConfig(**SHAPE)
    scanned = TrainProgram(cfg, train, VOCAB, mesh, seed=0)
    unrolled = TrainProgram(dataclasses.replace(cfg, scan_layers=False), train, VOCAB, mesh, seed=0)
    state = scanned.init_state()
    flat = unstack_tree(state, unrolled.abstract_state)
    back = stack_tree(flat, state)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)
    # the pure dict the HF exporter reads: one view per layer
    pure = unrolled_pure(nnx.to_pure_dict(state["params"]))
    np.testing.assert_array_equal(pure["blocks"][2]["mlp"]["w_up"],
                                  np.asarray(state["params"]["blocks"]["mlp"]["w_up"][...])[2])


def unrolled_run_copy(tmp_path: Path, **model: object) -> tuple[Path, dict]:
    """The fixture run folder (written by the unrolled code) in ``tmp_path``, and its config with ``model`` keys."""
    made = json.loads((UNROLLED_RUN / "continuation.json").read_text(encoding="utf-8"))
    shutil.copytree(UNROLLED_RUN / "run", tmp_path / "runs" / "tiny")
    config = tiny_config(tmp_path, **FIXTURE_STAGES, model={**made["model"], **model}, train=made["train"])
    return config, made


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.integration
def test_a_run_folder_of_the_unrolled_code_resumes_and_continues_as_it_did(tmp_path: Path, scan_layers: bool) -> None:
    config, made = unrolled_run_copy(tmp_path, scan_layers=scan_layers)
    run = tmp_path / "runs" / "tiny"
    proc = run_recipe("04_pretrain.py", config, "train.steps=8")
    assert "resumed from the checkpoint of step 4" in proc.stderr
    assert ("unrolled layers: restacked them" in proc.stderr) == scan_layers
    got = [{k: r[k] for k in DETERMINISTIC_KEYS if k in r} for r in log_records(run) if r["train/step"] > 4]
    want = made["steps"]
    assert [r["train/step"] for r in got] == [5, 6, 7, 8]
    for g, w in zip(got, want, strict=True):
        assert g["train/tokens_seen"] == w["train/tokens_seen"] and g["train/lr"] == w["train/lr"]
        for key in ("train/loss", "train/grad_norm"):
            assert g[key] == pytest.approx(w[key], rel=1e-6, abs=0), (key, g, w)
    manager = open_manager(run / "checkpoints")
    try:
        meta = read_meta(manager, 8)
    finally:
        manager.close()
    assert meta["layout"] == {"scan_layers": scan_layers, "layer_axis": 0 if scan_layers else None}
    # evaluation rebuilds the model in the layout its checkpoint has
    from experiment.runfolder import RunFolder

    model, step, _ = load_trained_model(RunFolder(run))
    assert step == 8 and isinstance(model.blocks, nnx.List) != scan_layers


@pytest.mark.integration
def test_a_branch_of_an_unrolled_parent_trains_scanned_from_its_restacked_checkpoint(tmp_path: Path) -> None:
    """A decay branch (train.branch_from) whose parent is the unrolled code's run folder: the branch's first
    session restores the parent's step 4 in the parent's layout, restacks it, and continues as the parent's
    own continuation did (the branch keeps the parent's constant schedule)."""
    config, made = unrolled_run_copy(tmp_path)
    proc = run_recipe("04_pretrain.py", config, "experiment.name=branch", "train.branch_from=tiny",
                      "train.branch_step=4", "train.steps=6")
    assert "unrolled layers: restacked them" in proc.stderr
    got = [r for r in log_records(tmp_path / "runs" / "branch") if r["train/step"] > 4]
    assert [r["train/step"] for r in got] == [5, 6]
    for g, w in zip(got, made["steps"][:2], strict=True):
        assert g["train/loss"] == pytest.approx(w["train/loss"], rel=1e-6, abs=0)
