"""Model families: a toy family from one test module runs through recipes 04, 05 and 07, the fit check's
costs, and the Llama family's HF adapter imports what it exports."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from experiment.config import load_config
from experiment.errors import ConfigError
from model.family import FamilyModel
from model.registry import families, family_of, get_family
from tests.fixture_run import checkpoint_contents, run_copy
from tests.recipe_runner import REPO, error_line, run_recipe
from tests.toy_family import NAME, TOY, ToyConfig
from trainer.trained_model import load_trained_model

HELDOUT = REPO / "tests" / "fixtures" / "corpus" / "ru_news.txt"  # the fixture corpus has no validation split
TOY_MODEL = {"family": NAME, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}


def toy_config(stages: Path, root: Path) -> Path:
    """The tiny fixture experiment with its ``model:`` section replaced by the toy family's."""
    config = run_copy(stages, root, train={"steps": 2, "checkpoint_every": 2, "warmup_steps": 1, "log_every": 1},
                      eval={"tasks": [], "export_hf": True, "heldout_text_files": [str(HELDOUT)]},
                      cost={"plan_options": [{"accelerator": "tpu-v5e", "chips": 8, "mfu": 0.5}]})
    tree = yaml.safe_load(config.read_text(encoding="utf-8"))
    tree["model"] = dict(TOY_MODEL)
    config.write_text(yaml.safe_dump(tree, allow_unicode=True), encoding="utf-8")
    return config


@pytest.fixture
def plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recipe subprocesses import the toy family's module (and can find it: the repo on their path)."""
    monkeypatch.setenv("RU_PRETRAIN_PLUGINS", "tests.toy_family")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def test_registry_lookups_and_the_toy_section_class() -> None:
    assert {"llama", NAME} <= set(families())
    with pytest.raises(ConfigError, match=r"unknown model family 'gpt9' \(known: .*llama"):
        get_family("gpt9")
    cfg = load_config(REPO / "tests" / "configs" / "tiny.yaml", [f"model={json.dumps(TOY_MODEL)}"])
    assert isinstance(cfg.model, ToyConfig) and family_of(cfg.model) is TOY
    with pytest.raises(ConfigError, match="unknown config key 'model.n_kv_heads'"):  # read by the toy's class
        load_config(REPO / "tests" / "configs" / "tiny.yaml", [f"model={json.dumps({**TOY_MODEL, 'n_kv_heads': 1})}"])


def test_a_familys_own_rules_apply_and_its_axis_names_are_accepted_from_yaml() -> None:
    import jax
    from flax import nnx

    from experiment.sections.train import MeshConfig
    from model.sharding import build_mesh, tree_shardings

    tiny, toy = REPO / "tests" / "configs" / "tiny.yaml", f"model={json.dumps(TOY_MODEL)}"
    mesh = build_mesh(MeshConfig(), jax.devices()[:1])

    def qkv_spec(overrides: list[str]) -> tuple:
        cfg = load_config(tiny, [toy, *overrides])
        rules = family_of(cfg.model).mesh_rules(cfg.train.mesh.rules)
        shardings = tree_shardings(nnx.state(TOY.abstract(cfg.model, 50), nnx.Param), mesh, rules)
        return tuple(shardings["blocks"]["qkv"].get_value().spec)  # [layers, embed, qkv, mlp]

    # the toy's defaults: embed replicated (Llama's rule for the same name splits it over fsdp)
    assert qkv_spec([]) == (None, None, None, "tensor")
    assert get_family("llama").mesh_rules({})["embed"] == ["fsdp"] and TOY.mesh_rules({})["embed"] == []
    # its own axis name and a changed default, from YAML; the names the YAML does not give keep the family's
    assert qkv_spec(['train.mesh.rules={"qkv": ["tensor"], "embed": ["fsdp"]}']) == (None, "fsdp", "tensor", None)
    with pytest.raises(ConfigError, match=r"^config key 'train.mesh.rules': unknown logical axes \['qkv'\] for the "
                                          r"llama family \(its parameters and activations use: act_embed, "):
        load_config(tiny, ['train.mesh.rules={"qkv": []}'])
    with pytest.raises(ConfigError, match=r"unknown logical axes \['heads'\] for the toy_mha family"):
        load_config(tiny, [toy, 'train.mesh.rules={"heads": []}'])  # a Llama name the toy does not use


def test_toy_family_trains_evaluates_and_plans_through_the_recipes(fixture_stages: Path, tmp_path: Path,
                                                                  plugin_env: None) -> None:
    config = toy_config(fixture_stages, tmp_path)
    run_dir = tmp_path / "runs" / "tiny"
    run_recipe("04_pretrain.py", config)
    _, items = checkpoint_contents(run_dir, 2)
    meta = items["meta"]
    vocab = meta["vocab_size"]
    toy_cfg = ToyConfig(**{k: v for k, v in meta["model"].items()})
    assert meta["family"] == NAME and meta["model"]["family"] == NAME
    assert meta["n_params"] == TOY.param_count(toy_cfg, vocab)
    arrays, _ = checkpoint_contents(run_dir, 2)
    params = {k: v for k, v in arrays.items() if k.startswith("params")}
    assert sum(v.size for v in params.values()) == meta["n_params"]
    assert any("qkv" in k for k in params) and not any("wk" in k for k in params)  # the toy's own module

    evaluated = run_recipe("05_evaluate.py", config)
    assert "Hugging Face export skipped: the 'toy_mha' model family has no Hugging Face adapter" in evaluated.stderr
    results = json.loads((run_dir / "eval" / "step_0000002.json").read_text(encoding="utf-8"))
    assert "hf_export" not in results and not (run_dir / "eval" / "hf").exists()
    assert 0 < results["heldout"][str(HELDOUT)]["bits_per_byte"] < 20  # scored by the toy model
    model, step, _ = load_trained_model(SimpleNamespace(checkpoints=run_dir / "checkpoints"))
    assert type(model).__name__ == "ToyDecoder" and step == 2  # what recipe 05 rebuilt from the meta

    run_recipe("07_plan_costs.py", config)
    with (run_dir / "reports" / "plan.csv").open(encoding="utf-8") as handle:
        (row,) = list(csv.DictReader(handle))
    seq_len = json.loads((run_dir / "shards" / "manifest.json").read_text(encoding="utf-8"))["seq_len"]
    toy_flops = TOY.flops(toy_cfg, vocab, seq_len)
    assert float(row["tokens_per_s_per_chip"]) == pytest.approx(0.5 * float(row["peak_tflops"]) * 1e12 / toy_flops)
    assert float(row["state_gib_per_device"]) == pytest.approx(meta["n_params"] * 16 / 8 / 2**30)
    assert float(row["recompute"]) == 1.0


def test_fit_check_costs_come_from_the_family() -> None:
    from experiment.sections.train import TrainConfig
    from trainer.fit_check import setting_costs

    cfg, train_cfg = ToyConfig(), TrainConfig(batch_size=4, loss_chunk_len=16)
    costs = setting_costs(cfg, train_cfg, 100, 64, "tpu")
    _, model_flops, hardware_flops = TOY.train_costs(cfg, 100, 64, "tpu", "bfloat16", 16)
    assert costs["attention_kernel"] == "einsum"
    assert costs["model_flops_per_step"] == model_flops * 4 * 64 == TOY.flops(cfg, 100, 64) * 4 * 64
    assert costs["recompute_factor"] == pytest.approx(hardware_flops / model_flops) and hardware_flops > model_flops


def test_toy_param_count_matches_the_module() -> None:
    import jax
    from flax import nnx

    cfg = ToyConfig()
    model = TOY.init(cfg, 50, seed=1)
    assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == TOY.param_count(cfg, 50)
    tokens = np.arange(12, dtype=np.int32).reshape(2, 6) % 50
    assert type(model).__name__ == "ToyDecoder" and model(tokens).shape == (2, 6, 50)
    assert isinstance(model, FamilyModel) and model.hidden(tokens).shape == (2, 6, 32)


@pytest.mark.integration
def test_unimportable_plugin_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RU_PRETRAIN_PLUGINS", "tests.no_such_family_module")
    config = tmp_path / "tiny.yaml"
    config.write_text((REPO / "tests" / "configs" / "tiny.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    proc = run_recipe("07_plan_costs.py", config, check=False)
    assert proc.returncode == 2
    assert error_line(proc).startswith("error: environment variable RU_PRETRAIN_PLUGINS: module "
                                       "'tests.no_such_family_module' failed to import (ModuleNotFoundError")


@pytest.mark.parametrize("tie", [True, False])
def test_llama_hf_adapter_imports_what_it_exports(tie: bool) -> None:
    import jax.numpy as jnp
    from flax import nnx

    from model.llama.config import LlamaConfig

    llama = get_family("llama")
    cfg = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64, init_std=0.3,
                      tie_embeddings=tie, rope_theta=500.0, norm_eps=1e-6)
    model = llama.init(cfg, 61, seed=2)
    tensors, hf_config = llama.hf_adapter.export(model, cfg, 61, {"eos": 3})
    imported_cfg, params = llama.hf_adapter.import_(json.loads(json.dumps(hf_config)), tensors)
    assert imported_cfg == dataclasses.replace(cfg, init_std=LlamaConfig().init_std)  # init is not a model property
    back = nnx.merge(nnx.graphdef(llama.abstract(imported_cfg, 61)), params)
    for a, b in zip(jax_leaves(back), jax_leaves(model), strict=True):
        np.testing.assert_array_equal(a, b)
    tokens = jnp.asarray(np.arange(20, dtype=np.int32).reshape(2, 10) % 61)
    np.testing.assert_array_equal(np.asarray(back(tokens)), np.asarray(model(tokens)))

    with pytest.raises(Exception, match="tensor 'model.norm.weight' is missing"):
        llama.hf_adapter.import_(hf_config, {k: v for k, v in tensors.items() if k != "model.norm.weight"})
    with pytest.raises(Exception, match="has no place in the llama model"):
        llama.hf_adapter.import_(hf_config,
                                 {**tensors, "model.layers.9.mlp.up_proj.weight": tensors["model.norm.weight"]})
    with pytest.raises(ConfigError, match="attention_bias=True is not supported"):
        llama.hf_adapter.import_({**hf_config, "attention_bias": True}, tensors)
    assert dataclasses.asdict(imported_cfg)["family"] == "llama"


def jax_leaves(model: object) -> list[np.ndarray]:
    import jax
    from flax import nnx

    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_resume_checks_the_family_and_takes_old_checkpoints_as_llama() -> None:
    from experiment.errors import DataError
    from trainer.resume import check_same_run

    before_families = {"model": {"d_model": 64}, "vocab_size": 600}
    check_same_run(before_families, {"model": {"family": "llama", "d_model": 64}, "vocab_size": 600}, "x")
    with pytest.raises(DataError, match="different model .*family: llama -> toy_mha"):
        check_same_run(before_families, {"model": {"family": NAME, "d_model": 64}, "vocab_size": 600}, "x")


def test_checkpoint_meta_rebuilds_the_config_of_its_family() -> None:
    from model.llama.config import LlamaConfig
    from trainer.trained_model import model_config_from_meta

    # a meta without a layout was written by the unrolled code: its parameters are per layer
    assert model_config_from_meta({"model": {"d_model": 64, "attention": "splash"}}) == LlamaConfig(
        d_model=64, scan_layers=False)
    scanned = {"model": {"d_model": 64, "scan_layers": False}, "layout": {"scan_layers": True, "layer_axis": 0}}
    assert model_config_from_meta(scanned) == LlamaConfig(d_model=64, scan_layers=True)  # the layout, not the key
    assert model_config_from_meta(
        {"family": NAME, "model": dict(TOY_MODEL), "layout": {"scan_layers": True}}) == ToyConfig(**TOY_MODEL)
    with pytest.raises(ConfigError, match="unknown model family 'gone'"):
        model_config_from_meta({"family": "gone", "model": {}})
