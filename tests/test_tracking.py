"""Rubles in W&B: logged as a metric with loss against it, totals in the summary, read back offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from experiment.config import build_dataclass
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from tracking.metrics import RUB_SPENT, by_rubles, define_cost_metrics, log_step
from tracking.readback import find_offline_runs, inspect_command, read_offline_run, read_offline_runs
from tracking.wandb_run import open_run


class RecordingRun:
    """Records what a W&B run was asked to do (for the pure helper tests)."""

    def __init__(self) -> None:
        self.metrics: list[tuple[str, dict]] = []
        self.logged: list[tuple[int, dict]] = []
        self.summary: dict = {}
        self.config_updates: dict = {}

    def define_metric(self, name: str, **kwargs: object) -> None:
        self.metrics.append((name, kwargs))

    def log(self, payload: dict, step: int) -> None:
        self.logged.append((step, payload))

    @property
    def config(self) -> RecordingRun:
        return self

    def update(self, values: dict, allow_val_change: bool = False) -> None:
        self.config_updates.update(values)


COST = {RUB_SPENT: 12.5, "cost/usd_spent": 0.125, "cost/tokens": 1000.0}  # what the cost package hands in


def test_helpers_define_and_log() -> None:
    run = RecordingRun()
    define_cost_metrics(run)
    assert (RUB_SPENT, {"summary": "max"}) in run.metrics
    assert ("by_rub/*", {"step_metric": RUB_SPENT}) in run.metrics
    payload = log_step(run, 30, {"train/step": 30, "train/loss": 2.5, "train/lr": 1e-3, "eval/val_bpb": 1.9}, COST)
    assert run.logged == [(30, payload)]
    # every series has a copy against rubles; the step counter and the cost itself do not
    assert payload[RUB_SPENT] == 12.5 and payload["by_rub/train/loss"] == 2.5 and payload["by_rub/train/lr"] == 1e-3
    assert payload["by_rub/eval/val_bpb"] == 1.9
    assert not {"by_rub/train/step", "by_rub/cost/tokens"} & set(payload)
    assert "by_rub/train/loss" not in log_step(run, 31, {"train/loss": 2.4}, {})  # no rubles yet: no copy
    assert payload["cost/tokens"] == 1000.0
    assert by_rubles({"eval/loss": 3.0}) == {"by_rub/eval/loss": 3.0}


def offline_cfg(tmp_path: Path, name: str = "trk", mode: str = "offline") -> ExperimentConfig:
    return build_dataclass(ExperimentConfig, {"experiment": {"name": name, "run_root": str(tmp_path / "runs")},
                                              "wandb": {"mode": mode, "project": "t"}})


@pytest.mark.integration
def test_offline_run_read_back_with_wandb_cli(tmp_path: Path, restore_wandb_env: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = offline_cfg(tmp_path)
    folder = RunFolder.for_config(cfg)
    with open_run(cfg, folder, job_type="pretrain") as run:
        define_cost_metrics(run)
        for step, (loss, rub) in enumerate([(5.0, 0.1), (4.0, 0.2), (3.5, 0.3)], start=1):
            log_step(run, step * 10, {"train/loss": loss}, {**COST, RUB_SPENT: rub})
        run.summary["cost/rub_by_phase/train"] = 12.5
        run.config.update({"cost_price_row": {"name": "tpu-v5e", "usd": 1.2}})
        run_id = run.id
    (run_dir,) = find_offline_runs(folder.wandb)
    record = read_offline_run(run_dir)
    assert (record.run_id, record.group, record.job_type, record.state) == (run_id, "trk", "pretrain", "finished")
    assert record.summary["cost/rub_by_phase/train"] == 12.5
    assert record.config["cost_price_row"]["name"] == "tpu-v5e"
    assert record.config["experiment"]["name"] == "trk"
    assert [(h[RUB_SPENT], h["by_rub/train/loss"]) for h in record.history] == [(0.1, 5.0), (0.2, 4.0), (0.3, 3.5)]
    assert read_offline_runs(folder.wandb, group="other") == []
    assert read_offline_runs(folder.wandb, exclude_ids=(run_id,)) == []
    # what we run is what wandb's own CLI runs: the same records, byte for byte
    cli = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
                         capture_output=True, text=True, timeout=120, check=True)
    ours = subprocess.run(inspect_command(run_dir), capture_output=True, text=True, timeout=120, check=True)
    assert ours.stdout == cli.stdout and '"type":"history"' in ours.stdout
    # a bare relative name, as a user types it beside the run, reads the same run
    monkeypatch.chdir(run_dir.parent)
    relative = subprocess.run(inspect_command(Path(run_dir.name)), capture_output=True, text=True, timeout=120,
                              check=True)
    assert relative.stdout == ours.stdout


@pytest.mark.integration
def test_a_damaged_run_log_is_read_around_the_damage_and_named(tmp_path: Path, restore_wandb_env: None,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A flipped byte in a run's log (a disk error, a copy gone wrong): the rows outside the damaged block are
    read, and a warning names the run and what the reader skipped, so a comparison never uses it unawares."""
    cfg = offline_cfg(tmp_path)
    with open_run(cfg, RunFolder.for_config(cfg), job_type="pretrain") as run:
        for step in range(1, 201):
            log_step(run, step, {"train/loss": 1.0 / step}, {RUB_SPENT: 0.01 * step})
    (run_dir,) = find_offline_runs(RunFolder.for_config(cfg).wandb)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "tracking.readback" and r.levelname == "WARNING"]

    with caplog.at_level("WARNING", logger="tracking.readback"):
        whole = read_offline_run(run_dir)
    assert warnings() == [], "an intact log read with a warning"
    (log,) = run_dir.glob("run-*.wandb")
    damaged = bytearray(log.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    log.write_bytes(bytes(damaged))
    with caplog.at_level("WARNING", logger="tracking.readback"):
        record = read_offline_run(run_dir)
    assert 0 < len(record.history) < len(whole.history) == 200
    remaining = iter(whole.history)  # what was read is the intact run's rows, in order, less the damaged block's
    assert all(row in remaining for row in record.history)
    (warning,) = warnings()
    assert str(run_dir) in warning and "corrupt" in warning


def test_a_process_that_does_not_report_opens_no_run_and_writes_nothing(tmp_path: Path,
                                                                       restore_wandb_env: None) -> None:
    """JAX processes other than the first: the stage logs as usual, and nothing reaches W&B or the disk."""
    cfg = offline_cfg(tmp_path)
    folder = RunFolder.for_config(cfg)
    with open_run(cfg, folder, job_type="pretrain", reports=False) as run:
        define_cost_metrics(run)
        log_step(run, 10, {"train/loss": 5.0}, {RUB_SPENT: 0.1})
        run.summary["cost/rub_total"] = 0.1
        assert run.id is None and not run.offline
    assert not (tmp_path / "runs").exists()


def test_online_runs_through_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API path maps W&B's public Run objects onto the same RunRecord (network faked)."""
    import types

    import wandb

    from tracking.readback import read_online_runs

    history = [{"train/loss": 5.0, RUB_SPENT: 0.1}, {"train/loss": 4.0, RUB_SPENT: 0.2}]
    run = types.SimpleNamespace(id="abc", name="g-pretrain", group="g", job_type="pretrain", state="finished",
                                config={"cost_chips": 8}, summary_metrics={"cost/rub_total": 3.0},
                                created_at="2026-11-30T00:00:00", scan_history=lambda keys: iter(history))
    calls = {}

    class FakeApi:
        def __init__(self, timeout: int) -> None:
            calls["timeout"] = timeout

        def runs(self, path: str, filters: dict) -> list:
            calls["path"], calls["filters"] = path, filters
            return [run]

    monkeypatch.setattr(wandb, "Api", FakeApi)
    (record,) = read_online_runs("proj", "team", "g", ["train/loss", RUB_SPENT])
    assert calls == {"timeout": 20, "path": "team/proj", "filters": {"group": "g"}}
    assert (record.run_id, record.job_type, record.summary, record.history) == ("abc", "pretrain",
                                                                              {"cost/rub_total": 3.0}, history)


def test_artifact_helper_names_and_skips_disabled(tmp_path: Path) -> None:
    from tracking.artifacts import artifact_name, log_files

    assert artifact_name("costs/plan table") == "costs-plan-table"
    assert log_files(None, "x", "report", [tmp_path]) is None


def test_a_silent_run_builds_no_artifact(tmp_path: Path) -> None:
    from tracking.artifacts import log_files, use_reference
    from tracking.wandb_run import SilentRun

    trace = tmp_path / "trace.json.gz"
    trace.write_bytes(b"x" * 1024)
    assert log_files(SilentRun(), "profile", "profile", [trace], root=tmp_path) is None
    assert use_reference(SilentRun(), "base", "base-model", tmp_path) is None


@pytest.mark.integration
def test_auto_mode_falls_back_to_offline_when_wandb_is_unreachable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An API key but no W&B server (a closed loopback port): offline within seconds, with a warning."""
    import time

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "f" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    cfg = offline_cfg(tmp_path, mode="auto")
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="tracking"), open_run(cfg, RunFolder.for_config(cfg), "pretrain") as run:
        run.log({"train/loss": 1.0}, step=1)
    assert time.monotonic() - started < 20
    assert "cannot reach W&B at http://127.0.0.1:9" in caplog.text and "offline" in caplog.text
    (run_dir,) = find_offline_runs(RunFolder.for_config(cfg).wandb)
    assert read_offline_run(run_dir).history[0]["train/loss"] == 1.0


@pytest.mark.integration
def test_a_credential_in_the_config_is_in_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config value reading a key from the environment: the recipe runs with it, and no file of the run
    folder or of the W&B run (its binary .wandb file included) holds the key; the records say ${VAR}."""
    from tests.recipe_runner import run_recipe, tiny_config

    key, token = "wk-9f3a1c77e2b0d4c6", "hf_Qz81LmXw0pTaa"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key)  # not WANDB_API_KEY: the recipe runner drops it
    monkeypatch.setenv("HF_TOKEN", token)
    config = tiny_config(tmp_path, experiment={"name": "tiny", "description": "key ${AWS_SECRET_ACCESS_KEY}"},
                         cost={"plan_model": "1b", "plan_tokens": 1_000_000_000},
                         wandb={"tags": ["${HF_TOKEN:-none}"]})
    proc = run_recipe("07_plan_costs.py", config, timeout=120)
    files = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and any(p.name == "config.resolved.yaml" for p in files)
    for path in files:
        data = path.read_bytes()
        assert key.encode() not in data and token.encode() not in data, path
    assert key not in proc.stdout + proc.stderr and token not in proc.stdout + proc.stderr
    resolved = (tmp_path / "runs" / "tiny" / "config.resolved.yaml").read_text(encoding="utf-8")
    assert "description: key ${AWS_SECRET_ACCESS_KEY}" in resolved and "${HF_TOKEN:-none}" in resolved


def test_a_wandb_folder_deleted_mid_run_is_warned_about_once(tmp_path: Path, restore_wandb_env: None,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    import shutil

    from trainer.reporting import log_metrics

    cfg = offline_cfg(tmp_path)
    folder = RunFolder.for_config(cfg)
    with caplog.at_level("WARNING", logger="tracking"), open_run(cfg, folder, job_type="pretrain") as run:
        log_metrics(run, None, 1, {"train/step": 1}, None)
        assert "was deleted" not in caplog.text  # the folder is there: no word
        shutil.rmtree(folder.wandb)
        for step in (2, 3):
            log_metrics(run, None, step, {"train/step": step}, None)
    warnings = [r.getMessage() for r in caplog.records if "was deleted" in r.getMessage()]
    assert len(warnings) == 1 and str(folder.wandb.resolve()) in warnings[0] and "recipe 06" in warnings[0]
