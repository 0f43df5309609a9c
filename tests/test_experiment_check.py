"""Checks before anything is written: ``python -m experiment.check`` (``make check``) runs every recipe's checks of a
config and writes nothing; each recipe runs its stage's before it makes the run folder, a lock, the resolved config
or a W&B run. A wrong value is one line naming its key."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiment.check import main as check_main
from tests.recipe_runner import REPO, error_line, run_recipe, tiny_config

SHIPPED = sorted((REPO / "recipes" / "configs").glob("*.yaml"))
DEMO = REPO / "recipes" / "configs" / "demo.yaml"

# (override(s), the key the one error line names): a realistic typo in every section a recipe reads
TYPOS = [
    ("eval.tasks=[rublimpp]", "eval.tasks"),
    ("eval.train_tasks=[parsu]", "eval.train_tasks"),
    ("cost.plan_model=15b", "cost.plan_model"),
    ("cost.accelerator=tpu-v7", "cost.accelerator"),
    ("cost.pricing=spott", "cost.pricing"),
    ("cost.plan_options=[{accelerator: tpu-v6ee, chips: 8}]", "cost.plan_options[0].accelerator"),
    ("cost.plan_options=[{accelerator: tpu-v6e, chips: 8, pricing: spto}]", "cost.plan_options[0].pricing"),
    ("cost.infrastructure=[{name: cpu-host-e2-standard-166}]", "cost.infrastructure[0].name"),
    ("cost.usd_rub_date=2025-13-01", "cost.usd_rub_date"),
    ("cost.chips=-1", "cost.chips"),
    ("train.mesh.fsdp=3", "train.batch_size"),
    # the 8B config's batch of 320 on a v6e-256 it plans: 256 data-parallel devices do not split it
    ("cost.plan_options=[{accelerator: tpu-v6e, chips: 256}]", "cost.plan_options[0]"),
    ("train.fit_topologies=[v6e-9]", "train.fit_topologies"),
    ("model.init_from=/nonexistent/Qwen3-1.7B", "model.init_from"),
    ("tokenizer.adopt_from=/nonexistent/tokenizer.json", "tokenizer.adopt_from"),
    ("train.learning_rate=-3e-4", "train.learning_rate"),
    ("train.learning_rate=1e-300", "train.learning_rate"),
    ("train.batch_size=16777216", "train.batch_size"),
    ("train.stpes=100", "train.stpes"),
    ("experiment.name=.locks", "experiment.name"),
    ("experiment.name=checkpoints", "experiment.name"),
    ("cost.contract_rates={cpu-e2-standard-2: 1e308}", "cost.contract_rates.cpu-e2-standard-2"),  # inf RUB an hour
    ("experiment.name=" + "опыт" * 17, "experiment.name"),  # 136 bytes (past 255 with suffixes: 'File name too long')
    ("generate.prompt_file=/nonexistent/prompts.txt", "generate.prompt_file"),
    ("generate.max_new_tokens=500", "generate.max_new_tokens"),
    ("experiment.variants=[{model.d_model: 130}]", "model.head_dim"),  # a sweep variant's own overrides
]


@dataclasses.dataclass
class Sandbox:
    """Empty folders for everything a check could write to: the working directory (a relative run_root), RU_RUNS,
    the caches under HOME and XDG_CACHE_HOME, the host-local root and W&B's folder."""

    root: Path

    @property
    def folders(self) -> list[Path]:
        return [self.root / name for name in ("cwd", "runs", "home", "cache", "local", "wandb")]

    def written(self) -> list[str]:
        return sorted(str(path.relative_to(self.root)) for folder in self.folders for path in folder.rglob("*"))


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    box = Sandbox(tmp_path)
    for folder in box.folders:
        folder.mkdir()
    monkeypatch.chdir(box.root / "cwd")
    for var, name in (("RU_RUNS", "runs"), ("HOME", "home"), ("XDG_CACHE_HOME", "cache"),
                      ("RU_PRETRAIN_LOCAL", "local"), ("WANDB_DIR", "wandb")):
        monkeypatch.setenv(var, str(box.root / name))
    return box


def run_check(config: Path, *overrides: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = check_main(["--config", str(config), *overrides])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("config", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_every_shipped_config_passes_every_check_and_writes_nothing(config: Path, sandbox: Sandbox) -> None:
    code, out, err = run_check(config)
    assert (code, err) == (0, ""), err
    assert out.startswith(f"ok: {config}: ")
    assert sandbox.written() == []


@pytest.mark.parametrize(("overrides", "key"), TYPOS, ids=[typo for typo, _ in TYPOS])
def test_a_typo_is_one_line_naming_its_key_and_nothing_is_written(overrides: str, key: str, sandbox: Sandbox) -> None:
    config = REPO / "recipes" / "configs" / "ru-8b-v6e-64.yaml" if "chips: 256" in overrides else DEMO
    code, out, err = run_check(config, *split_overrides(overrides))
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"'{key}" in lines[0], err
    assert sandbox.written() == []


def split_overrides(text: str) -> list[str]:
    """Overrides separated by spaces outside brackets (a list override holds spaces)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{"
        depth -= char in "]}"
        if char == " " and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def test_a_base_model_in_a_bucket_is_named_as_not_read_and_its_presets_context_is_checked(sandbox: Sandbox) -> None:
    """The shipped GigaChat 3 config's base is a bucket the check does not read offline: the summary says so; its
    preset's context stands for the base's, so a longer model.max_seq_len is still one line."""
    config = REPO / "recipes" / "configs" / "gigachat3-lightning-ru-v6e-32.yaml"
    code, out, _ = run_check(config)
    assert code == 0 and "model.init_from gs://" in out and "is in a bucket" in out
    code, _, err = run_check(config, "model.max_seq_len=8192")
    assert code == 1 and err.startswith("error: config key 'model.max_seq_len': 8192 is past the base model's context "
                                        "(4096, model.preset 'gigachat3-lightning''s max_seq_len)")
    assert sandbox.written() == []


def test_reserved_experiment_names_cover_the_run_folders_entries() -> None:
    """Every folder a RunFolder names is a name experiment.name may not take."""
    from experiment.runfolder import RESOLVED_CONFIG, RunFolder
    from experiment.sections.experiment import RUN_FOLDER_ENTRIES

    folder = RunFolder(Path("/r"))
    named = {getattr(folder, attr).name for attr, value in vars(RunFolder).items() if isinstance(value, property)
             and attr not in ("root", "local", "in_bucket")}
    assert named | {RESOLVED_CONFIG, "configs", "xla_cache"} <= set(RUN_FOLDER_ENTRIES)


@pytest.mark.integration
def test_make_check_runs_the_checks(tmp_path: Path) -> None:
    """``make check CONFIG=... ARGS=...`` is the command's: ok on the demo, one line for a typo (make adds its own
    status line after it)."""
    runs = tmp_path / "runs"
    command = ["make", "-s", "--no-print-directory", "-o", "setup", "check", f"PY={sys.executable}", f"CONFIG={DEMO}"]
    # as a user runs it: not as a sub-make of `make test` (which would add its jobserver warning and directories)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    ok = subprocess.run([*command, f"ARGS=experiment.run_root={runs}"], cwd=REPO, capture_output=True, text=True,
                        timeout=300, env=env)
    assert ok.returncode == 0 and ok.stdout.startswith("ok: "), ok.stderr
    bad = subprocess.run([*command, f"ARGS=experiment.run_root={runs} cost.plan_model=15b"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode != 0
    assert bad.stderr.splitlines()[0].startswith("error: config key 'cost.plan_model': unknown model '15b'")
    assert not runs.exists()


# (recipe, override, the key its one error line names): each used to write the run folder's resolved config (and,
# but for recipe 04's, open a W&B run) before the check fired, or to go on without one
LATE = [
    ("04_pretrain.py", "eval.train_tasks=[parsu]", "eval.train_tasks"),
    ("04_pretrain.py", "model.init_from=/nonexistent/base", "model.init_from"),
    ("05_evaluate.py", "eval.tasks=[rublimpp]", "eval.tasks"),
    ("07_plan_costs.py", "cost.plan_model=15b", "cost.plan_model"),
    ("07_plan_costs.py", "cost.accelerator=tpu-v7", "cost.accelerator"),
    ("07_plan_costs.py", "cost.plan_options=[{accelerator: tpu-v6e, chips: 8, pricing: spott}]",
     "cost.plan_options[0].pricing"),
    ("07_plan_costs.py", "cost.plan_options=[{accelerator: tpu-v6e, chips: 32}]", "cost.plan_options[0]"),
    ("09_generate.py", "generate.prompt_file=/nonexistent/prompts.txt", "generate.prompt_file"),
    ("09_generate.py", "generate.max_new_tokens=64", "generate.max_new_tokens"),
    ("02_train_tokenizer.py", "tokenizer.adopt_from=/nonexistent/tokenizer.json", "tokenizer.adopt_from"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("recipe", "override", "key"), LATE, ids=[f"{r}:{o}" for r, o, _ in LATE])
def test_a_recipe_refuses_a_wrong_config_before_it_writes_anything(recipe: str, override: str, key: str,
                                                                   tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    proc = run_recipe(recipe, config, override, check=False)
    assert proc.returncode == 2
    line = error_line(proc)
    assert line.startswith(f"error: config key '{key}"), proc.stderr[-2000:]
    assert not (tmp_path / "runs").exists()  # no run folder, lock, resolved config, ledger or W&B files


@pytest.mark.integration
def test_recipe_04_compares_the_batch_with_the_training_records_before_it_writes(fixture_stages: Path,
                                                                                 tmp_path: Path) -> None:
    """A batch of more sequences than recipe 03 wrote training records is one line, before the run is written."""
    from tests.fixture_run import run_copy

    config = run_copy(fixture_stages, tmp_path)
    run = tmp_path / "runs" / "tiny"
    records = json.loads((run / "shards" / "manifest.json").read_text("utf-8"))["splits"]["train"]["records"]
    proc = run_recipe("04_pretrain.py", config, f"train.batch_size={records * 2}", check=False)
    assert proc.returncode == 2
    assert error_line(proc).startswith(f"error: config key 'train.batch_size': {records * 2:,} sequences a step, but ")
    assert sorted(os.listdir(run)) == ["corpus", "shards", "tokenizer"]


@pytest.mark.integration
def test_continued_pretraining_past_the_base_context_is_refused_unless_extend_context(fixture_stages: Path,
                                                                                      tmp_path: Path) -> None:
    """A base built for 32 positions continued at model.max_seq_len 64 used to train (and export as a 64-position
    model) without a word: now one line naming both lengths and the key that allows it, before the run is written;
    with model.extend_context=true it trains, and its export declares the 64 it was trained at."""
    from tests.test_continue_pretraining import BASE_MODEL, continue_config, hf_base_folder

    (tmp_path / "base").mkdir()
    base = hf_base_folder(tmp_path / "base", dataclasses.replace(BASE_MODEL, max_seq_len=32))
    config = continue_config(fixture_stages, tmp_path / "run", base, steps=0)
    run = tmp_path / "run" / "runs" / "tiny"
    proc = run_recipe("04_pretrain.py", config, check=False)
    assert proc.returncode == 2
    assert error_line(proc) == (
        f"error: config key 'model.max_seq_len': 64 is past the base model's context (32, max_position_embeddings of "
        f"{base / 'config.json'}): continued pretraining would train positions the base never saw, with RoPE not "
        "rescaled for them; set model.max_seq_len to at most 32, or model.extend_context=true to train the longer "
        "context as it is")
    assert sorted(os.listdir(run)) == ["corpus", "shards", "tokenizer"]
    run_recipe("04_pretrain.py", config, "model.extend_context=true")
    run_recipe("05b_export_hf.py", config, "model.extend_context=true")
    exported = json.loads((run / "export" / "hf" / "step_0000000" / "config.json").read_text("utf-8"))
    assert exported["max_position_embeddings"] == 64


def test_a_plan_option_without_a_published_rate_is_a_note_not_an_error(sandbox: Sandbox) -> None:
    """A Russian cloud's row the catalog knows without a figure: recipe 07 plans its hours and asks for the rate
    (cost/README.md), so its check says so and lets the plan run; recipe 04 on that row is refused."""
    option = "cost.plan_options=[{accelerator: nvidia-a100, chips: 8, cloud: yandex}]"
    code, out, err = run_check(DEMO, option)
    assert (code, err) == (0, ""), err
    assert "no rubles for cost.plan_options[0]" in out and "asks for the rate" in out
    code, _, err = run_check(DEMO, "cost.accelerator=nvidia-a100", "cost.cloud=yandex")
    assert code == 1 and err.startswith("error: ") and len(err.splitlines()) == 1
    assert sandbox.written() == []
