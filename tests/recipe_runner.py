"""Run recipes as a user would, in a temporary run root: in this process (``main(argv)`` of the recipe,
the default: no interpreter start-up and imports to pay per run), or in a subprocess where the test needs
a process of its own (it kills or signals it, runs several at once, or compares programs compiled apart).

Also the tests' one way to start a recipe in the background, signal it at a moment, and read its train log.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from experiment import appendlog
from experiment.storage import BucketPath
from tests.recipe_forkserver import fork_enabled, start_forked

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "configs" / "tiny.yaml"
TRAIN_LOG = "train_log.jsonl"


def tiny_config(tmp_path: Path, **sections: dict) -> Path:
    """Write the tiny experiment with its run root in ``tmp_path``; ``sections`` replace keys."""
    cfg = yaml.safe_load(TINY.read_text(encoding="utf-8"))
    cfg["experiment"]["run_root"] = str(tmp_path / "runs")
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


# False while a test not marked integration runs (tests/conftest.py): running a recipe there fails, so the
# unit loop (-m "not integration") cannot quietly grow a recipe run
INTEGRATION_TEST = True


def check_integration(script: str) -> None:
    assert INTEGRATION_TEST, (f"{script}: a test that runs a recipe must be marked integration (tests/conftest.py "
                              "marks those using RECIPE_FIXTURES or naming RECIPE_CALLS)")


XLA_CACHE_VARS = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
# The base suite's programs take about 36 MB of cache; as the code changes, entries nobody asks for again
# pile up, so a session that finds more than this empties the folder first. (Not JAX's own cap,
# jax_compilation_cache_max_size: it takes a file lock at every read and write and rescans the whole
# folder at every write.)
TEST_XLA_CACHE_MAX_BYTES = 1024**3


SESSION_XLA_CACHE_VAR = "RU_TEST_XLA_CACHE"  # set by tests/conftest.py for the session, its workers included


@cache
def session_xla_cache() -> Path:
    """The test session's one XLA compilation cache (tests/conftest.py: the pytest workers, their device
    workers and every JAX subprocess they start); outside pytest, a folder of this process removed at exit."""
    if os.environ.get(SESSION_XLA_CACHE_VAR):
        return Path(os.environ[SESSION_XLA_CACHE_VAR])
    path = Path(tempfile.mkdtemp(prefix="xla-cache-tests-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def suite_cache_home() -> Path:
    """Where the test suite keeps what outlives a session (its compilation cache, the tests' times)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ru-pretrain"


def default_test_xla_cache(max_bytes: int = TEST_XLA_CACHE_MAX_BYTES) -> Path:
    """The tests' compilation cache when RU_TEST_XLA_CACHE names none: in the user's cache folder, emptied
    when it holds more than ``max_bytes``; where that folder cannot be written (a read-only home), a
    folder of this session, removed at exit."""
    path = suite_cache_home() / "xla-tests"
    try:
        if path.is_dir() and sum(f.stat().st_size for f in path.iterdir() if f.is_file()) > max_bytes:
            shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".writable-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        return session_xla_cache()  # RU_TEST_XLA_CACHE is not set yet: a folder of this process
    return path


def xla_cache_env() -> dict[str, str]:
    """The environment that points a JAX process at the session's compilation cache, every program cached."""
    return dict(zip(XLA_CACHE_VARS, (str(session_xla_cache()), "0"), strict=True))


def recipe_env(tmp_path: Path, shared_xla_cache: bool = True, devices: int | None = None) -> dict[str, str]:
    """A recipe's environment as a user's (offline hubs and W&B, JAX on the CPU). With ``shared_xla_cache`` its
    compiled programs go to one cache of the session instead of its run folder's xla_cache (recipe 04's
    default): the tests run the same tiny programs again and again, and a hit skips the compile, about half
    of a tiny run's time; min time 0 since the tiny programs each compile in well under a second.
    ``devices`` fixes its JAX CPU device count (``in_process_devices()``: that of a run in this process,
    for results compared bit for bit with one); otherwise recipe 04 picks it from the cores, as for a user."""
    env = dict(os.environ)
    env.update({"JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    for var in XLA_CACHE_VARS:
        env.pop(var, None)
    if shared_xla_cache:
        env.update(xla_cache_env())
    if devices is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(devices)
    env.pop("WANDB_API_KEY", None)
    # a W&B service started by an earlier in-process test would be shared through this variable and
    # would still hold the id of a run the test killed: each recipe starts its own service, as for a user
    env.pop("WANDB_SERVICE", None)
    return env


def in_process_devices() -> int:
    """The JAX devices of a recipe run in this process (those of the test process: JAX has started)."""
    import jax

    return len(jax.devices())


def recipe_command(script: str, config: Path, *overrides: str) -> list[str]:
    return [sys.executable, str(REPO / "recipes" / script), "--config", str(config), *overrides]


def run_recipe(script: str, config: Path, *overrides: str, timeout: float = 600, check: bool = True,
               shared_xla_cache: bool = True, subprocess_: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``recipes/<script>`` to its end; its exit code, stdout and stderr as a subprocess's.

    In this process (``run_in_process``) unless ``subprocess_``: the run needs a process of its own (a
    device count of its own, a fresh interpreter's start-up). Without ``shared_xla_cache`` the run
    compiles on its own into its run folder's xla_cache, as a user's run does. ``timeout`` bounds a
    subprocess only.
    """
    check_integration(script)
    if subprocess_:
        proc = run_in_own_process(script, config, overrides, recipe_env(config.parent, shared_xla_cache), timeout)
    else:
        proc = run_in_process(script, ["--config", str(config), *overrides], shared_xla_cache)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-5000:]}")
    return proc


def run_in_own_process(script: str, config: Path, overrides: tuple[str, ...], env: dict[str, str],
                       timeout: float) -> subprocess.CompletedProcess[str]:
    """The recipe in a process of its own (``start_process``), waited for; its exit code and output as
    ``subprocess.run``'s."""
    command = recipe_command(script, config, *overrides)
    with tempfile.TemporaryDirectory(prefix="recipe-output-") as folder:
        stdout, stderr = Path(folder) / "stdout", Path(folder) / "stderr"
        proc = start_process(command, env, stdout, stderr)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(command, proc.wait(), stdout.read_text(errors="replace"),
                                           stderr.read_text(errors="replace"))


def start_process(command: list[str], env: dict[str, str], stdout: Path,
                  stderr: Path | None = None) -> subprocess.Popen[bytes]:
    """``command`` (``recipe_command``'s) started with its output in files (``stderr`` None: both in
    ``stdout``): forked from tests/recipe_forkserver.py's server, or, with that switched off, a fresh
    interpreter. Either has the part of ``Popen``'s interface the tests use."""
    if fork_enabled():
        return start_forked(Path(command[1]), command[2:], env, stdout, stderr)  # type: ignore[return-value]
    with stdout.open("wb") as out:
        if stderr is None:
            return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        with stderr.open("wb") as err:
            return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err)


@cache
def recipe_module(script: str) -> ModuleType:
    """``recipes/<script>`` imported once (its name starts with a digit: loaded by path, not ``import``)."""
    path = REPO / "recipes" / script
    spec = importlib.util.spec_from_file_location(f"recipe_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_in_process(script: str, argv: list[str], shared_xla_cache: bool = True) -> subprocess.CompletedProcess[str]:
    """``main(argv)`` of the recipe here, with what a subprocess would print captured and its exit code
    (``SystemExit``'s, 1 with the traceback on stderr for an uncaught exception, as the interpreter does)."""
    main: Callable[[list[str]], None] = recipe_module(script).main
    needs_own_process(argv)
    out, err = io.StringIO(), io.StringIO()
    with recipe_process_state(shared_xla_cache), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        except Exception:
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess([script, *argv], code, out.getvalue(), err.getvalue())


def needs_own_process(argv: list[str]) -> None:
    """Fail a run that cannot be made here: one asking for a device count other than this process's (JAX
    has started: recipe 04 would silently keep its devices) or joining other JAX processes."""
    import jax

    from experiment.config import load_config

    try:
        cfg = load_config(argv[1], argv[2:])
    except Exception:  # noqa: BLE001 (a bad config, a plugin not loaded yet): the recipe reports it, as in a subprocess
        return
    train = getattr(cfg, "train", None)
    devices = getattr(train, "cpu_devices", 0)
    if getattr(train, "distributed", False) or devices not in (0, len(jax.devices())):
        raise AssertionError(f"{argv}: train.cpu_devices={devices} / train.distributed need a process of their "
                             "own: run_recipe(..., subprocess_=True)")


@contextlib.contextmanager
def recipe_process_state(shared_xla_cache: bool = True) -> Iterator[None]:
    """What a recipe changes for its whole process, put back afterwards so in-process runs do not leak into
    each other or into the tests after them: the environment (W&B points WANDB_* at its run folder, and
    starts a service it names in WANDB_SERVICE), the working directory, the root logger (the harness's
    ``basicConfig(force=True)`` replaces pytest's capture handlers), the SIGTERM/SIGINT handlers, and JAX's
    compilation cache (recipe 04 points it at its run folder's xla_cache when none is set: with
    ``shared_xla_cache`` it is the session's, as for a subprocess, else unset so the recipe sets its own).
    Without ``shared_xla_cache`` JAX's in-memory caches are cleared before and after too: the run compiles
    everything, as a fresh process does (with it, a program traced by an earlier run is reused, as the
    shared persistent cache's would be)."""
    import jax
    from jax._src import compilation_cache

    environ, cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in logging.root.manager.loggerDict}
    handlers_by_signal = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    cache_options = {key: getattr(jax.config, key) for key in CACHE_OPTIONS}
    # the harness's setup_logging installs an absl log filter and an unraisable hook for the process: a
    # test process had none (pytest's own hooks go back in place when they are taken out)
    from tracking import process_hooks

    hooks_were_installed = getattr(process_hooks, "_installed", None) is not None
    # JAX's devices are made before the recipe runs: recipe 04 asks for as many CPU devices as the cores
    # allow only in a process where JAX has not started, and a test run here must not change the device
    # count of the tests after it (they keep this process's devices, as a library user's run does)
    jax.devices()
    replace_environ(recipe_env(Path(cwd)))
    os.chdir(REPO)
    if shared_xla_cache:
        jax.config.update("jax_compilation_cache_dir", str(session_xla_cache()))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    else:
        jax.config.update("jax_compilation_cache_dir", None)
        jax.clear_caches()
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        os.chdir(cwd)
        replace_environ(environ)
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
        for name, logger_level in levels.items():
            logging.getLogger(name).setLevel(logger_level)
        for sig, handler in handlers_by_signal.items():
            signal.signal(sig, handler)
        if not hooks_were_installed:
            process_hooks.uninstall_process_hooks()
        for key, value in cache_options.items():
            jax.config.update(key, value)
        compilation_cache.reset_cache()
        if not shared_xla_cache:
            jax.clear_caches()


CACHE_OPTIONS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")


def replace_environ(env: dict[str, str]) -> None:
    """Make ``os.environ`` equal ``env`` by setting and unsetting only the variables that differ: each
    ``putenv``/``unsetenv`` races any native thread reading the environment at that moment (glibc's
    ``getenv`` is not safe against a concurrent ``unsetenv``), and clearing and refilling the whole
    environment made a hundred such calls per run where a few differ."""
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def start_recipe(script: str, config: Path, output: Path, *overrides: str, env: dict[str, str] | None = None,
                 shared_xla_cache: bool = True, devices: int | None = None) -> subprocess.Popen[bytes]:
    """``recipes/<script>`` in the background, stdout and stderr to the file ``output`` (a pipe nobody
    reads could fill and stall it); read it with ``output.read_text()``. ``env`` replaces
    ``recipe_env(config.parent, shared_xla_cache, devices)``."""
    check_integration(script)
    return start_process(recipe_command(script, config, *overrides),
                         env or recipe_env(config.parent, shared_xla_cache, devices), output)


def start_pretrain(config: Path, output: Path, *overrides: str, env: dict[str, str] | None = None,
                   shared_xla_cache: bool = True, devices: int | None = None) -> subprocess.Popen[bytes]:
    """Recipe 04 in the background (``start_recipe``)."""
    return start_recipe("04_pretrain.py", config, output, *overrides, env=env, shared_xla_cache=shared_xla_cache,
                        devices=devices)


def wait_until(proc: subprocess.Popen[Any], ready: Callable[[], bool], timeout: float = 400,
               output: Path | None = None, poll_s: float = 0.05) -> None:
    """Poll ``ready()`` until it holds. Fails, killing the process, when the process ends first or
    ``timeout`` passes; ``output`` (its log file) is quoted in the failure."""
    deadline = time.monotonic() + timeout

    def tail() -> str:
        return output.read_text(errors="replace")[-4000:] if output is not None and output.is_file() else ""

    try:
        while not ready():
            if proc.poll() is not None:
                raise AssertionError(f"the recipe ended (exit {proc.returncode}) before its moment:\n{tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"its moment did not come within {timeout} s:\n{tail()}")
            time.sleep(poll_s)
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise


def signal_when(proc: subprocess.Popen[Any], ready: Callable[[], bool], sig: int = signal.SIGKILL,
                timeout: float = 400, output: Path | None = None, poll_s: float = 0.05,
                exit_timeout: float = 120) -> int:
    """``wait_until(ready)``, then send ``sig`` and wait for the exit; returns the exit code."""
    wait_until(proc, ready, timeout, output, poll_s)
    proc.send_signal(sig)
    return proc.wait(timeout=exit_timeout)


def read_train_log(run_dir: Path | BucketPath) -> list[dict[str, Any]]:
    """The lines of ``train_log.jsonl`` a run has finished writing (on a disk or in a bucket): a last line
    without its newline is being written (or was cut by a kill) and is left out; any complete line must parse."""
    path = run_dir / TRAIN_LOG
    if not appendlog.exists(path):
        return []
    text = appendlog.read_text(path)
    complete = text[:text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def logged_steps(run_dir: Path) -> list[int]:
    """``train/step`` of each finished line of the train log."""
    return [record["train/step"] for record in read_train_log(run_dir)]


NOWHERE = Path("/nonexistent-path-for-full-disk-tests")


@contextlib.contextmanager
def full_disk(fsync_full: Path = NOWHERE, usage_full: Path = NOWHERE) -> Iterator[None]:
    """This process as if a disk were full: fsync of a file under ``fsync_full`` fails with ENOSPC (where a
    full disk shows up for buffered writes), and shutil.disk_usage reports 1000 bytes free under ``usage_full``."""
    import errno

    fsync_prefix, usage_prefix = str(fsync_full.resolve()), str(usage_full.resolve())
    real_fsync, real_usage = os.fsync, shutil.disk_usage

    def fsync(fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        if os.readlink(f"/proc/self/fd/{fd}").startswith(fsync_prefix):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    def disk_usage(path: Any) -> Any:
        usage = real_usage(path)
        return usage._replace(free=1000) if os.path.abspath(path).startswith(usage_prefix) else usage

    os.fsync, shutil.disk_usage = fsync, disk_usage  # type: ignore[assignment]
    try:
        yield
    finally:
        os.fsync, shutil.disk_usage = real_fsync, real_usage  # type: ignore[assignment]


def run_recipe_on_full_disk(script: str, config: Path, *overrides: str, fsync_full: Path = NOWHERE,
                            usage_full: Path = NOWHERE) -> subprocess.CompletedProcess[str]:
    """``run_recipe`` (in this process, never checked) with a full disk (``full_disk``)."""
    with full_disk(fsync_full, usage_full):
        return run_recipe(script, config, *overrides, check=False)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one-line error a recipe prints last on stderr."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""
