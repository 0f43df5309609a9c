"""Recipe 07b: the SkyPilot managed-job task and the xpk workload written for each shipped config, checked by the
engines' own loaders (SkyPilot's task YAML schema and ``Resources``, xpk's argument parser), offline."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest
import yaml

from experiment.config import ExperimentConfig, load_config
from tests.conftest import import_extra
from tests.recipe_runner import recipe_module
from trainer.launch_spec import PREEMPTED_EXIT_CODE, SKY_GPUS, TPU_KINDS, launch_target, write_launch_files
from trainer.preemption import PREEMPTED_EXIT_CODE as TRAINER_PREEMPTED_EXIT_CODE

REPO = Path(__file__).resolve().parents[1]
BUCKET = "gs://test-bucket/runs"
LAUNCHABLE = (*TPU_KINDS, *SKY_GPUS)


def shipped_options() -> list[tuple[str, int | None]]:
    """(config, option) for every shipped config on a Cloud TPU or GPU: its own setting and each plan option."""
    cases = []
    for path in sorted((REPO / "recipes" / "configs").glob("*.yaml")):
        cfg = load_config(path, [f"experiment.run_root={BUCKET}"])
        if cfg.cost.accelerator not in LAUNCHABLE:
            continue  # the CPU demos: nothing to rent
        cases.append((path.name, None))
        cases += [(path.name, i) for i, o in enumerate(cfg.cost.plan_options) if o.accelerator in LAUNCHABLE]
    return cases


SHIPPED = shipped_options()


def write(tmp_path: Path, name: str, option: int | None, *extra: str) -> tuple[ExperimentConfig, Path]:
    config = f"recipes/configs/{name}"
    overrides = [f"experiment.run_root={BUCKET}", *extra]
    cfg = load_config(REPO / config, overrides)
    files = write_launch_files(cfg, REPO / config, overrides, tmp_path, option, repo_root=REPO)
    return cfg, files


def test_every_shipped_tpu_and_gpu_config_is_covered() -> None:
    assert {name for name, _ in SHIPPED} == {"gigachat3-lightning-ru-v6e-32.yaml", "qwen3-30b-a3b-ru-v5p-64.yaml",
                                            "ru-1b-fineweb2-v6e-8.yaml", "ru-70b-v5p-128.yaml", "ru-8b-v6e-64.yaml"}
    assert PREEMPTED_EXIT_CODE == TRAINER_PREEMPTED_EXIT_CODE


@pytest.mark.parametrize(("name", "option"), SHIPPED, ids=[f"{n.removesuffix('.yaml')}-{o}" for n, o in SHIPPED])
def test_the_sky_task_parses_with_skypilots_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                                    option: int | None) -> None:
    sky = import_extra("sky", "launch")
    cfg, files = write(tmp_path, name, option)
    target = files.target
    chosen = cfg.cost if option is None else cfg.cost.plan_options[option]
    assert (target.accelerator, target.chips, target.pricing) == (chosen.accelerator, chosen.chips, chosen.pricing)
    monkeypatch.chdir(REPO)  # the task's workdir is the repository, as `sky jobs launch` is run from its root
    task = sky.Task.from_yaml(str(files.sky_task))
    (resources,) = task.resources
    assert resources.use_spot == (chosen.pricing == "spot")
    assert resources.job_recovery["max_restarts_on_errors"] == 3
    assert resources.job_recovery["recover_on_exit_codes"] == [PREEMPTED_EXIT_CODE]
    (accelerator, count), = resources.accelerators.items()
    tpu = TPU_KINDS.get(chosen.accelerator)
    if tpu is not None:  # one SkyPilot node per slice: `run` runs on each of its hosts
        assert (accelerator, count, task.num_nodes) == (f"{tpu.sky_prefix}-{chosen.chips * tpu.cores_per_chip}", 1, 1)
    else:
        assert (accelerator, count * task.num_nodes) == (SKY_GPUS[chosen.accelerator], chosen.chips)
    assert str(resources.cloud).lower() == target.cloud
    argv = shlex.split(task.run.splitlines()[-1].removeprefix("exec "))
    assert argv[:4] == ["python", "recipes/04_pretrain.py", "--config", f"recipes/configs/{name}"]
    assert f"experiment.run_root={BUCKET}" in argv
    assert ("train.distributed=true" in argv) == (target.hosts > 1)
    if option is not None and (chosen.accelerator, chosen.chips) != (cfg.cost.accelerator, cfg.cost.chips):
        assert f"cost.accelerator={chosen.accelerator}" in argv or f"cost.chips={chosen.chips}" in argv
    # the loader checks what it reads: a misspelt key of the same file is refused
    bad = files.sky_task.read_text().replace("use_spot:", "use_spott:")
    with pytest.raises(Exception, match="use_spot"):
        sky.Task.from_yaml_str(bad)


@pytest.mark.parametrize(("name", "option"), [c for c in SHIPPED if c[1] is None])
def test_the_xpk_command_parses_with_xpks_parser(tmp_path: Path, name: str, option: int | None) -> None:
    xpk_core = import_extra("xpk.parser.core", "launch")
    cfg, files = write(tmp_path, name, option)
    line = files.xpk_script.read_text().splitlines()[-1]
    line = line.replace("${XPK_CLUSTER}", "my-cluster").replace("${XPK_PROJECT}", "my-project")
    argv = shlex.split(line.replace("${XPK_ZONE}", "us-central1-a"))
    assert argv[0] == "xpk"
    parser = argparse.ArgumentParser()
    xpk_core.set_parser(parser)
    args = parser.parse_args(argv[1:])  # xpk's own checks: --tpu-type among its slices, the workload's name
    assert args.tpu_type == files.target.tpu_slice and args.max_restarts == "3" and args.num_slices == 1
    assert args.spot == files.target.spot
    assert f"experiment.run_root={BUCKET}" in args.command
    assert ("train.distributed=true" in args.command) == (files.target.hosts > 1)
    with pytest.raises(SystemExit):  # a slice xpk does not know is refused by the same parser
        parser.parse_args([*argv[1:], "--tpu-type", "v5p-127"])


def test_slices_hosts_and_names() -> None:
    cfg = load_config(REPO / "recipes/configs/ru-70b-v5p-128.yaml", [f"experiment.run_root={BUCKET}"])
    own = launch_target(cfg, None)
    assert (own.tpu_slice, own.hosts) == ("v5p-128", 16)  # v5p slices count TensorCores: 64 chips, 4 per host
    one_host = load_config(REPO / "recipes/configs/ru-1b-fineweb2-v6e-8.yaml", [f"experiment.run_root={BUCKET}"])
    assert (launch_target(one_host, None).tpu_slice, launch_target(one_host, None).hosts) == ("v6e-8", 1)


def test_a_local_run_root_is_one_error_line_and_nothing_is_written(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    recipe = recipe_module("07b_launch_spec.py")
    out = tmp_path / "launch"
    with pytest.raises(SystemExit) as exited:
        recipe.main(["--config", str(REPO / "recipes/configs/ru-8b-v6e-64.yaml"), "--out", str(out),
                     "experiment.run_root=runs"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "experiment.run_root" in err and "gs://" in err
    assert not out.exists()


@pytest.mark.parametrize(("overrides", "option", "message"), [
    ([], 9, "cost.plan_options has 5 option"),
    (["cost.accelerator=cpu-e2-standard-2", "cost.chips=1"], None, "not a Cloud TPU or NVIDIA GPU option"),
    (["cost.chips=6"], None, "is no Cloud TPU slice"),
])
def test_options_that_cannot_be_launched_are_named(tmp_path: Path, overrides: list[str], option: int | None,
                                                   message: str) -> None:
    from experiment.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        write(tmp_path, "ru-8b-v6e-64.yaml", option, *overrides)
    assert not any(tmp_path.iterdir())


def test_only_the_configs_variables_travel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RU_GIGACHAT3_LIGHTNING", "gs://models/GigaChat3")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-the-task")
    _, files = write(tmp_path, "gigachat3-lightning-ru-v6e-32.yaml", None)
    task = yaml.safe_load(files.sky_task.read_text())
    assert task["envs"] == {"RU_RUNS": BUCKET, "RU_GIGACHAT3_LIGHTNING": "gs://models/GigaChat3"}
    assert "not-for-the-task" not in files.sky_task.read_text() + files.xpk_script.read_text()
