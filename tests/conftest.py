"""The test session: offline hubs, offline W&B in a temporary folder, JAX on the CPU with the tests' compilation
cache, the integration marking and its guard, skip-with-reason helpers and the shared fixtures (tests/README.md)."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

from experiment.storage import location
from tests import recipe_runner
from tests.device_worker import DeviceWorker
from tests.fixture_run import prepare_stages, pretrain_fixture_run
from tests.recipe_runner import default_test_xla_cache, run_recipe, tiny_config, with_fast_cpu_compile, xla_cache_env
from tracking.process_hooks import quiet_closed_loop_callbacks

REPO_ROOT = Path(__file__).resolve().parents[1]
_WANDB_HOME = Path(tempfile.mkdtemp(prefix="wandb-tests-"))
atexit.register(shutil.rmtree, _WANDB_HOME, ignore_errors=True)  # hundreds of offline runs would pile up in /tmp

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("RU_SHARED_DATA", str((REPO_ROOT.parent / "shared" / "data").resolve()))
os.environ.pop("WANDB_API_KEY", None)
# WANDB__SAVE_REQUIREMENTS: no test reads the packages W&B lists with each run (~0.1 s of CPU a run, ~20 s in all)
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="offline", WANDB_SILENT="true",
                  WANDB__SAVE_REQUIREMENTS="false", **{f"WANDB_{sub.upper()}_DIR": str(_WANDB_HOME / sub)
                                                      for sub in ("cache", "config", "data")},
                  WANDB_DIR=str(_WANDB_HOME / "runs"))
# One XLA compilation cache for every JAX process of the session, kept between sessions (JAX keys an entry by
# the program, compile options, XLA flags and versions: a hit is what a compile would give). RU_TEST_XLA_CACHE
# names another folder (an empty one measures a cold start); the pytest workers inherit the controller's.
os.environ["RU_TEST_XLA_CACHE"] = os.environ.get("RU_TEST_XLA_CACHE") or str(default_test_xla_cache())
Path(os.environ["RU_TEST_XLA_CACHE"]).mkdir(parents=True, exist_ok=True)
os.environ.update(xla_cache_env())
os.environ["XLA_FLAGS"] = with_fast_cpu_compile(os.environ.get("XLA_FLAGS", ""))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Drop, as the recipes do (tracking/process_hooks.py), tensorstore callbacks firing on Orbax's closed event
    loop after a failed restore: pinned on whatever test runs then. Anything else still reaches pytest's hook."""
    sys.unraisablehook = quiet_closed_loop_callbacks(sys.unraisablehook)


# A test using one of these fixtures (or marked shared_data) is marked integration at collection: they run
# recipes, read the real shared corpus, or start other processes. Other integration tests carry the mark
# themselves (tests/README.md); recipe_runner's guard fails a recipe run in a test without it.
INTEGRATION_FIXTURES = frozenset({"fixture_stages", "fixture_pretrained", "data_root", "straight_run", "shared_data",
                                  "eight_devices", "storage_servers", "bucket", "any_root"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("shared_data") or INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # slow modules first: workers end together


@pytest.fixture(autouse=True)
def _recipes_only_in_integration_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """tests/recipe_runner.py refuses to run a recipe in a test not marked integration."""
    recipe_runner.INTEGRATION_TEST = request.node.get_closest_marker("integration") is not None
    yield
    recipe_runner.INTEGRATION_TEST = True


def pytest_runtest_setup(item: pytest.Item) -> None:  # the markers shared_data(path) and tools(name, ...)
    for marker in item.iter_markers("shared_data"):
        for path in marker.args:
            needs_shared(Path(path))
    for marker in item.iter_markers("tools"):
        needs_tools(*marker.args)


def skip_unless_required(message: str, switch: str = "RU_REQUIRE_SHARED_DATA",
                         required: bool | None = None) -> NoReturn:
    """Skip, or fail where ``switch`` says this must be here: RU_REQUIRE_SHARED_DATA=1 (CI: the shared data, the
    commands .ci/run installs, the storage servers); RU_REQUIRE_EXTRAS=a,b (an extra's venv: its imports)."""
    if os.environ.get(switch) == "1" if required is None else required:
        pytest.fail(f"{message}; {switch}={os.environ.get(switch)} makes this a failure", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def shared_data_dir() -> Path:
    return Path(os.environ["RU_SHARED_DATA"])


def needs_shared(path: Path) -> None:  # skips the calling test (or module) when ``path`` is missing
    if not path.exists():
        skip_unless_required(f"shared data not found: {path} is missing (set RU_SHARED_DATA to the shared/data folder)")


def needs_tools(*tools: str) -> None:  # skips the calling test when a command it runs is not on PATH
    if missing := [tool for tool in tools if shutil.which(tool) is None]:
        skip_unless_required(f"not installed: {', '.join(missing)} (the Debian source needs a Debian-like system)")


@pytest.fixture
def shared_data() -> Path:  # the real Russian data folder (skips when absent)
    needs_shared(shared_data_dir() / "text" / "ruslit")
    return shared_data_dir()


def missing_extra(extra: str, what: str) -> NoReturn:
    """Skip for a missing optional extra; a failure in that extra's venv (RU_REQUIRE_EXTRAS names it)."""
    skip_unless_required(f"{what}: the '{extra}' extra is missing (pip install -e '.[{extra}]')", "RU_REQUIRE_EXTRAS",
                         extra in os.environ.get("RU_REQUIRE_EXTRAS", "").split(","))


def optional_import(module: str, extra: str) -> ModuleType | None:
    """``module`` of an optional extra, or None where it is missing (a failure in that extra's venv)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if extra in os.environ.get("RU_REQUIRE_EXTRAS", "").split(","):
            missing_extra(extra, f"{module} does not import ({exc})")
        return None


def import_extra(module: str, extra: str) -> ModuleType:  # pytest.importorskip, failing in the extra's venv
    return optional_import(module, extra) or missing_extra(extra, f"{module} does not import")


@pytest.fixture(autouse=True)
def restore_wandb_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tracking.wandb_run.open_run`` points WANDB_* at a run folder; put them back after each test."""
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR",
                "WANDB_MODE"):  # set to what it is (or deleted), so that monkeypatch puts it back after the test
        monkeypatch.setenv(var, os.environ[var]) if var in os.environ else monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="session")
def fixture_stages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Recipes 01-03 of the tiny experiment on tests/fixtures/corpus (no shared data), made once."""
    return prepare_stages(tmp_path_factory.mktemp("fixture-stages"))


@pytest.fixture(scope="session")
def fixture_pretrained(fixture_stages: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Recipe 04 on ``fixture_stages`` (fixture_run.PRETRAINED_TRAIN), made once: read it or copy it; its config."""
    return pretrain_fixture_run(fixture_stages, tmp_path_factory.mktemp("fixture-pretrained"))


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Recipes 01-03 of the tiny experiment on the shared data (tests/test_train_resume.TRAIN), made once."""
    from tests.test_train_resume import TRAIN

    needs_shared(shared_data_dir() / "text" / "ruslit")
    root = tmp_path_factory.mktemp("resume-data")
    config = tiny_config(root, train=TRAIN)
    for script in ("01_build_corpus.py", "02_train_tokenizer.py", "03_shard.py"):
        run_recipe(script, config)
    return root


@pytest.fixture(scope="session")
def straight_run(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted recipe-04 run of ``data_root``'s experiment, made once (read or copied); its config. Compiled
    on its own, as a restart that recompiles is, here (runs compared with it get as many devices)."""
    from tests.test_train_resume import experiment_copy

    config = experiment_copy(data_root, tmp_path_factory.mktemp("straight"), "straight")
    run_recipe("04_pretrain.py", config, shared_xla_cache=False)
    return config


@pytest.fixture(scope="session")
def eight_devices() -> Iterator[DeviceWorker]:
    """The session's subprocess with 8 fake CPU devices: ``eight_devices.run(check, *args)``."""
    with DeviceWorker(8) as worker:
        yield worker


@pytest.fixture(scope="session")
def storage_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """fake-gcs-server and moto on loopback for this worker (tests/storage_servers.py), their endpoints and test
    credentials in the session's environment."""
    from tests.storage_servers import ServersMissing, StorageServers

    try:
        servers = StorageServers(tmp_path_factory.mktemp("storage-servers"))
    except ServersMissing as exc:
        skip_unless_required(str(exc))
    with pytest.MonkeyPatch.context() as patch:
        for var, value in servers.env.items():
            patch.setenv(var, value)
        try:
            yield servers
        finally:
            servers.close()


@pytest.fixture(params=["gs", "s3"])
def bucket(request: pytest.FixtureRequest, storage_servers: object) -> object:
    """A fresh empty bucket on each of the two servers, as a ``BucketPath``."""
    return location(storage_servers.new_bucket(request.param))  # type: ignore[attr-defined]


@pytest.fixture(params=["local", "gs", "s3"])
def any_root(request: pytest.FixtureRequest, tmp_path: Path) -> object:
    """A fresh folder on each backend: a local temporary folder, a GCS bucket, an S3 bucket."""
    if request.param == "local":
        return tmp_path / "root"
    return location(request.getfixturevalue("storage_servers").new_bucket(request.param))
