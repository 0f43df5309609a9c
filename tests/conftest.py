"""Test environment: offline hubs, offline W&B inside a temp folder, JAX on the CPU.

Tests skip, with a reason, when the shared data or an optional extra is missing. CI must not turn
green that way: under ``RU_REQUIRE_SHARED_DATA=1`` (set by ``.ci/run``) a test that would skip for
missing shared data, or for a missing command it runs (dpkg, groff, apt-get), fails with a line naming
what is missing, and under ``RU_REQUIRE_EXTRAS=a,b``
(set by the Makefile's ``test-extra-*`` targets to the extras that venv installed) a test that would
skip because one of those extras does not import fails instead.
"""

from __future__ import annotations

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

from tests import module_order
from tests.device_worker import DeviceWorker
from tests.recipe_runner import default_test_xla_cache, xla_cache_env
from tests.xla_flags import with_fast_cpu_compile
from tracking.process_hooks import quiet_closed_loop_callbacks

REPO_ROOT = Path(__file__).resolve().parents[1]
_WANDB_HOME = Path(tempfile.mkdtemp(prefix="wandb-tests-"))

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ.pop("WANDB_API_KEY", None)
# wandb records the installed packages' names and versions with every run it opens (its x_save_requirements),
# reading each distribution's metadata: ~0.1 s of CPU per run, ~20 s over the suite's runs; no test reads it
os.environ["WANDB__SAVE_REQUIREMENTS"] = "false"
for _var, _sub in (("WANDB_DIR", "runs"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                   ("WANDB_DATA_DIR", "data")):
    os.environ[_var] = str(_WANDB_HOME / _sub)
os.environ.setdefault("RU_SHARED_DATA", str((REPO_ROOT.parent / "shared" / "data").resolve()))
# One XLA compilation cache for the tests: they build the same tiny programs again and again (in tests,
# recipe runs, the pytest workers, the 8-device workers and subprocesses), and a cache hit skips the
# compile. It outlives the session, in the user's cache folder, so the next run of the suite compiles only
# what changed (JAX keys each entry by the program, the compile options, the XLA flags and jax/jaxlib's
# versions: a hit is the program a compile would give; an entry JAX cannot read is compiled again, with a
# warning). Emptied by a session that finds it over TEST_XLA_CACHE_MAX_BYTES. RU_TEST_XLA_CACHE names
# another folder (an empty one measures a cold start); the pytest workers inherit the controller's.
_SESSION_XLA_CACHE = "RU_TEST_XLA_CACHE"
if not os.environ.get(_SESSION_XLA_CACHE):
    os.environ[_SESSION_XLA_CACHE] = str(default_test_xla_cache())
Path(os.environ[_SESSION_XLA_CACHE]).mkdir(parents=True, exist_ok=True)
os.environ.update(xla_cache_env())
os.environ["XLA_FLAGS"] = with_fast_cpu_compile(os.environ.get("XLA_FLAGS", ""))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): a worker per core, at most 4. Each worker builds the session fixtures
    it needs (a recipe chain, an 8-device worker) once for itself: more workers would mostly build them again."""
    return max(1, min(len(os.sched_getaffinity(0)), 4))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Wrap pytest's unraisable hook (installed by its own configure, before this one) in the recipes' filter for
    tensorstore callbacks on Orbax's closed event loop: a restore that fails on a damaged step leaves them to fire
    later, in whatever test runs then, as an ``Event loop is closed`` warning pinned on that test. The recipes drop
    exactly these (tracking/process_hooks.py); anything else still reaches pytest. pytest puts back the hook it
    found at the session's end, which removes this one too."""
    sys.unraisablehook = quiet_closed_loop_callbacks(sys.unraisablehook)


_RECORDED_DURATIONS = pytest.StashKey[dict[str, float]]()
_WORKER_DURATIONS = "recorded_test_durations"  # the controller's record, in each worker's workerinput
_measured_durations: dict[str, float] = {}


def recorded_durations(config: pytest.Config) -> dict[str, float]:
    """The earlier sessions' test times (tests/module_order.py): read once by the controlling process,
    handed to the workers, so that all of them order the collection alike."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return workerinput.get(_WORKER_DURATIONS, {})
    if _RECORDED_DURATIONS not in config.stash:
        config.stash[_RECORDED_DURATIONS] = module_order.read_durations(module_order.durations_file())
    return config.stash[_RECORDED_DURATIONS]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """(xdist, in the controller) each worker gets the durations the controller read."""
    node.workerinput[_WORKER_DURATIONS] = recorded_durations(node.config)  # type: ignore[attr-defined]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The controller sums each test's setup, call and teardown (xdist relays the workers' reports to it)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        _measured_durations[report.nodeid] = _measured_durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the offline W&B home: hundreds of offline runs would otherwise pile up in /tmp across CI runs;
    the controller records this session's test times for the next one's order."""
    shutil.rmtree(_WANDB_HOME, ignore_errors=True)
    if "PYTEST_XDIST_WORKER" not in os.environ:
        module_order.write_durations(module_order.durations_file(), _measured_durations)


def shared_data_dir() -> Path:
    return Path(os.environ["RU_SHARED_DATA"])


def needs_shared(path: Path) -> None:
    """Skip the calling test when ``path`` (in the shared data) is missing; fail under RU_REQUIRE_SHARED_DATA=1."""
    if path.exists():
        return
    message = f"shared data not found: {path} is missing (set RU_SHARED_DATA to the shared/data folder)"
    if os.environ.get("RU_REQUIRE_SHARED_DATA") == "1":
        pytest.fail(f"{message}; RU_REQUIRE_SHARED_DATA=1 makes this a failure", pytrace=False)
    pytest.skip(message, allow_module_level=True)


# Fixtures that run recipes (directly or through another fixture): a test using any of them is integration.
RECIPE_FIXTURES = frozenset({"fixture_stages", "fixture_pretrained", "data_root", "straight_run"})
# Fixtures whose users train on the real shared corpus (a tokenizer on the novels: tens of seconds), also
# integration, as is every test marked shared_data: the unit loop needs no shared data
REAL_DATA_FIXTURES = frozenset({"shared_data"})
# Names whose use in a test, or in a function of its module that it calls, means that it runs a recipe.
RECIPE_CALLS = frozenset({"run_recipe", "run_recipe_on_full_disk", "run_in_process", "start_recipe", "start_pretrain",
                          "prepare_stages"})
# Fixtures and names that start other processes (the 8-device worker, a training subprocess, two JAX processes,
# a fresh interpreter, the wandb CLI that reads an offline run back, the storage API servers): integration too, the unit loop runs in
# its own process on one device
PROCESS_FIXTURES = frozenset({"eight_devices", "storage_servers", "bucket", "any_root"})
PROCESS_CALLS = frozenset({"subprocess", "Popen", "DeviceWorker", "read_offline_run", "read_offline_runs"})


def runs_a_recipe(function: object, namespace: dict[str, object], seen: set[int] | None = None) -> bool:
    """Whether ``function``'s code, or that of a module-level function it names (followed transitively),
    names one of RECIPE_CALLS or PROCESS_CALLS."""
    seen = set() if seen is None else seen
    code = getattr(function, "__code__", None)
    if code is None or id(code) in seen:
        return False
    seen.add(id(code))
    stack = [code]
    while stack:
        current = stack.pop()
        names = set(current.co_names)
        if names & (RECIPE_CALLS | PROCESS_CALLS):
            return True
        stack += [const for const in current.co_consts if hasattr(const, "co_names")]
        for name in names:
            helper = namespace.get(name)
            if callable(helper) and getattr(helper, "__module__", None) == namespace.get("__name__") \
                    and runs_a_recipe(helper, namespace, seen):
                return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``integration`` every test that runs a recipe or uses a fixture that does (RECIPE_FIXTURES, and
    every fixture depending on them), the real shared data (REAL_DATA_FIXTURES, the shared_data marker) or other processes
    (PROCESS_FIXTURES, PROCESS_CALLS), so that ``-m "not integration"`` is the fast unit loop. The
    ``recipe_runner`` guard below fails a test that runs a recipe without the marker, so the loop stays fast."""
    for item in items:
        if item.get_closest_marker("integration"):
            continue
        if item.get_closest_marker("shared_data"):
            item.add_marker(pytest.mark.integration)
            continue
        function = getattr(item, "function", None)
        fixtures = set(getattr(item, "fixturenames", ()))
        module = getattr(function, "__globals__", {})
        if fixtures & (RECIPE_FIXTURES | REAL_DATA_FIXTURES | PROCESS_FIXTURES) or (function is not None and runs_a_recipe(function, module)):
            item.add_marker(pytest.mark.integration)
    items[:] = module_order.longest_modules_first(items, recorded_durations(config))


@pytest.fixture(autouse=True)
def _recipes_only_in_integration_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tell tests/recipe_runner.py whether this test is marked integration: it refuses to run a recipe in one
    that is not (the marking hook above missed a way of running one: add it to RECIPE_CALLS)."""
    from tests import recipe_runner

    recipe_runner.INTEGRATION_TEST = request.node.get_closest_marker("integration") is not None
    yield
    recipe_runner.INTEGRATION_TEST = True


def needs_tools(*tools: str) -> None:
    """Skip the calling test when a command it runs is not on PATH; fail under RU_REQUIRE_SHARED_DATA=1, CI's
    switch for "everything the suite needs from this machine" (.ci/run installs dpkg and groff first)."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if not missing:
        return
    message = f"not installed: {', '.join(missing)} (the Debian corpus source needs a Debian-like system)"
    if os.environ.get("RU_REQUIRE_SHARED_DATA") == "1":
        pytest.fail(f"{message}; RU_REQUIRE_SHARED_DATA=1 makes this a failure", pytrace=False)
    pytest.skip(message)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.shared_data(path)``: the test needs that path of the shared data (see needs_shared);
    ``@pytest.mark.tools(name, ...)``: it runs those commands (see needs_tools)."""
    for marker in item.iter_markers("shared_data"):
        for path in marker.args:
            needs_shared(Path(path))
    for marker in item.iter_markers("tools"):
        needs_tools(*marker.args)


@pytest.fixture
def shared_data() -> Path:
    """The real Russian data folder; tests that need it skip with a reason when it is absent."""
    path = shared_data_dir()
    needs_shared(path / "text" / "ruslit")
    return path


def missing_extra(extra: str, what: str) -> NoReturn:
    """Skip for a missing optional extra, or fail where RU_REQUIRE_EXTRAS says this venv installed it."""
    message = f"{what}: the '{extra}' extra is missing (pip install -e '.[{extra}]')"
    required = os.environ.get("RU_REQUIRE_EXTRAS", "")
    if extra in required.split(","):
        pytest.fail(f"{message}, but RU_REQUIRE_EXTRAS={required} says this venv has it", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def optional_import(module: str, extra: str) -> ModuleType | None:
    """``module`` of an optional extra, or None where it is missing (a failure where it is required)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if extra in os.environ.get("RU_REQUIRE_EXTRAS", "").split(","):
            missing_extra(extra, f"{module} does not import ({exc})")
        return None


def import_extra(module: str, extra: str) -> ModuleType:
    """``pytest.importorskip`` for a module of an optional extra, a failure where the extra is required."""
    imported = optional_import(module, extra)
    if imported is None:
        missing_extra(extra, f"{module} does not import")
    return imported


@pytest.fixture(autouse=True)
def restore_wandb_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tracking.wandb_run.open_run`` points WANDB_* at a run folder; put them back after each test."""
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR", "WANDB_MODE"):
        if var in os.environ:
            monkeypatch.setenv(var, os.environ[var])
        else:
            monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="session")
def fixture_stages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Recipes 01-03 of the tiny experiment on tests/fixtures/corpus (no shared data), made once."""
    from tests.fixture_run import prepare_stages

    return prepare_stages(tmp_path_factory.mktemp("fixture-stages"))


@pytest.fixture(scope="session")
def fixture_pretrained(fixture_stages: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Recipe 04 on ``fixture_stages`` (tests.fixture_run.PRETRAINED_TRAIN: 6 steps, checkpoints 3 and 6, W&B
    offline), made once; its users only read it or copy it (``pretrained_copy``). Returns its config."""
    from tests.fixture_run import pretrain_fixture_run

    return pretrain_fixture_run(fixture_stages, tmp_path_factory.mktemp("fixture-pretrained"))


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Corpus, tokenizer and shards of the tiny experiment on the shared data (recipes 01-03, train section
    of tests/test_train_resume.py), made once for the tests that resume, damage or fill its runs."""
    from tests.recipe_runner import run_recipe, tiny_config
    from tests.test_train_resume import TRAIN

    needs_shared(shared_data_dir() / "text" / "ruslit")
    root = tmp_path_factory.mktemp("resume-data")
    config = tiny_config(root, train=TRAIN)
    for script in ("01_build_corpus.py", "02_train_tokenizer.py", "03_shard.py"):
        run_recipe(script, config)
    return root


@pytest.fixture(scope="session")
def straight_run(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted recipe-04 run of ``data_root``'s experiment, made once (its users only read or copy it);
    returns its config."""
    from tests.recipe_runner import run_recipe
    from tests.test_train_resume import experiment_copy

    config = experiment_copy(data_root, tmp_path_factory.mktemp("straight"), "straight")
    # compiled on its own (into its run folder's cache, not from or into the session's): the resumed runs
    # compared with it bit for bit then run programs compiled separately, as a restart that recompiles does.
    # In this process, so on this process's devices: runs compared with it in a subprocess are started with
    # as many (recipe_runner.in_process_devices)
    run_recipe("04_pretrain.py", config, shared_xla_cache=False)
    return config


@pytest.fixture(scope="session")
def eight_devices() -> Iterator[DeviceWorker]:
    """The session's one subprocess with 8 fake CPU devices: ``eight_devices.run(check, *args)`` (tests/device_worker.py)."""
    with DeviceWorker(8) as worker:
        yield worker


@pytest.fixture(scope="session")
def storage_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """fake-gcs-server and moto on loopback for this worker (tests/storage_servers.py), their endpoints and test
    credentials in the environment for the session (recipes and the processes they start inherit them)."""
    from tests.storage_servers import ServersMissing, StorageServers

    try:
        servers = StorageServers(tmp_path_factory.mktemp("storage-servers"))
    except ServersMissing as exc:
        if os.environ.get("RU_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(f"{exc}; RU_REQUIRE_SHARED_DATA=1 makes this a failure", pytrace=False)
        pytest.skip(str(exc))
    saved = {var: os.environ.get(var) for var in servers.env}
    os.environ.update(servers.env)
    try:
        yield servers
    finally:
        servers.close()
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@pytest.fixture(params=["gs", "s3"])
def bucket(request: pytest.FixtureRequest, storage_servers: object) -> object:
    """A fresh empty bucket on each of the two servers, as a ``BucketPath``."""
    from experiment.storage import location

    return location(storage_servers.new_bucket(request.param))  # type: ignore[attr-defined]


@pytest.fixture(params=["local", "gs", "s3"])
def any_root(request: pytest.FixtureRequest, tmp_path: Path) -> object:
    """A fresh folder on each backend: a local temporary folder, a GCS bucket, an S3 bucket."""
    if request.param == "local":
        return tmp_path / "root"
    from experiment.storage import location

    servers = request.getfixturevalue("storage_servers")
    return location(servers.new_bucket(request.param))
