"""Checkpoint integrity: every committed step carries checksums of its files; a damaged step is
named in a warning and the previous complete one is used; with none left, one error line."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from experiment.errors import WriteError
from experiment.sections.train import TrainConfig
from tests.recipe_runner import error_line, run_recipe, tiny_config
from tests.recipe_runner import read_train_log as log_records
from tests.test_recipe_errors import run_recipe_on_full_disk
from tests.test_train_resume import STEPS, TRAIN, experiment_copy
from tracking import process_hooks
from trainer import checkpoint, checkpoint_integrity, trained_model

pytestmark = pytest.mark.slow  # started first (tests/conftest.py)


def tiny_state(step: int) -> dict[str, Any]:
    return {"params": {"w": jnp.arange(4096, dtype=jnp.float32) * step, "b": jnp.full((16,), step, jnp.float32)},
            "opt_state": {"mu": jnp.ones((64,), jnp.float32) * step}, "step": jnp.int32(step),
            "rng": jax.random.key_data(jax.random.key(step))}


def save_steps(directory: Path, steps: list[int]) -> None:
    manager = checkpoint.open_manager(directory, TrainConfig(keep_checkpoints=5, async_checkpointing=True))
    for step in steps:
        checkpoint.save(manager, step, tiny_state(step), {"position": step}, {"tokens": step * 10},
                        {"model": {}, "step": step}, force=True)
    manager.close()


def restore_latest(directory: Path) -> tuple[int, dict[str, Any], list[int]]:
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tiny_state(0))
    manager = checkpoint.open_manager(directory)
    try:
        return checkpoint_integrity.restore_verified(manager, lambda step: checkpoint.restore(manager, step, abstract))
    finally:
        manager.close()


def largest_file(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def flip_bit(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return path


def truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def delete(path: Path) -> Path:
    path.unlink()
    return path


def replace_json(path: Path, body: str) -> Path:
    path.write_text(body, encoding="utf-8")
    return path


DAMAGE: dict[str, Callable[[Path], Path]] = {
    "bit flip in a params data file": lambda step: flip_bit(largest_file(step / "params")),
    "bit flip in the optimizer state": lambda step: flip_bit(largest_file(step / "train")),
    "deleted params manifest.ocdbt": lambda step: delete(step / "params" / "manifest.ocdbt"),
    "truncated params data file": lambda step: truncate(largest_file(step / "params")),
    "garbage meta metadata": lambda step: replace_json(step / "meta" / "metadata", "{garbage"),
    "other loader state": lambda step: replace_json(step / "loader" / "metadata", '{"position": 999}'),
    "other ledger summary": lambda step: replace_json(step / "ledger" / "metadata", '{"tokens": 1}'),
    "no checksums file": lambda step: delete(step / checkpoint_integrity.CHECKSUMS),
}


def test_every_committed_step_has_checksums_that_verify(tmp_path: Path) -> None:
    save_steps(tmp_path / "ckpt", [1, 2])
    for step in (1, 2):
        recorded = json.loads(
            (tmp_path / "ckpt" / str(step) / checkpoint_integrity.CHECKSUMS).read_text(encoding="utf-8"))
        assert {"params/manifest.ocdbt", "meta/metadata", "loader/metadata", "ledger/metadata"} <= set(
            recorded["files"])
        checkpoint_integrity.verify_checksums(tmp_path / "ckpt" / str(step))
    step, (state, items), damaged = restore_latest(tmp_path / "ckpt")
    assert (step, damaged, items["loader"]) == (2, [], {"position": 2})
    np.testing.assert_array_equal(state["params"]["w"], tiny_state(2)["params"]["w"])


def test_meta_alone_is_verified_without_hashing_the_parameters(tmp_path: Path) -> None:
    """trainer.init_from reads the meta before the restore verifies the whole step: a damaged params file
    is the restore's to find, a damaged meta file is found here."""
    from trainer.init_from import latest_meta

    save_steps(tmp_path / "ckpt", [1, 2])
    DAMAGE["bit flip in a params data file"](tmp_path / "ckpt" / "2")
    checkpoint_integrity.verify_checksums(tmp_path / "ckpt" / "2", "meta")
    with pytest.raises(checkpoint_integrity.CheckpointDamaged):
        checkpoint_integrity.verify_checksums(tmp_path / "ckpt" / "2")
    assert latest_meta(tmp_path / "ckpt", [1, 2]) == {"model": {}, "step": 2}
    flip_bit(tmp_path / "ckpt" / "2" / "meta" / "metadata")
    assert latest_meta(tmp_path / "ckpt", [1, 2]) == {"model": {}, "step": 1}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_latest_step_falls_back_to_the_previous_one(tmp_path: Path, damage: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    save_steps(tmp_path / "ckpt", [1, 2])
    damaged_file = DAMAGE[damage](tmp_path / "ckpt" / "2")
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        step, (state, items), damaged = restore_latest(tmp_path / "ckpt")
    assert (step, damaged) == (1, [2])
    assert items["loader"] == {"position": 1} and items["ledger"] == {"tokens": 10}
    np.testing.assert_array_equal(state["params"]["w"], tiny_state(1)["params"]["w"])
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "checkpoint step 2 is damaged" in warning and str(damaged_file) in warning
    assert "falling back to step 1" in warning


def test_checkpoints_of_an_older_version_without_any_checksums_restore_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An upgrade must not lose a run: a folder an older version wrote (no checksums, no marker) is restored from
    its latest readable step; a folder of this version whose steps all lost their checksums is not."""
    save_steps(tmp_path / "ckpt", [1, 2])
    for step in (1, 2):
        delete(tmp_path / "ckpt" / str(step) / checkpoint_integrity.CHECKSUMS)
    delete(tmp_path / "ckpt" / checkpoint_integrity.CHECKSUMMED)  # as an older version left it
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        step, (_, items), damaged = restore_latest(tmp_path / "ckpt")
    assert (step, damaged, items["loader"]) == (2, [], {"position": 2})
    assert "have no checksums (written by an older version)" in caplog.text
    DAMAGE["deleted params manifest.ocdbt"](tmp_path / "ckpt" / "2")  # unreadable: still falls back
    assert restore_latest(tmp_path / "ckpt")[0] == 1
    save_steps(tmp_path / "fresh", [1])
    delete(tmp_path / "fresh" / "1" / checkpoint_integrity.CHECKSUMS)  # killed between Orbax's commit and the checksums
    with pytest.raises(checkpoint_integrity.CheckpointDamaged, match="checksums.json is missing"):
        restore_latest(tmp_path / "fresh")


def test_no_step_left_is_one_error_naming_the_folder(tmp_path: Path) -> None:
    save_steps(tmp_path / "ckpt", [1, 2])
    DAMAGE["truncated params data file"](tmp_path / "ckpt" / "2")
    DAMAGE["garbage meta metadata"](tmp_path / "ckpt" / "1")
    with pytest.raises(checkpoint_integrity.CheckpointDamaged,
                       match=r"no restorable checkpoint in .*ckpt \(step 2: .*step 1: "):
        restore_latest(tmp_path / "ckpt")


def test_eval_loading_falls_back_past_a_damaged_step(tmp_path: Path) -> None:
    """``load_trained_model`` (recipe 05, HF export, lm-eval) takes the latest complete step."""
    from flax import nnx

    from model.llama.config import LlamaConfig
    from model.llama.model import Decoder
    from model.stacking import layout_meta

    model_cfg = LlamaConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=8)
    manager = checkpoint.open_manager(tmp_path / "checkpoints", TrainConfig(keep_checkpoints=5))
    for step in (3, 4):
        with nnx.use_eager_sharding(False):
            params = nnx.state(Decoder(model_cfg, 32, nnx.Rngs(step)), nnx.Param)
        state = {"params": params, "opt_state": {}, "step": jnp.int32(step),
                 "rng": jax.random.key_data(jax.random.key(0))}
        meta = {"model": vars(model_cfg), "vocab_size": 32, "layout": layout_meta(model_cfg.scan_layers)}
        checkpoint.save(manager, step, state, {}, {}, meta, force=True)
    manager.close()
    flip_bit(largest_file(tmp_path / "checkpoints" / "4" / "params"))
    run_folder = SimpleNamespace(checkpoints=tmp_path / "checkpoints")
    _, step, _ = trained_model.load_trained_model(run_folder)
    assert step == 3
    with pytest.raises(checkpoint_integrity.CheckpointDamaged, match=r"CRC32C"):
        trained_model.load_trained_model(run_folder, step=4)


# ---------------------------------------------------------------------------------------------
# Recipes 04 and 05 on a real tiny run (shared data, like tests/test_train_resume.py)

# data_root (stages 01-03 of the tiny experiment) and straight_run (its uninterrupted run of STEPS steps,
# checkpoints 8, 16, 24) are conftest.py's session fixtures, shared with tests/test_train_resume.py


def copy_of(straight: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the finished run (another run root); returns its config and run folder."""
    import shutil

    shutil.copytree(straight.parent / "runs", tmp_path / "runs")
    return tiny_config(tmp_path, train=TRAIN), tmp_path / "runs" / "tiny"


def trained_params(run_dir: Path, step: int) -> list[np.ndarray]:
    from flax import nnx

    model, _, _ = trained_model.load_trained_model(SimpleNamespace(checkpoints=run_dir / "checkpoints"), step=step)
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))]


def assert_same_training(run_dir: Path, reference_dir: Path) -> None:
    """One log line per step, 1..STEPS in order, with the values of the uninterrupted run; same final params."""
    records, reference = log_records(run_dir), log_records(reference_dir)
    assert [r["train/step"] for r in records] == list(range(1, STEPS + 1)), "each step logged once, in order"
    for key in ("train/loss", "train/grad_norm", "train/lr", "train/tokens_seen"):
        assert [r[key] for r in records] == [r[key] for r in reference], key
    for got, want in zip(trained_params(run_dir, STEPS), trained_params(reference_dir, STEPS), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.integration
@pytest.mark.shared_data
def test_bit_flip_in_the_latest_checkpoint_falls_back_and_retrains_the_same_params(straight_run: Path,
                                                                                   tmp_path: Path) -> None:
    config, run_dir = copy_of(straight_run, tmp_path)
    flipped = flip_bit(largest_file(run_dir / "checkpoints" / str(STEPS) / "params"))
    proc = run_recipe("04_pretrain.py", config)
    assert f"checkpoint step {STEPS} is damaged: {flipped} does not match its CRC32C" in proc.stderr
    assert f"resumed from the checkpoint of step {STEPS - 8} in" in proc.stderr
    assert_same_training(run_dir, straight_run.parent / "runs" / "tiny")


@pytest.mark.integration
@pytest.mark.shared_data
def test_resume_after_a_kill_past_the_last_checkpoint_logs_each_step_once(straight_run: Path, tmp_path: Path) -> None:
    """The disk as SIGKILL during the async save of step 24 leaves it (a timed kill races a run of
    ~10 steps/s): steps 17-24 logged, the step still in Orbax's temporary folder, a half line."""
    config, run_dir = copy_of(straight_run, tmp_path)
    (run_dir / "checkpoints" / str(STEPS)).rename(run_dir / "checkpoints" / f"{STEPS}.orbax-checkpoint-tmp-1")
    with (run_dir / "train_log.jsonl").open("a", encoding="utf-8") as log:
        log.write('{"train/step": 25, "train/lo')
    proc = run_recipe("04_pretrain.py", config)
    assert f"resumed from the checkpoint of step {STEPS - 8} in" in proc.stderr
    assert_same_training(run_dir, straight_run.parent / "runs" / "tiny")


@pytest.mark.integration
@pytest.mark.shared_data
def test_a_save_killed_before_its_checksums_is_trained_again_not_called_damaged(straight_run: Path,
                                                                              tmp_path: Path) -> None:
    """SIGKILL between Orbax finishing step 24 and its checksums.json: the step is an interrupted save,
    set aside, and the run resumes from step 16 and ends as the uninterrupted run did."""
    config, run_dir = copy_of(straight_run, tmp_path)
    (run_dir / "checkpoints" / str(STEPS) / checkpoint_integrity.CHECKSUMS).unlink()
    proc = run_recipe("04_pretrain.py", config)
    assert f"checkpoint step(s) {STEPS} have no checksums: their save was interrupted" in proc.stderr
    assert f"resumed from the checkpoint of step {STEPS - 8} in" in proc.stderr
    assert_same_training(run_dir, straight_run.parent / "runs" / "tiny")
    assert any(p.name.startswith(f"{STEPS}-")
               for p in (run_dir / "checkpoints" / checkpoint_integrity.DAMAGED_DIR).iterdir())


def damage_every_step(run_dir: Path) -> None:
    DAMAGE["deleted params manifest.ocdbt"](run_dir / "checkpoints" / "24")
    DAMAGE["truncated params data file"](run_dir / "checkpoints" / "16")
    DAMAGE["garbage meta metadata"](run_dir / "checkpoints" / "8")


@pytest.mark.integration
@pytest.mark.shared_data
@pytest.mark.parametrize("script", ["04_pretrain.py", "05_evaluate.py"])
def test_no_restorable_checkpoint_is_one_error_line(straight_run: Path, tmp_path: Path, script: str) -> None:
    config, run_dir = copy_of(straight_run, tmp_path)
    damage_every_step(run_dir)
    proc = run_recipe(script, config, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Event loop is closed" not in proc.stderr, proc.stderr[-3000:]
    line = error_line(proc)
    assert line.startswith(f"error: no restorable checkpoint in {run_dir / 'checkpoints'} (step 24: "), line
    assert "manifest.ocdbt is missing" in line and "step 16: " in line and "step 8: " in line
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == ["16", "24", "8"]


@pytest.mark.integration
@pytest.mark.shared_data
def test_train_steps_at_or_below_the_latest_checkpoint(straight_run: Path, tmp_path: Path) -> None:
    config, run_dir = copy_of(straight_run, tmp_path)
    lines_before = log_records(run_dir)
    proc = run_recipe("04_pretrain.py", config, f"train.steps={STEPS - 4}", check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert error_line(proc) == (
        f"error: config key 'train.steps': {STEPS - 4} is below step {STEPS}, which the checkpoints in "
        f"{run_dir / 'checkpoints'} already reached: set train.steps above {STEPS} to train further, or use "
        "another experiment.name to start over")
    proc = run_recipe("04_pretrain.py", config)
    assert f"already reached train.steps={STEPS}: nothing to train" in proc.stderr
    assert "loss nan" not in proc.stderr and (
        f"pretraining done at step {STEPS}: loss {lines_before[-1]['train/loss']:.4f}" in proc.stderr)
    assert log_records(run_dir) == lines_before


# ---------------------------------------------------------------------------------------------
# A full disk during a save


@pytest.mark.integration
@pytest.mark.shared_data
@pytest.mark.parametrize("where", ["no room for the next step", "checksums write fails"])
def test_full_disk_at_a_save_is_one_line_and_a_rerun_resumes(data_root: Path, straight_run: Path, tmp_path: Path,
                                                             where: str) -> None:
    config = experiment_copy(data_root, tmp_path, "full")
    checkpoints = config.parent / "runs" / "tiny" / "checkpoints"
    if where == "no room for the next step":  # checked before Orbax writes anything
        proc = run_recipe_on_full_disk("04_pretrain.py", config, usage_full=checkpoints)
        expected = (rf"error: not enough disk space for checkpoint step 16 in {re.escape(str(checkpoints))}: a step "
                    r"takes [\d.]+ MiB, 1000 bytes free on that disk: .* rerun the same command to resume from step 8$")
    else:  # a write fails after the commit of step 16: the step has no checksums and is not trusted
        proc = run_recipe_on_full_disk("04_pretrain.py", config, fsync_full=checkpoints / "16")
        expected = (rf"error: cannot write checkpoint step 16 in {re.escape(str(checkpoints))}: No space left on "
                    r"device \([\d.]+ \w+ free on that disk\): .* rerun the same command .*")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Event loop is closed" not in proc.stderr, proc.stderr[-3000:]
    assert re.fullmatch(expected, error_line(proc)), error_line(proc)
    proc = run_recipe("04_pretrain.py", config)
    assert "resumed from the checkpoint of step 8 in" in proc.stderr
    assert_same_training(config.parent / "runs" / "tiny", straight_run.parent / "runs" / "tiny")


def test_tensorstore_write_error_is_one_line(tmp_path: Path) -> None:
    """What Orbax raises when tensorstore hits a full disk mid-save, and what its threads log."""
    error = ValueError('RESOURCE_EXHAUSTED: Error writing "params.w/0" in OCDBT database: Failed to write 178027 '
                       "bytes to file 33: No space left on device [os_error_code='28']")
    expected = (rf"^cannot write checkpoint step 16 in {re.escape(str(tmp_path))}: "
                r"No space left on device \([\d.]+ \w+ free")
    with pytest.raises(WriteError, match=expected), checkpoint.write_errors_as_one_line(tmp_path, "checkpoint step 16"):
        raise error
    with pytest.raises(ValueError, match="shape"), checkpoint.write_errors_as_one_line(tmp_path, "step 1"):
        raise ValueError("shape mismatch")  # not a write error: left alone


def test_orbax_thread_logs_of_a_reported_write_error_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """Once the harness installed the process hooks; before that (importing alone) nothing is dropped."""
    disk_full = ValueError("Failed writing: No space left on device [os_error_code='28']")

    def logged() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            logging.getLogger("absl").error("Save Finalize thread failed.", exc_info=disk_full)
            logging.getLogger("absl").error("another failure", exc_info=ValueError("bad shape"))
        return [r.getMessage() for r in caplog.records]

    assert logged() == ["Save Finalize thread failed.", "another failure"]
    process_hooks.install_process_hooks()
    try:
        process_hooks.install_process_hooks()  # once: a second call adds no second filter
        assert sum(isinstance(f, process_hooks.ReportedWriteErrors) for f in logging.getLogger("absl").filters) == 1
        assert logged() == ["another failure"]
    finally:
        process_hooks.uninstall_process_hooks()
    assert logged() == ["Save Finalize thread failed.", "another failure"]


def test_closed_event_loop_callbacks_are_not_printed() -> None:
    """Tensorstore completing after Orbax's loop ended calls call_soon_threadsafe on a closed loop."""
    import asyncio

    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(print)
    except RuntimeError as exc:
        closed = exc
    other = RuntimeError("something else")
    shown: list[BaseException] = []
    hook = process_hooks.quiet_closed_loop_callbacks(lambda unraisable: shown.append(unraisable.exc_value))
    for exc in (closed, other):
        hook(SimpleNamespace(exc_type=RuntimeError, exc_value=exc, exc_traceback=exc.__traceback__, err_msg=None,
                             object=None))
    assert shown == [other]
