"""Multi-token prediction (DeepSeek-V3's MTP, model/deepseek_v3/model.py): the targets each depth is scored
against, the weight-0 step that is the plain model's bit for bit, and the loss trained by recipe 04 on the fixture
corpus, logged apart."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from model.loss import Labels, targets_ahead
from model.registry import get_family

DEEPSEEK = get_family("deepseek_v3")
TINY = DEEPSEEK.tiny_config()
VOCAB, SEQ = 97, 16


def test_each_depth_is_scored_against_the_token_k_further_inside_its_document() -> None:
    targets = jnp.asarray([[10, 11, 12, 13, 14, 15]])
    segments = jnp.asarray([[1, 1, 1, 2, 2, 2]])
    weights = jnp.asarray([[1, 1, 1, 1, 0, 1]], jnp.float32)  # position 4 trains nothing
    ahead, keep = targets_ahead(Labels(targets, None, 0), None, 2)
    assert ahead.tolist() == [[12, 13, 14, 15, 0, 0]] and keep.tolist() == [[1, 1, 1, 1, 0, 0]]
    ahead, keep = targets_ahead(Labels(targets, weights, 0), segments, 1)
    # position 2 -> 3 crosses into document 2; 3 -> 4 and 4 -> 5 touch the untrained position 4; 5 leaves the row
    assert ahead.tolist() == [[11, 12, 13, 14, 15, 0]] and keep.tolist() == [[1, 1, 0, 0, 0, 0]]


def program(**model: object):  # noqa: ANN201 - a TrainProgram and its batch
    from experiment.sections.train import MeshConfig, TrainConfig
    from model.sharding import build_mesh
    from trainer.step import TrainProgram, global_batch

    train_cfg = TrainConfig(steps=10, batch_size=4, learning_rate=1e-2, warmup_steps=1, mesh=MeshConfig(data=1),
                            grad_clip=1.0)
    cfg = dataclasses.replace(TINY, **model)
    mesh = build_mesh(train_cfg.mesh, jax.devices()[:1], DEEPSEEK.mesh_rules(train_cfg.mesh.rules))
    prog = TrainProgram(cfg, train_cfg, VOCAB, mesh, seed=0)
    rows = np.random.default_rng(2).integers(0, VOCAB, (4, SEQ + 1)).astype(np.int32)
    segments = np.repeat([[1] * 10 + [2] * (SEQ - 10)], 4, axis=0).astype(np.int32)
    positions = np.concatenate([np.arange(10), np.arange(SEQ - 10)])[None].repeat(4, axis=0).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:], "segment_ids": segments,
                          "positions": positions}, prog.batch_sharding)
    return prog, batch


def run_steps(prog, batch, n: int) -> tuple[list[dict[str, float]], dict]:  # noqa: ANN001
    state, records = prog.init_state(), []
    for _ in range(n):
        state, metrics = prog.step(state, batch)
        records.append({k: float(v) for k, v in metrics.items() if np.ndim(v) == 0})
    return records, state


def test_weight_zero_keeps_the_modules_and_steps_as_the_plain_model_bit_for_bit() -> None:
    """A model with a prediction module at weight 0 and one without: the same losses, gradient norms and main
    weights after four steps, bit for bit (the module is built after the main model, gets no gradient, adds nothing
    to the clipped norm, and its MoE layer's load moves no main bias), and the module as it started; at weight 0.3
    the steps differ."""
    plain, batch = program(mtp_layers=0)
    kept, _ = program(mtp_layers=1, mtp_loss_weight=0.0)
    trained, _ = program(mtp_layers=1, mtp_loss_weight=0.3)
    plain_log, plain_state = run_steps(plain, batch, 4)
    kept_log, kept_state = run_steps(kept, batch, 4)
    for a, b in zip(plain_log, kept_log, strict=True):
        for key in ("loss", "total_loss", "grad_norm", "aux/load_balance", "aux/mtp"):
            assert a[key] == b[key], (key, a[key], b[key])
    assert "aux/mtp/loss_1" not in kept_log[0] and kept_log[0]["aux/mtp"] == 0.0
    main = {k: v for k, v in kept_state["params"].items() if k != "mtp"}
    for x, y in zip(jax.tree.leaves(plain_state["params"]), jax.tree.leaves(main), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # the kept module is not trained: not even AdamW's weight decay moves it (ModelFamily.idle_params)
    for x, y in zip(jax.tree.leaves(kept.init_state()["params"]["mtp"]), jax.tree.leaves(kept_state["params"]["mtp"]),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    trained_log, _ = run_steps(trained, batch, 3)
    assert trained_log[0]["loss"] == plain_log[0]["loss"]  # the same start: the module runs beside, not inside
    # its gradient reaches the main model (step 1 is warmup's zero learning rate)
    assert trained_log[2]["loss"] != plain_log[2]["loss"]
    assert trained_log[0]["aux/mtp"] == pytest.approx(0.3 * trained_log[0]["aux/mtp/loss_1"], rel=1e-6)
    assert trained_log[0]["aux/mtp/loss_1"] == pytest.approx(np.log(VOCAB), rel=0.2)  # a fresh module: ~uniform


def test_the_module_reads_the_main_hidden_state_and_the_next_tokens_embedding() -> None:
    """Depth 1 at position i sees token i + 1 (its embedding) and nothing later: changing the last input token
    changes the depth's hidden state only at the position before it; the main model's states at none but its own."""
    from flax import nnx

    cfg = dataclasses.replace(TINY, scan_layers=False, mtp_loss_weight=0.3)
    model = DEEPSEEK.init(cfg, VOCAB, seed=0)
    tokens = np.random.default_rng(3).integers(0, VOCAB, (1, SEQ)).astype(np.int32)
    changed = tokens.copy()
    changed[0, -1] = (changed[0, -1] + 1) % VOCAB

    @nnx.jit
    def states(m, t):  # noqa: ANN001, ANN202 - the main model's last hidden states and depth 1's
        hidden = m.hidden(t)
        return hidden, m.mtp_states(hidden, t)[0][0]

    hidden_a, mtp_a = (np.asarray(x) for x in states(model, jnp.asarray(tokens)))
    hidden_b, mtp_b = (np.asarray(x) for x in states(model, jnp.asarray(changed)))
    main_moved = np.abs(hidden_a - hidden_b).max(axis=-1)[0] > 0
    mtp_moved = np.abs(mtp_a - mtp_b).max(axis=-1)[0] > 0
    assert main_moved.tolist() == [False] * (SEQ - 1) + [True]
    assert mtp_moved.tolist() == [False] * (SEQ - 2) + [True, True]


@pytest.mark.slow
def test_recipe_04_trains_the_prediction_loss_on_the_fixture_corpus_and_logs_it_apart(
        fixture_stages: Path, tmp_path: Path) -> None:
    """DeepSeek-V3's tiny shape with one prediction module pretrained by recipe 04 on the fixture corpus (Russian
    text, its own tokenizer): every step logs the module's unweighted loss and its weighted share of the total,
    and the loss falls; the checkpoint holds the module."""
    from tests.fixture_run import run_copy
    from tests.recipe_runner import run_recipe

    config = run_copy(fixture_stages, tmp_path, train={"steps": 24, "checkpoint_every": 24, "warmup_steps": 2,
                                                       "log_every": 1, "learning_rate": 3e-3},
                      eval={"tasks": [], "train_tasks": [], "max_validation_batches": 1, "missing_tasks": "skip"},
                      wandb={"mode": "disabled"})
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    cfg["model"] = {"family": "deepseek_v3", "preset": "tiny", "mtp_loss_weight": 0.3}
    config.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    run_recipe("04_pretrain.py", config)
    run = tmp_path / "runs" / "tiny"
    steps = [r for r in map(json.loads, (run / "train_log.jsonl").read_text("utf-8").splitlines())
             if "train/loss" in r]
    assert [r["train/step"] for r in steps] == list(range(1, 25))
    mtp = [r["train/aux/mtp/loss_1"] for r in steps]
    for r in steps:
        assert r["train/aux/mtp"] == pytest.approx(0.3 * r["train/aux/mtp/loss_1"], rel=1e-5)
        assert r["train/total_loss"] == pytest.approx(r["train/loss"] + r["train/aux/load_balance"]
                                                      + r["train/aux/mtp"], rel=1e-5)
    first, last = np.mean(mtp[:3]), np.mean(mtp[-3:])
    main = [r["train/loss"] for r in steps]
    print(f"mtp/loss_1: first three steps {first:.3f}, last three {last:.3f}; main loss "
          f"{np.mean(main[:3]):.3f} -> {np.mean(main[-3:]):.3f}")
    assert last < first - 0.5, mtp


def test_a_deepseek_v3_base_with_its_prediction_module_is_continued_and_exported_with_it(
        fixture_stages: Path, tmp_path: Path) -> None:
    """docs/launch.md's GigaChat 3 walk-through at the tiny shape: a Hugging Face folder of the family (its MTP
    layer included, as GigaChat 3's checkpoints have it) continued by recipe 04 through model.init_from, then
    exported by recipe 05b: the export has the module, trained (it moved), under the checkpoint's names, with its
    embedding and head copies, and imports again."""

    from safetensors.numpy import load_file

    from model.hf_checkpoint import load_hf_checkpoint
    from tests.fixture_run import data_from_config
    from tests.recipe_runner import run_recipe
    from tests.test_continue_pretraining import hf_base_folder

    (tmp_path / "base").mkdir()
    base = hf_base_folder(tmp_path / "base", TINY)
    config = data_from_config(fixture_stages, tmp_path, "mtp-cpt",
                              {"family": "deepseek_v3", "init_from": str(base), "vocab_adaptation": "mean",
                               "max_seq_len": 64, "mtp_loss_weight": 0.3},
                              train={"steps": 3, "checkpoint_every": 3, "warmup_steps": 1, "log_every": 1},
                              wandb={"mode": "disabled"})
    run_recipe("04_pretrain.py", config)
    run = tmp_path / "runs" / "mtp-cpt"
    steps = [r for r in map(json.loads, (run / "train_log.jsonl").read_text("utf-8").splitlines())
             if "train/loss" in r]
    assert [r["train/step"] for r in steps] == [1, 2, 3] and all(r["train/aux/mtp/loss_1"] > 0 for r in steps)
    # the run's records name the model it trained (the base's shape), not the YAML's few model keys
    recorded = yaml.safe_load((run / "config.resolved.yaml").read_text(encoding="utf-8"))["model"]
    assert (recorded["family"], recorded["n_layers"], recorded["mtp_layers"], recorded["kv_lora_rank"],
            recorded["mtp_loss_weight"]) == ("deepseek_v3", TINY.n_layers, 1, TINY.kv_lora_rank, 0.3)
    run_recipe("05b_export_hf.py", config)
    out = run / "export" / "hf" / "step_0000003"
    exported, before = load_file(str(out / "model.safetensors")), load_file(str(base / "model.safetensors"))
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["num_nextn_predict_layers"] == 1
    layer = f"model.layers.{TINY.n_layers}"
    assert {name for name in before if name.startswith(layer)} == {name for name in exported if name.startswith(layer)}
    np.testing.assert_array_equal(exported[f"{layer}.embed_tokens.weight"], exported["model.embed_tokens.weight"])
    np.testing.assert_array_equal(exported[f"{layer}.shared_head.head.weight"], exported["lm_head.weight"])
    assert not np.array_equal(exported[f"{layer}.eh_proj.weight"], before[f"{layer}.eh_proj.weight"])  # trained
    assert load_hf_checkpoint(out).model_cfg.mtp_layers == 1
