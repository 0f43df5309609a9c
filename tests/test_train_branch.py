"""Decay branches: recipe 04 started from another run's checkpoint of step N (``train.branch_from``,
``train.branch_step``) trains on from exactly there, costs the parent's rubles up to N plus its own,
and names the parent's W&B run; a parent it cannot start from is one error line."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from cost.ledger_format import LEDGER_FILE
from cost.ledger_pricing import summarize_ledger, summarize_ledger_at
from experiment.errors import ConfigError
from experiment.runfolder import RunFolder
from experiment.sections.train import TrainConfig
from tests.fixture_run import PRETRAINED_TRAIN, checkpoint_contents, log_records, pretrained_copy
from tests.recipe_runner import error_line, run_recipe
from tracking.readback import find_offline_runs, read_offline_run
from trainer.branch import open_branch

pytestmark = pytest.mark.integration
N = 3
BRANCH = ("experiment.name=branch", "train.branch_from=tiny", f"train.branch_step={N}")


@pytest.fixture(scope="module")
def runs(fixture_pretrained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A parent of 6 steps with checkpoints at 3 and 6 (a copy of conftest.py's ``fixture_pretrained``), and a
    branch from step 3 with the same schedule."""
    assert PRETRAINED_TRAIN["steps"] == 2 * N == 2 * PRETRAINED_TRAIN["checkpoint_every"]
    config = pretrained_copy(fixture_pretrained, tmp_path_factory.mktemp("branch"))
    run_recipe("04_pretrain.py", config, *BRANCH)
    return config


def test_a_branch_keeping_the_schedule_retraces_the_parent_bitwise(runs: Path) -> None:
    root = runs.parent / "runs"
    parent = {r["train/step"]: r["train/loss"] for r in log_records(root / "tiny")}
    branch = {r["train/step"]: r["train/loss"] for r in log_records(root / "branch")}
    assert sorted(branch) == [N + 1, N + 2, 6]
    assert branch == {step: parent[step] for step in branch}  # floats from JSON: equal means bitwise
    assert (root / "branch" / "shards").resolve() == (root / "tiny" / "shards").resolve()


def test_the_branch_ledger_is_the_parent_up_to_n_plus_its_own(runs: Path, tmp_path: Path) -> None:
    root = runs.parent / "runs"
    _, items = checkpoint_contents(root / "tiny", N)
    at_n = summarize_ledger_at(root / "tiny" / "ledger", items["ledger"])  # the parent when it saved step N
    assert at_n.tokens == N * 8 * 64 and at_n.last_step == N
    assert at_n.rub_total < summarize_ledger(root / "tiny" / "ledger").rub_total
    ledger = root / "branch" / "ledger"
    own_lines = [line for line in (ledger / LEDGER_FILE).read_text(encoding="utf-8").splitlines()
                 if json.loads(line)["e"] != "inherit"]
    (tmp_path / LEDGER_FILE).write_text("\n".join(own_lines) + "\n", encoding="utf-8")
    own, total = summarize_ledger(tmp_path), summarize_ledger(ledger)
    assert own.tokens == N * 8 * 64 and own.rub_total > 0
    assert total.tokens == 2 * N * 8 * 64 and total.last_step == 6
    assert total.rub_total == pytest.approx(at_n.rub_total + own.rub_total, rel=1e-12)


def test_the_branch_w_and_b_run_names_its_parent(runs: Path) -> None:
    root = runs.parent / "runs"
    parent_id = json.loads((root / "tiny" / "checkpoints" / "wandb_run.json").read_text(encoding="utf-8"))["run_id"]
    (run_dir,) = find_offline_runs(root / "branch" / "wandb")
    run = read_offline_run(run_dir)
    assert run.run_id != parent_id
    assert run.config["branch_parent_run_id"] == parent_id and run.config["branch_step"] == N
    assert run.config["train"]["branch_from"] == "tiny"
    assert run.summary["branch/parent_run_id"] == parent_id


def test_a_parent_of_another_model_shape_is_one_error_line(runs: Path) -> None:
    proc = run_recipe("04_pretrain.py", runs, *BRANCH, "experiment.name=wrong-shape", "model.d_model=32",
                      "model.d_ff=96", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    checkpoints = runs.parent / "runs" / "tiny" / "checkpoints"
    assert error_line(proc) == (
        f"error: checkpoints in {checkpoints} were made with a different model (d_model: 64 -> 32, d_ff: 192 -> 96): "
        "a branch keeps its parent's model, tokenizer and shards (train.branch_from)")


def test_a_missing_parent_or_step_is_one_config_error(runs: Path, tmp_path: Path) -> None:
    run_root = runs.parent / "runs"

    def branch_of(parent: str, step: int) -> None:
        cfg = types.SimpleNamespace(experiment=types.SimpleNamespace(run_root=str(run_root)),
                                    train=TrainConfig(steps=10, warmup_steps=1, branch_from=parent, branch_step=step))
        open_branch(cfg, RunFolder(tmp_path / "new-branch"))

    with pytest.raises(ConfigError, match=f"^config key 'train.branch_from': "
                                          f"{run_root / 'nowhere'} holds no checkpoints/"):
        branch_of("nowhere", N)
    with pytest.raises(ConfigError, match=f"^config key 'train.branch_step': no finished checkpoint of step 4 in "
                                          f"{run_root / 'tiny' / 'checkpoints'} \\(its steps: 3, 6\\)$"):
        branch_of("tiny", 4)
    with pytest.raises(ConfigError, match="^config key 'train.branch_step': a branch needs both branch_from"):
        TrainConfig(steps=10, warmup_steps=1, branch_from="tiny").validate("train")
    assert not (tmp_path / "new-branch").exists()
