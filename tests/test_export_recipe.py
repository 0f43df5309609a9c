"""Recipe 05b: a step's Hugging Face folder and nothing else (eval/ byte-identical), one line on bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.fixture_run import pretrained_copy
from tests.recipe_runner import error_line, run_recipe


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_writes_the_step_and_leaves_eval_byte_identical(fixture_pretrained: Path, tmp_path: Path) -> None:
    config = pretrained_copy(fixture_pretrained, tmp_path)
    run_dir = tmp_path / "runs" / "tiny"
    # results a recipe 05 run left for step 6 (and its own export): the export recipe must not touch them
    (run_dir / "eval" / "hf" / "step_0000006").mkdir(parents=True)
    (run_dir / "eval" / "step_0000006.json").write_text(json.dumps({"step": 6, "tasks": {"rublimp": 0.6}}),
                                                        encoding="utf-8")
    (run_dir / "eval" / "hf" / "step_0000006" / "config.json").write_text("{}", encoding="utf-8")
    before = tree_digest(run_dir / "eval")

    run_recipe("05b_export_hf.py", config, "eval.checkpoint_step=3")
    assert tree_digest(run_dir / "eval") == before
    out = run_dir / "export" / "hf" / "step_0000003"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()}
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["architectures"] == ["LlamaForCausalLM"]
    run_recipe("05b_export_hf.py", config)  # the latest step by default
    assert (run_dir / "export" / "hf" / "step_0000006" / "model.safetensors").is_file()
    assert tree_digest(run_dir / "eval") == before


def test_export_of_a_step_that_does_not_exist_is_one_line(fixture_pretrained: Path, tmp_path: Path) -> None:
    config = pretrained_copy(fixture_pretrained, tmp_path)
    proc = run_recipe("05b_export_hf.py", config, "eval.checkpoint_step=4", check=False)
    assert proc.returncode == 2
    line = error_line(proc)
    assert line.startswith("error: ") and "step 4" in line and "3, 6" in line, line
    assert not (tmp_path / "runs" / "tiny" / "export" / "hf").exists()


def test_export_without_the_runs_tokenizer_names_the_recipe_to_run(fixture_pretrained: Path, tmp_path: Path) -> None:
    import shutil

    config = pretrained_copy(fixture_pretrained, tmp_path)
    shutil.rmtree(tmp_path / "runs" / "tiny" / "tokenizer")
    proc = run_recipe("05b_export_hf.py", config, check=False)
    assert proc.returncode == 2 and "recipes/02_train_tokenizer.py" in error_line(proc)


def test_a_second_export_of_the_run_stops_at_once_naming_the_first(fixture_pretrained: Path, tmp_path: Path) -> None:
    """Two exports of one run at once: the second finds the first's lock (here held by this process), says who
    holds it in one line and writes nothing."""
    import os
    import socket

    from experiment.lock import hold, lock_path
    from experiment.runfolder import RunFolder

    config = pretrained_copy(fixture_pretrained, tmp_path)
    run = RunFolder(tmp_path / "runs" / "tiny")
    with hold(lock_path(run, "export"), "export"):
        proc = run_recipe("05b_export_hf.py", config, check=False)
    assert proc.returncode == 2 and error_line(proc).startswith(
        f"error: {run.root} is already running recipes/05b_export_hf.py "
        f"(host {socket.gethostname()}, pid {os.getpid()}"), \
        proc.stderr[-2000:]
    assert not run.export.exists() or not any(run.export.rglob("*.safetensors"))
