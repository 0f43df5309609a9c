"""Recipe 07b: the SkyPilot managed-job task and the xpk workload written for each shipped config, checked by the
engines' own loaders (SkyPilot's task YAML schema and ``Resources``, xpk's argument parser), offline.

The engines run in a venv of their own (``make launch-engines``: SkyPilot pins click below what W&B needs), so the
files are written here and read there, all at once, by tests/launch_engines.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from experiment.config import ExperimentConfig, load_config
from tests.conftest import skip_unless_required
from tests.recipe_runner import recipe_module
from trainer.launch_spec import (
    PREEMPTED_EXIT_CODE,
    SKY_GPUS,
    TPU_KINDS,
    LaunchFiles,
    launch_target,
    write_launch_files,
)
from trainer.watchdog import HUNG_EXIT_CODE

REPO = Path(__file__).resolve().parents[1]
BUCKET = "gs://test-bucket/runs"
LAUNCHABLE = (*TPU_KINDS, *SKY_GPUS)


def shipped_options() -> list[tuple[str, int | None, str]]:
    """(config, option, accelerator) for every shipped config on a Cloud TPU or GPU: its own setting and each TPU
    or GPU option of its plan."""
    cases = []
    for path in sorted((REPO / "recipes" / "configs").glob("*.yaml")):
        cfg = load_config(path, [f"experiment.run_root={BUCKET}"])
        if cfg.cost.accelerator not in LAUNCHABLE:
            continue  # the CPU demos: nothing to rent
        cases.append((path.name, None, cfg.cost.accelerator))
        cases += [(path.name, i, o.accelerator) for i, o in enumerate(cfg.cost.plan_options)
                  if o.accelerator in LAUNCHABLE]
    return cases


CASES = shipped_options()
SHIPPED = [(name, option) for name, option, _ in CASES]
IDS = [f"{name.removesuffix('.yaml')}-{'own' if option is None else option}" for name, option in SHIPPED]
TPU_SHIPPED = [(name, option) for name, option, accelerator in CASES if accelerator in TPU_KINDS]
TPU_IDS = [case_id for case_id, (_, _, accelerator) in zip(IDS, CASES, strict=True) if accelerator in TPU_KINDS]


def write(out: Path, name: str, option: int | None, *extra: str) -> tuple[ExperimentConfig, LaunchFiles]:
    config = f"recipes/configs/{name}"
    overrides = [f"experiment.run_root={BUCKET}", *extra]
    cfg = load_config(REPO / config, overrides)
    return cfg, write_launch_files(cfg, REPO / config, overrides, out, option, repo_root=REPO)


def read_with_engines(pairs: list[tuple[str, Path]]) -> list[dict[str, Any]]:
    """What SkyPilot and xpk read from each (kind, file), in the launch engines' venv (tests/launch_engines.py)."""
    venv = Path(os.environ.get("RU_LAUNCH_ENGINES") or REPO / ".venvs" / "launch")
    python = venv / "bin" / "python"
    if not python.is_file():
        skip_unless_required(f"the launch engines (SkyPilot, xpk) are not installed in {venv} (make launch-engines)",
                             "RU_REQUIRE_EXTRAS", "launch" in os.environ.get("RU_REQUIRE_EXTRAS", "").split(","))
    argv = [str(python), str(REPO / "tests" / "launch_engines.py")]
    for kind, path in pairs:
        argv += [kind, str(path)]
    # the task's workdir is the repository: `sky jobs launch` is run from its root
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def engines_read(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every shipped case's files, and a misspelt copy of one of each, as the engines read them."""
    root = tmp_path_factory.mktemp("launch")
    cases = {case_id: write(root / case_id, name, option) for case_id, (name, option) in zip(IDS, SHIPPED,
                                                                                                strict=True)}
    pairs: list[tuple[str, Path]] = []
    for _, files in cases.values():
        pairs.append(("sky", files.sky_task))
        if files.xpk_script is not None:
            pairs.append(("xpk", files.xpk_script))
    sky_file, xpk_file = cases[IDS[0]][1].sky_task, cases[IDS[0]][1].xpk_script
    bad_sky, bad_xpk = root / "bad_sky.yaml", root / "bad_xpk.sh"
    bad_sky.write_text(sky_file.read_text().replace("use_spot:", "use_spott:"))
    bad_xpk.write_text(xpk_file.read_text().replace("--tpu-type v", "--tpu-type x"))
    read = iter(read_with_engines([*pairs, ("sky", bad_sky), ("xpk", bad_xpk)]))
    answers = {case_id: {"cfg": cfg, "files": files, "sky": next(read),
                         "xpk": next(read) if files.xpk_script is not None else None}
               for case_id, (cfg, files) in cases.items()}
    return {**answers, "bad_sky": next(read), "bad_xpk": next(read)}


def test_every_shipped_tpu_and_gpu_config_is_covered() -> None:
    assert {name for name, _ in SHIPPED} == {"gigachat3-lightning-ru-v6e-32.yaml", "qwen3-30b-a3b-ru-v5p-64.yaml",
                                            "ru-1b-fineweb2-v6e-8.yaml", "ru-70b-v5p-128.yaml", "ru-8b-v6e-64.yaml"}


@pytest.mark.integration  # the engines read in a process of their own
@pytest.mark.parametrize(("name", "option"), SHIPPED, ids=IDS)
def test_the_sky_task_parses_with_skypilots_loader(engines_read: dict[str, Any], name: str,
                                                    option: int | None) -> None:
    answer = engines_read[IDS[SHIPPED.index((name, option))]]
    cfg, files, task = answer["cfg"], answer["files"], answer["sky"]
    assert "error" not in task, task.get("error")
    chosen = cfg.cost if option is None else cfg.cost.plan_options[option]
    target = files.target
    assert (target.accelerator, target.chips, target.pricing) == (chosen.accelerator, chosen.chips, chosen.pricing)
    assert task["use_spot"] == (chosen.pricing == "spot")
    assert task["job_recovery"] == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3,
                                    "recover_on_exit_codes": [PREEMPTED_EXIT_CODE]}
    tpu = TPU_KINDS.get(chosen.accelerator)
    if tpu is not None:  # one SkyPilot node per slice: `run` runs on each of its hosts
        expected = (f"{tpu.sky_prefix}-{chosen.chips * tpu.cores_per_chip}", 1, 1)
        assert (task["accelerator"], task["count"], task["num_nodes"]) == expected
    else:
        assert task["accelerator"] == SKY_GPUS[chosen.accelerator]
        assert task["count"] * task["num_nodes"] == chosen.chips
        assert ("JAX_COORDINATOR_ADDRESS" in task["run"]) == (task["num_nodes"] > 1)
    assert task["cloud"] == target.cloud and task["workdir"] == "."  # the repository, where it is launched from
    argv = shlex.split(task["run"].splitlines()[-1].removeprefix("exec "))
    assert argv[:4] == ["$HOME/ru-pretrain-venv/bin/python", "recipes/04_pretrain.py", "--config",
                        f"recipes/configs/{name}"]
    assert f"experiment.run_root={BUCKET}" in argv
    assert ("train.distributed=true" in argv) == (target.hosts > 1)
    for key in ("accelerator", "chips", "pricing"):  # the ledger prices the option that runs
        if getattr(chosen, key) != getattr(cfg.cost, key):
            assert f"cost.{key}={getattr(chosen, key)}" in argv


@pytest.mark.integration  # the engines read in a process of their own
@pytest.mark.parametrize(("name", "option"), TPU_SHIPPED, ids=TPU_IDS)
def test_the_xpk_command_parses_with_xpks_parser(engines_read: dict[str, Any], name: str,
                                                  option: int | None) -> None:
    answer = engines_read[IDS[SHIPPED.index((name, option))]]
    files, args = answer["files"], answer["xpk"]
    assert "error" not in args, args.get("error")
    assert args["tpu_type"] == files.target.tpu_slice and args["max_restarts"] == "20" and args["num_slices"] == 1
    assert args["restart_on_exit_codes"] == str(HUNG_EXIT_CODE)  # xpk's defaults (42, 127-255) miss the watchdog's
    assert args["spot"] == files.target.spot and args["workload"] == answer["cfg"].experiment.name
    assert f"experiment.run_root={BUCKET}" in args["command"]
    assert ("train.distributed=true" in args["command"]) == (files.target.hosts > 1)


@pytest.mark.integration  # the engines read in a process of their own
def test_the_engines_refuse_what_they_cannot_read(engines_read: dict[str, Any]) -> None:
    """The loaders check: a misspelt key, a slice xpk does not know."""
    assert "use_spot" in engines_read["bad_sky"]["error"]
    assert "--tpu-type" in engines_read["bad_xpk"]["error"]


def test_slices_hosts_and_names() -> None:
    cfg = load_config(REPO / "recipes/configs/ru-70b-v5p-128.yaml", [f"experiment.run_root={BUCKET}"])
    own = launch_target(cfg, None)
    assert (own.tpu_slice, own.hosts) == ("v5p-128", 16)  # v5p slices count TensorCores: 64 chips, 4 per host
    one_host = load_config(REPO / "recipes/configs/ru-1b-fineweb2-v6e-8.yaml", [f"experiment.run_root={BUCKET}"])
    assert (launch_target(one_host, None).tpu_slice, launch_target(one_host, None).hosts) == ("v6e-8", 1)


@pytest.mark.integration  # runs recipe 07b
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


def test_an_s3_run_root_takes_its_endpoint_and_asks_for_its_keys(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_S3_ADDRESSING_STYLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://storage.yandexcloud.net")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-the-task")
    config = REPO / "recipes/configs/ru-8b-v6e-64.yaml"
    cfg = load_config(config, ["experiment.run_root=s3://my-bucket/runs"])
    files = write_launch_files(cfg, config, ["experiment.run_root=s3://my-bucket/runs"], tmp_path, repo_root=REPO)
    task = yaml.safe_load(files.sky_task.read_text())
    assert task["envs"] == {"RU_RUNS": "s3://my-bucket/runs", "AWS_ENDPOINT_URL_S3": "https://storage.yandexcloud.net"}
    assert task["secrets"] == {"WANDB_API_KEY": None, "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}
    assert "not-for-the-task" not in files.sky_task.read_text() + files.xpk_script.read_text()


def test_a_credential_the_config_names_travels_as_a_secret_only(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A config reading ``${HF_TOKEN}`` or a ``${DATABASE_URL}`` with a password: the SkyPilot task names them as
    secrets given at launch, the xpk command leaves them to the cluster and says so; no value is written."""
    config = tmp_path / "repo" / "with-secrets.yaml"
    config.parent.mkdir()
    text = (REPO / "recipes/configs/ru-8b-v6e-64.yaml").read_text(encoding="utf-8")
    config.write_text(text + "# ${HF_TOKEN} ${DATABASE_URL} ${RU_PLAIN}\n", encoding="utf-8")
    monkeypatch.setenv("HF_TOKEN", "hf_not-for-the-files")
    monkeypatch.setenv("DATABASE_URL", "postgres://me:not-for-the-files@db/x")
    monkeypatch.setenv("RU_PLAIN", "plain-value")
    overrides = [f"experiment.run_root={BUCKET}"]
    files = write_launch_files(load_config(config, overrides), config, overrides, tmp_path / "out",
                               repo_root=config.parent)
    task = yaml.safe_load(files.sky_task.read_text())
    assert task["envs"]["RU_PLAIN"] == "plain-value" and {"HF_TOKEN", "DATABASE_URL"} <= set(task["secrets"])
    assert "not-for-the-files" not in files.sky_task.read_text() + files.xpk_script.read_text()
    assert files.notes == ("the xpk workload does not carry HF_TOKEN, DATABASE_URL (credentials): give them to the "
                           "GKE workload as Kubernetes secrets",)


def test_a_config_outside_the_repository_gets_no_xpk_workload_and_a_note(tmp_path: Path) -> None:
    """SkyPilot mounts such a config; an xpk workload carries the repository folder only, so it would exit 2 on
    every start (not a restart code): none is written, and the note says why."""
    config = tmp_path / "elsewhere" / "ru-8b.yaml"
    config.parent.mkdir()
    config.write_text((REPO / "recipes/configs/ru-8b-v6e-64.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    overrides = [f"experiment.run_root={BUCKET}"]
    files = write_launch_files(load_config(config, overrides), config, overrides, tmp_path / "out", repo_root=REPO)
    assert files.sky_task is not None and files.xpk_script is None
    assert "file_mounts" in yaml.safe_load(files.sky_task.read_text())
    assert files.notes and files.notes[0].startswith(f"no xpk workload: {config} is outside the repository")
