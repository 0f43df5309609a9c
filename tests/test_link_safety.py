"""No stage deletes or replaces files through a link out of its run folder.

A stage clears its output folder before it rewrites it (recipe 01 its ``docs-*.jsonl``, 03 its shards and
indexes, 05 its manifest and Hugging Face folders). A link planted where such a folder is (``runs/x/shards``
pointing at another folder) would make it delete that folder's files: each case here plants one over a
foreign folder whose files must come out byte-identical, with one error line naming the link.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from experiment.errors import DataError
from experiment.files import atomic_dir, atomic_write_json, remove_file
from experiment.manifest import invalidate
from tests.fixture_run import fixture_config, pretrained_copy
from tests.recipe_runner import error_line, run_recipe

FOREIGN_FILES = {
    "docs-00000.jsonl": b'{"id": "mine", "source": "x", "text": "not a run\'s corpus"}\n',
    "report.md": b"# someone's report\n",
    "manifest.json": b'{"stage": "corpus", "schema_version": 1}\n',
    "train-00000.tfrecord": b"records of another project",
    "train-00000.tfrecord.index": b"0 26\n",
    "hf/step_0000006/config.json": b'{"architectures": ["SomeoneElsesModel"]}\n',
}


def foreign_folder(root: Path) -> Path:
    """A folder outside every run folder, holding files of the names stages delete."""
    for name, data in FOREIGN_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def plant_link(folder: Path, target: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.symlink_to(target, target_is_directory=True)


def expected_line(link: Path, target: Path, run_dir: Path, recipe: str) -> str:
    return (f"error: {link} is a link to {target}, out of the run folder {run_dir}: {recipe} deletes and replaces "
            "files in its output folder and never does so through a link; remove the link and rerun (to keep runs "
            "on another disk, point experiment.run_root there)")


@pytest.mark.integration
@pytest.mark.parametrize(("script", "folder", "kind"), [("01_build_corpus.py", "corpus", "symlink"),
                                                        ("03_shard.py", "shards", "symlink"),
                                                        ("01_build_corpus.py", "corpus", "link file")])
def test_a_data_stage_never_deletes_through_a_planted_link(fixture_stages: Path, tmp_path: Path, script: str,
                                                           folder: str, kind: str) -> None:
    """A symlink, or a ``<folder>.link`` file (the links of a run in a bucket, ``experiment.runfolder``)."""
    shutil.copytree(fixture_stages / "runs" / "tiny", tmp_path / "runs" / "tiny",
                    ignore=shutil.ignore_patterns("wandb"))
    run_dir = tmp_path / "runs" / "tiny"
    foreign = foreign_folder(tmp_path / "elsewhere")
    before = digest(foreign)
    if kind == "symlink":
        plant_link(run_dir / folder, foreign)
    else:
        shutil.rmtree(run_dir / folder)
        (run_dir / f"{folder}.link").write_text(json.dumps({"target": str(foreign)}) + "\n", encoding="utf-8")
    proc = run_recipe(script, fixture_config(tmp_path), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert error_line(proc) == expected_line(run_dir / folder, foreign, run_dir, f"recipes/{script}")
    assert digest(foreign) == before


@pytest.mark.integration
@pytest.mark.parametrize(("script", "folder"), [("05_evaluate.py", "eval"), ("05b_export_hf.py", "export")])
def test_evaluation_and_export_never_replace_through_a_planted_link(fixture_pretrained: Path, tmp_path: Path,
                                                                    script: str, folder: str) -> None:
    config = pretrained_copy(fixture_pretrained, tmp_path)
    run_dir = tmp_path / "runs" / "tiny"
    foreign = foreign_folder(tmp_path / "elsewhere")
    before = digest(foreign)
    plant_link(run_dir / folder, foreign)
    proc = run_recipe(script, config, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert error_line(proc) == expected_line(run_dir / folder, foreign, run_dir, f"recipes/{script}")
    assert digest(foreign) == before


def test_no_deletion_or_replacement_below_a_stage_folder_follows_a_link(tmp_path: Path) -> None:
    """The guard of every deletion (``experiment.files.check_removable``), below the stage folder: a link at
    ``eval/hf`` is refused by the folder replace, the file replace and the delete alike."""
    run_dir = tmp_path / "runs" / "tiny"
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "config.resolved.yaml").write_text("{}\n", encoding="utf-8")
    foreign = foreign_folder(tmp_path / "elsewhere")
    before = digest(foreign)
    (run_dir / "eval" / "hf").symlink_to(foreign / "hf", target_is_directory=True)
    step = run_dir / "eval" / "hf" / "step_0000006"
    refusal = (f"{run_dir / 'eval' / 'hf'} is a link to {foreign / 'hf'}, out of the run folder {run_dir}: a stage "
               "never deletes or replaces files through a link (here {name}); remove the link and rerun (to keep "
               "runs on another disk, point experiment.run_root there)")
    with pytest.raises(DataError) as caught, atomic_dir(step) as staging:
        (staging / "config.json").write_text("{}", encoding="utf-8")
    assert str(caught.value) == refusal.format(name="step_0000006")
    with pytest.raises(DataError) as caught:
        atomic_write_json(step / "config.json", {})
    assert str(caught.value) == refusal.format(name="config.json")
    with pytest.raises(DataError) as caught:
        remove_file(step / "config.json")
    assert str(caught.value) == refusal.format(name="config.json")
    with pytest.raises(DataError) as caught:
        invalidate(step)
    assert str(caught.value) == refusal.format(name="manifest.json")
    assert digest(foreign) == before
    assert not list((run_dir / "eval").glob(".*")), "no staging folder is left behind"


def test_a_link_to_another_runs_folder_is_refused_too(tmp_path: Path) -> None:
    """``runs/x/eval/hf`` a link to the run folder ``runs/y``: that run's marker, seen through the link, must not
    pass for x's own run folder (the folder replace would have replaced y's ``step_N`` and removed its
    ``.step_N.*``)."""
    runs = tmp_path / "runs"
    for name in ("x", "y"):
        (runs / name / "eval").mkdir(parents=True)
        (runs / name / "config.resolved.yaml").write_text("{}\n", encoding="utf-8")
    (runs / "y" / "step_0000006").mkdir()
    (runs / "y" / "step_0000006" / "config.json").write_text('{"y": true}', encoding="utf-8")
    before = digest(runs / "y")
    (runs / "x" / "eval" / "hf").symlink_to(runs / "y", target_is_directory=True)
    link = runs / "x" / "eval" / "hf"
    with pytest.raises(DataError, match=rf"^{link} is a link to {runs / 'y'}, out of the run folder {runs / 'x'}"), \
            atomic_dir(link / "step_0000006"):
        pass
    with pytest.raises(DataError, match="is a link to"):
        remove_file(runs / "x" / "eval" / "hf" / "step_0000006" / "config.json")
    assert digest(runs / "y") == before


def test_a_link_of_its_own_name_is_replaced_and_a_run_folder_kept_elsewhere_is_written(tmp_path: Path) -> None:
    """What stays allowed: replacing a link itself (its target is untouched), and writing in a run folder
    that is itself a link (where a user keeps runs on another disk)."""
    disk = tmp_path / "big-disk" / "tiny"
    (disk / "eval").mkdir(parents=True)
    (disk / "config.resolved.yaml").write_text("{}\n", encoding="utf-8")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny").symlink_to(disk, target_is_directory=True)
    foreign = foreign_folder(tmp_path / "elsewhere")
    before = digest(foreign)
    step = tmp_path / "runs" / "tiny" / "eval" / "step_0000006"
    step.symlink_to(foreign / "hf" / "step_0000006", target_is_directory=True)
    with atomic_dir(step) as staging:
        (staging / "config.json").write_text('{"mine": true}', encoding="utf-8")
    assert not step.is_symlink() and (disk / "eval" / "step_0000006" / "config.json").read_text() == '{"mine": true}'
    assert digest(foreign) == before
