"""The experiment config, manifests and atomic writes every stage relies on."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from experiment.config import build_dataclass, load_config
from experiment.errors import ConfigError, DataError, MissingStageError
from experiment.files import atomic_open, atomic_write_json
from experiment.manifest import invalidate, read_manifest, write_manifest
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.split import is_validation

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "recipes" / "configs" / "demo.yaml"


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_demo_config_loads_with_overrides():
    cfg = load_config(DEMO, ["train.steps=7", "train.warmup_steps=2", "train.learning_rate=1e-4", "model.d_model=64"])
    assert cfg.train.steps == 7
    assert cfg.train.learning_rate == pytest.approx(1e-4)
    assert cfg.model.d_model == 64
    assert cfg.experiment.name == "demo"


def test_misspelled_key_names_the_nearest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'train\.stpes'; did you mean 'train\.steps'"):
        load_config(DEMO, ["train.stpes=5"])


def test_misspelled_section_is_rejected(tmp_path):
    path = write_yaml(tmp_path, "experiment: {name: x}\ntrian: {steps: 3}\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'trian'; did you mean 'train'"):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.steps=abc", r"'train\.steps': expected an integer"),
        ("train.steps=1.5", r"'train\.steps': expected an integer"),
        ("train.learning_rate=fast", r"'train\.learning_rate': expected a number"),
        ("tokenizer.model_type=wordpiece", r"'tokenizer\.model_type': 'wordpiece' is not one of"),
        ("wandb.mode=offlien", r"did you mean 'offline'"),
        ("corpus.sources=3", r"'corpus\.sources': expected a list"),
    ],
)
def test_wrong_types_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(DEMO, [override])


def test_missing_required_name(tmp_path):
    with pytest.raises(ConfigError, match="missing required config key in 'experiment': name"):
        load_config(write_yaml(tmp_path, "experiment: {seed: 1}\n"))


def test_env_expansion_with_default(monkeypatch, tmp_path):
    monkeypatch.delenv("NO_SUCH_VAR_X", raising=False)
    path = write_yaml(tmp_path, "experiment: {name: x, run_root: '${NO_SUCH_VAR_X:-/tmp/r}'}\n")
    assert load_config(path).experiment.run_root == "/tmp/r"
    monkeypatch.setenv("NO_SUCH_VAR_X", "/data/runs")
    assert load_config(path).experiment.run_root == "/data/runs"
    bad = write_yaml(tmp_path, "experiment: {name: x, run_root: '${NO_SUCH_VAR_Y}'}\n")
    with pytest.raises(ConfigError, match="NO_SUCH_VAR_Y is not set"):
        load_config(bad)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="not of the form key.sub=value"):
        load_config(DEMO, ["train.steps"])


def test_a_date_yaml_cannot_build_is_one_line_naming_the_override_or_the_file(tmp_path):
    """YAML reads 2025-13-01 as a date and fails to build it (month 13) before any check of ours could run."""
    with pytest.raises(ConfigError, match=r"override 'cost.usd_rub_date=2025-13-01': the value is not a valid date "
                                          r"\(YYYY-MM-DD\) \(month must be in 1..12\)"):
        load_config(DEMO, ["cost.usd_rub_date=2025-13-01"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment:\n  name: x\ncost:\n  usd_rub_date: 2025-13-01\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(f"config file {bad}: a value YAML reads as a date or number is "
                                                    "not a valid one (month must be in 1..12)")):
        load_config(bad)


def test_build_dataclass_round_trip_of_defaults():
    cfg = build_dataclass(ExperimentConfig, {"experiment": {"name": "x"}})
    assert cfg.train.mesh.data == -1


def test_manifest_lifecycle(tmp_path):
    stage = tmp_path / "corpus"
    with pytest.raises(MissingStageError, match="run recipes/01_build_corpus.py first"):
        read_manifest(stage, "corpus", "recipes/01_build_corpus.py")
    write_manifest(stage, "corpus", {"documents": 3})
    assert read_manifest(stage, "corpus", "r")["documents"] == 3
    with pytest.raises(DataError, match="belongs to stage 'corpus'"):
        read_manifest(stage, "shards", "r")
    invalidate(stage)
    with pytest.raises(MissingStageError):
        read_manifest(stage, "corpus", "r")


def test_corrupt_manifest_is_an_error(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError, match="not a readable manifest"):
        read_manifest(tmp_path, "corpus", "r")


def test_atomic_write_leaves_old_file_on_crash(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_json(target, {"v": 1})
    with pytest.raises(RuntimeError), atomic_open(target) as handle:
        handle.write('{"v": 2, "half')
        raise RuntimeError("crash mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_split_is_stable_and_near_the_share():
    ids = [f"doc-{i}" for i in range(20_000)]
    share = sum(is_validation(i, 5.0) for i in ids) / len(ids)
    assert 0.04 < share < 0.06
    assert [is_validation(i, 5.0) for i in ids[:100]] == [is_validation(i, 5.0) for i in ids[:100]]
    assert not any(is_validation(i, 0.0) for i in ids)


def test_run_folder_saves_resolved_config(tmp_path):
    cfg = load_config(DEMO, [f"experiment.run_root={tmp_path}"])
    folder = RunFolder.for_config(cfg)
    path = folder.save_resolved_config(cfg, "corpus")
    assert path.is_file() and "name: demo" in path.read_text(encoding="utf-8")
    assert len(os.listdir(folder.root / "configs")) == 1


# --- presets, families and the one sequence length: resolved once, at load ---------------------------------

PRESET_ONLY = "experiment: {name: p}\nmodel: {preset: '1b'}\n"


def test_preset_fills_only_the_keys_the_config_does_not_set(tmp_path):
    path = write_yaml(tmp_path, PRESET_ONLY)
    cfg = load_config(path, ["model.n_kv_heads=2"])
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads, cfg.model.max_seq_len) == (2048, 16, 32, 2048)
    assert cfg.model.n_kv_heads == 2
    # a set key wins even when it equals the schema default (n_layers 4, tie_embeddings true)
    assert load_config(path, ["model.n_layers=4"]).model.n_layers == 4
    assert load_config(path, ["model.preset=7b", "model.tie_embeddings=true"]).model.tie_embeddings is True
    assert load_config(path, ["model.preset=7b"]).model.tie_embeddings is False
    # a key in the YAML wins over a preset given as an override
    assert load_config(DEMO, ["model.preset=1b"]).model.d_model == 256


def test_unknown_preset_is_one_line_listing_the_known(tmp_path):
    with pytest.raises(ConfigError, match=r"^config key 'model.preset': unknown preset '2b' of the llama family "
                                          r"\(known: demo-5m, 125m"):
        load_config(write_yaml(tmp_path, PRESET_ONLY), ["model.preset=2b"])


def test_resolved_config_file_records_the_presets_shape(tmp_path):
    import yaml

    cfg = load_config(write_yaml(tmp_path, PRESET_ONLY), [f"experiment.run_root={tmp_path}", "model.n_kv_heads=2"])
    path = RunFolder.for_config(cfg).save_resolved_config(cfg, "pretrain")
    model = yaml.safe_load(path.read_text(encoding="utf-8"))["model"]
    assert (model["preset"], model["family"], model["d_model"], model["n_layers"]) == ("1b", "llama", 2048, 16)
    assert (model["n_kv_heads"], model["d_ff"], model["max_seq_len"]) == (2, 5632, 2048)


def test_model_section_is_built_with_the_familys_class(tmp_path):
    import dataclasses

    from experiment.sections.model import model_section_class, register_model_section
    from model.llama.config import LlamaConfig

    @dataclasses.dataclass
    class NoGqaConfig(LlamaConfig):
        mlp_ratio: float = 4.0

    path = write_yaml(tmp_path, PRESET_ONLY)
    with pytest.raises(ConfigError, match=r"^config key 'model.family': unknown model family 'nogqa' "
                                          r"\(known: ([\w-]+, )*llama(, [\w-]+)*\)$"):
        load_config(path, ["model.family=nogqa"])
    with pytest.raises(ConfigError, match=r"unknown config key 'model.mlp_ratio'"):
        load_config(path, ["model.mlp_ratio=2.5"])
    register_model_section("nogqa", NoGqaConfig, LlamaConfig.AXIS_RULES)
    try:
        cfg = load_config(path, ["model.family=nogqa", "model.mlp_ratio=2.5"])
        assert type(cfg.model) is NoGqaConfig and cfg.model.mlp_ratio == 2.5 and cfg.model.d_model == 2048
        assert model_section_class("llama") is LlamaConfig
    finally:
        from experiment.sections import model as sections_model

        sections_model._PLUGIN_SECTIONS.pop("nogqa")
        sections_model._PLUGIN_AXIS_RULES.pop("nogqa")


def test_explicit_keys_belong_to_each_loaded_config_not_the_class(tmp_path):
    path = write_yaml(tmp_path, PRESET_ONLY)
    first = load_config(path, ["model.d_model=512"])
    second = load_config(path)
    assert "model.d_model" in first.explicit_keys and "model.d_model" not in second.explicit_keys
    assert "model.preset" in second.explicit_keys
    assert ExperimentConfig.explicit_keys == frozenset()  # nothing a load set stays on the class


@pytest.mark.parametrize("key", ["shards.seq_len=64", "cost.plan_seq_len=4096"])
def test_removed_length_keys_say_what_replaced_them(key):
    name = key.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^config key '{name}' was removed: .*model\.max_seq_len"):
        load_config(DEMO, [key])


def test_cross_section_rules_are_checked_at_load():
    with pytest.raises(ConfigError, match=r"'model.attention': cudnn .* train.compute_dtype=bfloat16"):
        load_config(DEMO, ["model.attention=cudnn"])
    assert load_config(DEMO, ["model.attention=cudnn", "train.compute_dtype=bfloat16"]).model.attention == "cudnn"


def test_environment_is_expanded_once_in_absent_and_present_sections(monkeypatch, tmp_path):
    # the variable's value itself holds "${...}": expanding twice would read NOT_SET_ANYWHERE and fail
    monkeypatch.setenv("RU_SHARED_DATA", "/data/${NOT_SET_ANYWHERE}")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    absent = load_config(write_yaml(tmp_path, "experiment: {name: x}\n"))
    assert absent.eval.bench_dir == "/data/${NOT_SET_ANYWHERE}/bench"  # a default_factory section, built at load
    assert absent.eval.rublimp_dir == ""  # RuBLiMP follows eval.bench_dir
    present = load_config(write_yaml(tmp_path, "experiment: {name: x}\neval: {batch_size: 4, missing_tasks: skip}\n"))
    assert present.eval.bench_dir == absent.eval.bench_dir

    from eval.run import load_tasks  # the eval stage reads the loaded paths as they are

    skipped: dict[str, str] = {}
    assert load_tasks(["rublimp"], present.eval, 5, skipped) == []
    assert "/data/${NOT_SET_ANYWHERE}/bench/rublimp" in skipped["rublimp"]


def test_a_credential_is_expanded_for_the_run_and_recorded_as_written(tmp_path, monkeypatch):
    from experiment.config import dump_yaml, is_secret_var

    monkeypatch.setenv("HF_TOKEN", "hf_secret123")
    monkeypatch.setenv("RU_PLAIN_DIR", "/data/plain")
    path = write_yaml(tmp_path, "experiment: {name: x, description: 'tok ${HF_TOKEN}', run_root: '${RU_PLAIN_DIR}'}\n")
    cfg = load_config(path)
    assert cfg.experiment.description == "tok hf_secret123"  # what the running code reads
    text = dump_yaml(cfg)
    assert "description: tok ${HF_TOKEN}" in text and "hf_secret123" not in text
    assert "run_root: /data/plain" in text  # a variable that is no credential is recorded expanded
    assert all(map(is_secret_var, ["WANDB_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "db_password",
                                   "GOOGLE_APPLICATION_CREDENTIALS", "AWS_SECRET_ACCESS_KEY"]))
    assert not any(map(is_secret_var, ["RU_SHARED_DATA", "HOME", "KEYBOARD"]))


@pytest.mark.parametrize("override", ["cost.usd_rub_rate=.nan", "train.grad_clip=.nan", "train.learning_rate=.nan",
                                      "train.learning_rate=nan", "cost.usd_rub_rate=.inf", "train.grad_clip=-.inf"])
def test_a_number_that_is_not_finite_names_the_key(override):
    key = override.split("=")[0].replace(".", r"\.")
    with pytest.raises(ConfigError, match=rf"^config key '{key}': expected a finite number"):
        load_config(DEMO, [override])


def test_invalid_yaml_names_the_file_line_and_column(tmp_path):
    path = write_yaml(tmp_path, "experiment:\n  name: x\n   seed: 1\n")
    with pytest.raises(ConfigError, match=r"exp\.yaml is not valid YAML: line 3, column 8: mapping values are not "
                                          r"allowed here$"):
        load_config(path)
    path = write_yaml(tmp_path, "experiment:\n  name: x\n  seed: [1, 2\ntrain: {steps: 3}\n")
    with pytest.raises(ConfigError, match=r"line 4, column 6: .*flow sequence that starts at line 3, column 9\)$"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^override 'wandb\.tags=\[\$\{X\}\]': the value is not valid YAML \(line 1"):
        load_config(DEMO, ["wandb.tags=[${X}]"])


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.batch_size=15", "train.mesh={data: 2}"], r"micro-batch of 15 sequences .* not divisible by the data axis "
                                                      r"size 2, the mesh axes that split the batch"),
    (["train.batch_size=24", "train.grad_accum_steps=2", "train.mesh={data: -1, fsdp: 8}"],
     r"micro-batch of 12 sequences .* not divisible by the fsdp axis size 8"),
    (["train.batch_size=16", "train.mesh={data: 2, fsdp: 4, rules: {batch: [data, fsdp, tensor]}, tensor: 3}"],
     r"not divisible by the data x fsdp x tensor axis sizes 2 x 4 x 3 = 24"),
])
def test_a_batch_the_mesh_cannot_split_names_the_batch(overrides, message):
    with pytest.raises(ConfigError, match=rf"^config key 'train\.batch_size': the .*{message}"):
        load_config(DEMO, overrides)
    load_config(DEMO, ["train.batch_size=16", "train.mesh={data: 2, fsdp: 4}"])  # 8 divides 16
