"""A run that trains more tokens than its training shards hold loops over its data: recipe 04 (and
``python -m experiment.check``) says so in one warning line, with the epochs, before the first step. A corpus sized
in bytes for a token budget used to do this silently (the shipped configs counted bytes as characters)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from experiment.check import main as check_main
from tests.recipe_runner import run_recipe

pytestmark = pytest.mark.integration

WARNING = "train.steps x train.batch_size x model.max_seq_len = "  # the epoch warnings begin so


def epoch_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if WARNING in line]


def check_warnings(caplog: pytest.LogCaptureFixture, config: Path, *overrides: str) -> list[str]:
    """The epoch warnings ``python -m experiment.check`` logs, run in this process."""
    caplog.clear()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert check_main(["--config", str(config), *overrides]) == 0, err.getvalue()
    return [record.getMessage() for record in caplog.records if WARNING in record.getMessage()]


def test_recipe_04_warns_once_before_training_when_the_run_loops_over_its_data(fixture_stages: Path,
                                                                              tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    from tests.fixture_run import run_copy

    config = run_copy(fixture_stages, tmp_path)
    manifest = json.loads((tmp_path / "runs" / "tiny" / "shards" / "manifest.json").read_text("utf-8"))
    records, shard_tokens = manifest["splits"]["train"]["records"], manifest["splits"]["train"]["tokens"]
    batch = 8
    steps = records // batch + 2  # a little more than one pass over the training records
    assert steps * batch > records
    proc = run_recipe("04_pretrain.py", config, f"train.steps={steps}", f"train.batch_size={batch}",
                      "train.log_every=1", "train.checkpoint_every=100")
    lines = proc.stderr.splitlines()
    found = epoch_lines(proc.stderr)
    assert len(found) == 1, proc.stderr[-3000:]
    assert found[0].endswith(
        f"train.steps x train.batch_size x model.max_seq_len = {steps} x {batch} x 64 = {steps * batch * 64:,} tokens, "
        f"but the training shards in {tmp_path / 'runs' / 'tiny' / 'shards'} hold {records} records "
        f"({shard_tokens:,} tokens): the run goes over its training data {steps * batch / records:.2f} times (epochs); "
        "to see each record once, build a larger corpus (corpus.sources[].max_bytes) or lower train.steps")
    first_step = next(i for i, line in enumerate(lines) if "step 1" in line or "step 1/" in line)
    assert lines.index(found[0]) < first_step

    # the same line from the config check, which trains nothing; none for a run within one pass
    checked = check_warnings(caplog, config, f"train.steps={steps}", f"train.batch_size={batch}")
    assert len(checked) == 1 and found[0].endswith(checked[0])
    assert check_warnings(caplog, config, f"train.steps={records // batch}", f"train.batch_size={batch}",
                          "train.warmup_steps=1") == []


def test_a_mixture_names_each_set_it_goes_over_more_than_once(fixture_stages: Path, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Each set of ``train.mixture`` gives its weight's share of the rows: the line names the sets that loop."""
    import shutil

    from tests.fixture_run import run_copy

    config = run_copy(fixture_stages, tmp_path)
    other = tmp_path / "other-shards"
    shutil.copytree(tmp_path / "runs" / "tiny" / "shards", other)
    records = json.loads((other / "manifest.json").read_text("utf-8"))["splits"]["train"]["records"]
    batch, steps = 8, records // 6 + 1  # own set: 3/4 of the rows, over one pass; the other: 1/4, under it
    assert steps * batch * 3 / 4 > records > steps * batch / 4
    mixture = f"train.mixture=[{{name: own, weight: 3}}, {{name: other, shards: '{other}', weight: 1}}]"
    found = check_warnings(caplog, config, f"train.steps={steps}", f"train.batch_size={batch}", mixture)
    assert found == [
        f"train.steps x train.batch_size x model.max_seq_len = {steps} x {batch} x 64 = {steps * batch * 64:,} tokens, "
        f"but the run goes over train.mixture's sets more than once: 'own' {steps * batch * 0.75 / records:.2f} epochs "
        f"({records} records for 75% of the rows); to see each record once, build larger sets or lower train.steps "
        "or their weights"]
    even = mixture.replace("weight: 3", "weight: 1")  # half the rows each: both within one pass
    assert check_warnings(caplog, config, f"train.steps={steps}", f"train.batch_size={batch}", even) == []
    # a set not sharded yet, listed before the looping one: the note names it, and the looping set is still warned of
    unmade = (f"train.mixture=[{{name: later, shards: '{tmp_path / 'not-yet'}', weight: 1}}, {{name: own, weight: 3}}, "
              f"{{name: other, shards: '{other}', weight: 1}}]")
    assert check_warnings(caplog, config, f"train.steps={steps}", f"train.batch_size={batch * 5 // 4}", unmade)
    # under train.mixture_schedule each set's rows are what its stages give it: the even mixture, then own alone
    own_rows = batch // 2 + (steps - 1) * batch  # half of step 1's rows, then every row
    scheduled = check_warnings(caplog, config, f"train.steps={steps}", f"train.batch_size={batch}", even,
                               "train.mixture_schedule=[{step: 1, weights: {own: 1}}]")
    assert len(scheduled) == 1 and scheduled[0].endswith(
        f"'own' {own_rows / records:.2f} epochs ({records} records for {own_rows / (steps * batch):.0%} of the rows); "
        "to see each record once, build larger sets or lower train.steps or their weights")


def test_a_stage_counts_the_rows_of_its_own_stream(fixture_stages: Path, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A stage (``train.branch_data=own``) reads its data from its branch step on: the steps before it are its
    parent's, so they neither loop its data nor move its mixture's changes."""
    from tests.fixture_run import run_copy

    config = run_copy(fixture_stages, tmp_path)
    train = json.loads((tmp_path / "runs" / "tiny" / "shards" / "manifest.json").read_text("utf-8"))["splits"]["train"]
    records = train["records"]
    batch, start = 8, 1000
    steps = records // batch + 1  # one step more than a pass
    stage = ("train.branch_from=tiny", f"train.branch_step={start}", "train.branch_data=own",
             f"train.batch_size={batch}", "train.warmup_steps=1")
    caplog.clear()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert check_main(["--config", str(config), *stage, f"train.steps={start + steps}"]) == 0, err.getvalue()
    assert [r.getMessage() for r in caplog.records if "epochs" in r.getMessage()] == [
        f"(train.steps - train.branch_step) x train.batch_size x model.max_seq_len = {steps} x {batch} x 64 = "
        f"{steps * batch * 64:,} tokens, but the training shards in {tmp_path / 'runs' / 'tiny' / 'shards'} hold "
        f"{records} records ({train['tokens']:,} tokens): the run goes over its training data "
        f"{steps * batch / records:.2f} times (epochs); to see each record once, build a larger corpus "
        "(corpus.sources[].max_bytes) or lower train.steps"]
    caplog.clear()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert check_main(["--config", str(config), *stage, f"train.steps={start + steps - 1}"]) == 0
    assert not [r.getMessage() for r in caplog.records if "epochs" in r.getMessage()]
