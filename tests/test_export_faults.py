"""The Hugging Face export under faults: a full disk never costs the finished evaluation (recipe 05 with
``eval.export_hf``), a kill at the replace step never leaves a step without its export nor a staging copy for good
(recipe 05b), and the exported files are readable by others (mode 0666 less the umask, not 0600)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from experiment.storage.local import umask
from tests.fixture_run import pretrained_copy
from tests.recipe_runner import REPO, error_line, recipe_command, recipe_env, run_recipe, wait_until
from tests.test_recipe_errors import run_recipe_on_full_disk

pytestmark = pytest.mark.integration  # every test runs a recipe or another process

EXPORT_FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


def assert_complete_export(folder: Path) -> None:
    from safetensors.numpy import load_file

    assert {p.name for p in folder.iterdir()} >= EXPORT_FILES, sorted(p.name for p in folder.iterdir())
    assert json.loads((folder / "config.json").read_text(encoding="utf-8"))["architectures"] == ["LlamaForCausalLM"]
    assert load_file(str(folder / "model.safetensors"))  # whole, every tensor readable


def leftovers(folder: Path) -> list[str]:
    """Hidden staging or set-aside copies beside the exports."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_full_disk_at_the_export_keeps_the_evaluation_and_is_one_line(fixture_pretrained: Path,
                                                                        tmp_path: Path) -> None:
    config = pretrained_copy(fixture_pretrained, tmp_path)
    eval_dir = tmp_path / "runs" / "tiny" / "eval"
    proc = run_recipe_on_full_disk("05_evaluate.py", config, "eval.export_hf=true", "eval.random_init_baseline=false",
                                   fsync_full=eval_dir / "hf", usage_full=eval_dir / "hf")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = error_line(proc)
    assert re.fullmatch(rf"error: cannot write {re.escape(str(eval_dir / 'hf'))}/\S+: No space left on device "
                        r"\(1000 bytes free on that disk\): free some space, then recipes/05b_export_hf.py "
                        r"eval\.checkpoint_step=6 exports the step without evaluating it again; the evaluation of "
                        rf"step 6 is saved in {re.escape(str(eval_dir / 'step_0000006.json'))}", line), line
    results = json.loads((eval_dir / "step_0000006.json").read_text(encoding="utf-8"))
    assert results["step"] == 6 and "hf_export" not in results and results["tasks"] is not None
    assert (eval_dir / "step_0000006.md").is_file()
    assert json.loads((eval_dir / "manifest.json").read_text(encoding="utf-8"))["latest_step"] == 6
    assert not (eval_dir / "hf").exists() or not list((eval_dir / "hf").iterdir()), "no half export, no staging"
    # with room again the same command writes both
    run_recipe("05_evaluate.py", config, "eval.export_hf=true", "eval.random_init_baseline=false")
    results = json.loads((eval_dir / "step_0000006.json").read_text(encoding="utf-8"))
    assert results["hf_export"] == str(eval_dir / "hf" / "step_0000006")
    assert_complete_export(eval_dir / "hf" / "step_0000006")


def test_the_export_is_readable_by_others(fixture_pretrained: Path, tmp_path: Path) -> None:
    config = pretrained_copy(fixture_pretrained, tmp_path)
    run_recipe("05b_export_hf.py", config)
    export = tmp_path / "runs" / "tiny" / "export" / "hf" / "step_0000006"
    modes = {p.name: p.stat().st_mode & 0o777 for p in export.iterdir()}
    assert modes and set(modes.values()) == {0o666 & ~umask()}, modes


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def test_a_real_full_filesystem_under_the_export_is_one_line(fixture_pretrained: Path, tmp_path: Path) -> None:
    """eval/hf on a 256 KiB tmpfs (a user namespace's mount): the tokenizer files fit, the weights do not, and
    safetensors reports it as its own SafetensorError; the evaluation is saved and the error is one line."""
    if not unshare_works():
        pytest.skip("needs unshare -rm (user and mount namespaces) for a small tmpfs")
    config = pretrained_copy(fixture_pretrained, tmp_path)
    eval_hf = tmp_path / "runs" / "tiny" / "eval" / "hf"
    eval_hf.mkdir(parents=True)
    command = " ".join(f"'{part}'" for part in recipe_command("05_evaluate.py", config, "eval.export_hf=true",
                                                              "eval.random_init_baseline=false"))
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=256k tmpfs '{eval_hf}' && {command}"],
                          cwd=REPO, env=recipe_env(tmp_path), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "SafetensorError" not in proc.stderr, proc.stderr[-3000:]
    assert error_line(proc).startswith(f"error: cannot write {eval_hf / 'step_0000006'}: No space left on device"), \
        error_line(proc)
    results = json.loads((eval_hf.parent / "step_0000006.json").read_text(encoding="utf-8"))
    assert results["step"] == 6 and "hf_export" not in results


# a recipe 05b whose shutil.rmtree of the old export (the folder holding the file OLD_MARK) pauses after it returns
# and says so in the marker file: the moment a replace has removed what it removes, for the test to SIGKILL it there
OLD_MARK = "old-export"
PAUSE_AFTER_RMTREE = f"""
import runpy, shutil, sys, time
from pathlib import Path
marker, script = Path(sys.argv[1]), sys.argv[2]
real_rmtree = shutil.rmtree
def rmtree(path, *args, **kwargs):
    old = (Path(path) / "{OLD_MARK}").is_file()
    real_rmtree(path, *args, **kwargs)
    if old:
        marker.write_text(str(path))
        time.sleep(600)
shutil.rmtree = rmtree
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def test_a_kill_at_the_replace_step_keeps_an_export_and_the_rerun_cleans_up(fixture_pretrained: Path,
                                                                           tmp_path: Path) -> None:
    config = pretrained_copy(fixture_pretrained, tmp_path)
    exports = tmp_path / "runs" / "tiny" / "export" / "hf"
    run_recipe("05b_export_hf.py", config)
    (exports / "step_0000006" / OLD_MARK).write_text("the export before the killed one", encoding="utf-8")
    marker = tmp_path / "paused"
    command = recipe_command("05b_export_hf.py", config)
    output = tmp_path / "05b.log"
    with output.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-c", PAUSE_AFTER_RMTREE, str(marker), *command[1:]],
                                cwd=REPO, env=recipe_env(tmp_path), stdout=sink, stderr=subprocess.STDOUT)
    wait_until(proc, marker.is_file, output=output)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert_complete_export(exports / "step_0000006")  # the old one or the new one, never none
    run_recipe("05b_export_hf.py", config)
    assert_complete_export(exports / "step_0000006")
    assert not (exports / "step_0000006" / OLD_MARK).exists()
    assert leftovers(exports) == []


def test_staging_a_kill_left_is_removed_and_a_set_aside_export_put_back(tmp_path: Path) -> None:
    """What a kill leaves where the filesystem cannot swap two names: the old export renamed aside, the new one
    complete under its staging name. The next build of that folder puts the old one back first (a reader finds an
    export again) and removes the staging copies, whether it then succeeds or fails."""
    from experiment.files import RETIRED_TAG, STAGING_TAG, atomic_dir

    target = tmp_path / "step_0000006"
    (tmp_path / f".{target.name}.{RETIRED_TAG}123-1").mkdir()
    (tmp_path / f".{target.name}.{RETIRED_TAG}123-1" / "config.json").write_text("old", encoding="utf-8")
    (tmp_path / f".{target.name}.{STAGING_TAG}abcd").mkdir()
    (tmp_path / f".{target.name}.{STAGING_TAG}abcd" / "config.json").write_text("new", encoding="utf-8")
    (tmp_path / "step_00000061").mkdir()  # another step's folder: not this one's staging
    (tmp_path / f".{target.name}.k3x_9qzw").mkdir()  # a staging folder as mkdtemp named them before the tags
    with pytest.raises(RuntimeError), atomic_dir(target) as staging:
        assert (target / "config.json").read_text(encoding="utf-8") == "old"
        (staging / "config.json").write_text("newer", encoding="utf-8")
        raise RuntimeError("the build fails")
    assert (target / "config.json").read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000006", "step_00000061"]
    with atomic_dir(target) as staging:
        (staging / "config.json").write_text("newer", encoding="utf-8")
    assert (target / "config.json").read_text(encoding="utf-8") == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000006", "step_00000061"]


@pytest.mark.parametrize("swap", [True, False], ids=["renameat2-exchange", "rename-aside"])
def test_a_replaced_folder_holds_the_new_files_and_nothing_is_left_beside_it(tmp_path: Path, swap: bool,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of replacing (a filesystem without RENAME_EXCHANGE renames the old folder aside first)."""
    from experiment import files

    if swap:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        (tmp_path / "a" / "in-a").touch()
        if not files._exchange(tmp_path / "a", tmp_path / "b"):
            pytest.skip(f"the filesystem of {tmp_path} cannot swap two names (renameat2 RENAME_EXCHANGE)")
        assert (tmp_path / "b" / "in-a").exists()  # swapped
        shutil.rmtree(tmp_path / "a")
        shutil.rmtree(tmp_path / "b")
    else:
        monkeypatch.setattr(files, "_exchange", lambda first, second: False)
    target = tmp_path / "step_0000003"
    for content in ("first", "second"):
        with files.atomic_dir(target) as staging:
            (staging / "config.json").write_text(content, encoding="utf-8")
    assert (target / "config.json").read_text(encoding="utf-8") == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["step_0000003"]
