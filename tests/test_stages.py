"""The stage registry: one record per stage, the recipes it names exist and use it, manifests read checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiment.errors import DataError, MissingStageError
from experiment.runfolder import RunFolder
from experiment.stages import SHARDS, STAGES, TOKENIZER, stage_named

ROOT = Path(__file__).resolve().parents[1]


# recipes that run other recipes (each through its registered stage) rather than a stage of their own
ORCHESTRATORS = {"recipes/08_sweep.py": "tracking/sweep.py"}
# recipes that write beside the repository, not into the run folder (the launch files go to the machine that
# launches; the run folder is the bucket the launched hosts use), after the checks of the stage they plan for
LAUNCHERS = {"recipes/07b_launch_spec.py": "PLAN"}


def test_every_recipe_runs_a_registered_stage_and_every_stage_has_its_recipe() -> None:
    recipes = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "recipes").glob("[0-9]*.py"))
    assert sorted([s.recipe for s in STAGES.values()] + list(ORCHESTRATORS) + list(LAUNCHERS)) == recipes
    for launcher, stage_name in LAUNCHERS.items():
        assert f"run_stage_checks({stage_name}," in (ROOT / launcher).read_text(encoding="utf-8"), launcher
    for orchestrator in ORCHESTRATORS.values():
        # it names the recipes it runs by their stage records, never by a path of its own
        text = (ROOT / orchestrator).read_text(encoding="utf-8")
        assert "stage.recipe" in text and "recipes/0" not in text.replace("recipes/08_sweep.py", ""), orchestrator
    for stage in STAGES.values():
        text = (ROOT / stage.recipe).read_text(encoding="utf-8")
        # the recipe hands the harness the registry's record, not a name of its own
        assert re.search(rf"recipe_main\({stage.name.upper()},", text), stage.recipe


def test_stage_folders_are_the_run_folder_ones(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    known = {folder.corpus, folder.tokenizer, folder.shards, folder.checkpoints, folder.eval, folder.export,
             folder.generate, folder.mera, folder.reports}
    assert {stage.dir(folder) for stage in STAGES.values()} <= known
    assert stage_named("shards") is SHARDS
    with pytest.raises(ValueError, match="unknown stage 'shard'"):
        stage_named("shard")


def test_manifest_reader_names_the_file_and_the_recipe(tmp_path: Path) -> None:
    folder = tmp_path / "tokenizer"
    assert TOKENIZER.read_manifest_if_present(folder) is None
    with pytest.raises(MissingStageError, match=r"run recipes/02_train_tokenizer.py first"):
        TOKENIZER.read_manifest(folder)
    with pytest.raises(ValueError, match="lacks vocab_size"):  # the writer keeps what the readers need
        TOKENIZER.write_manifest(folder, {"sha256": "ab"})
    TOKENIZER.write_manifest(folder, {"sha256": "ab", "vocab_size": 400})
    assert TOKENIZER.read_manifest(folder)["vocab_size"] == 400

    path = folder / "manifest.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**body, "vocab_size": "400"}), encoding="utf-8")
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: 'vocab_size' is '400', not int: run "
                                        r"recipes/02_train_tokenizer.py again"):
        TOKENIZER.read_manifest_if_present(folder)
    path.write_text(json.dumps({k: v for k, v in body.items() if k != "sha256"}), encoding="utf-8")
    with pytest.raises(DataError, match=r"has no 'sha256'"):
        TOKENIZER.read_manifest(folder)
    path.write_text(json.dumps(body)[:-5], encoding="utf-8")  # torn
    with pytest.raises(DataError, match="not a readable manifest"):
        TOKENIZER.read_manifest_if_present(folder)


def test_fit_check_reads_the_manifests_checked_or_falls_back_to_the_config(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from trainer.fit_check import vocab_and_seq_len

    cfg = SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=512), model=SimpleNamespace(max_seq_len=64))
    folder = RunFolder(tmp_path)
    assert vocab_and_seq_len(cfg, folder) == (512, 64)  # before any data is prepared
    TOKENIZER.write_manifest(folder.tokenizer, {"sha256": "ab", "vocab_size": 400})
    SHARDS.write_manifest(folder.shards, {"tokenizer_sha256": "ab", "seq_len": 128, "splits": {}})
    assert vocab_and_seq_len(cfg, folder) == (400, 128)
    (folder.shards / "manifest.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match=r"shards/manifest.json belongs to stage 'None', expected 'shards'"):
        vocab_and_seq_len(cfg, folder)


def test_every_stage_check_names_a_function_that_exists() -> None:
    """``Stage.checks`` name their functions as strings (the registry sits below the packages it checks): a
    renamed function would fail only when its recipe starts."""
    from experiment.check import check_function, stage_check_names

    names = stage_check_names(STAGES.values())
    assert names and all(callable(check_function(name)) for name in names)
