"""Run recipes as a user would: in this process (the recipe's ``main(argv)``), or in a subprocess where a test
needs a process of its own (to kill or signal it, another device count); the tests' XLA settings."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from cost.target import read_train_log  # noqa: F401 (the tests' reader of a run's finished log lines)

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "configs" / "tiny.yaml"


def tiny_config(tmp_path: Path, **sections: dict) -> Path:  # the tiny experiment, ``sections`` replacing keys
    cfg = yaml.safe_load(TINY.read_text(encoding="utf-8"))
    cfg["experiment"]["run_root"] = str(tmp_path / "runs")
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


INTEGRATION_TEST = True  # False in a test not marked integration (tests/conftest.py): a recipe run there fails


def check_integration(script: str) -> None:
    assert INTEGRATION_TEST, f"{script}: a test that runs a recipe must be marked integration (tests/README.md)"


# LLVM without its optimisation passes: a tiny train step compiles in 2.3 s instead of 3 s (jax 0.10.2, 2 cores),
# the same programs in less tuned machine code (model.family.run_once_compile_options does the same). Not
# --xla_cpu_use_fusion_emitters=false: faster still, but a CI run with it segfaulted in a test worker.
FAST_CPU_COMPILE = "--xla_backend_optimization_level=0"


def with_fast_cpu_compile(flags: str) -> str:  # a level already given stays
    return flags if "--xla_backend_optimization_level=" in flags else f"{flags} {FAST_CPU_COMPILE}".strip()


XLA_CACHE_VARS = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
CACHE_OPTIONS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")


def session_xla_cache() -> Path:  # RU_TEST_XLA_CACHE: set by tests/conftest.py, inherited by every process
    return Path(os.environ["RU_TEST_XLA_CACHE"])


def default_test_xla_cache(max_bytes: int = 1024**3) -> Path:
    """~/.cache/ru-pretrain/xla-tests, emptied when over ``max_bytes`` (the base suite's programs take ~36 MB; JAX's
    own cap locks a file at every read)."""
    path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ru-pretrain" / "xla-tests"
    if path.is_dir() and sum(f.stat().st_size for f in path.iterdir() if f.is_file()) > max_bytes:
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


def xla_cache_env() -> dict[str, str]:  # a JAX process on the session's cache, every program cached
    return dict(zip(XLA_CACHE_VARS, (str(session_xla_cache()), "0"), strict=True))


def recipe_env(tmp_path: Path, shared_xla_cache: bool = True, devices: int | None = None) -> dict[str, str]:
    """A recipe's environment as a user's (offline, on the CPU); ``shared_xla_cache``: the session's compilation
    cache, not the run folder's; ``devices``: its CPU device count (else recipe 04 picks it from the cores)."""
    dropped = (*XLA_CACHE_VARS, "WANDB_API_KEY", "WANDB_SERVICE")  # each recipe starts its own W&B service
    env = {name: value for name, value in os.environ.items() if name not in dropped}
    env.update(JAX_PLATFORMS="cpu", WANDB_MODE="offline", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONUNBUFFERED="1", **(xla_cache_env() if shared_xla_cache else {}))
    return env if devices is None else {**env, "JAX_NUM_CPU_DEVICES": str(devices)}


def in_process_devices() -> int:  # the JAX devices of a recipe run in this process
    import jax

    return len(jax.devices())


def recipe_command(script: str, config: Path, *overrides: str) -> list[str]:
    return [sys.executable, str(REPO / "recipes" / script), "--config", str(config), *overrides]


def run_recipe(script: str, config: Path, *overrides: str, timeout: float = 600, check: bool = True,
               shared_xla_cache: bool = True, subprocess_: bool = False) -> subprocess.CompletedProcess[str]:
    """``recipes/<script>`` to its end, here unless ``subprocess_``, as a subprocess's result; without
    ``shared_xla_cache`` it compiles into its run folder's cache, as a user's run does."""
    check_integration(script)
    if subprocess_:
        result = subprocess.run(recipe_command(script, config, *overrides), cwd=REPO, capture_output=True,
                                env=recipe_env(config.parent, shared_xla_cache), text=True, timeout=timeout)
    else:
        result = run_in_process(script, ["--config", str(config), *overrides], shared_xla_cache)
    if check and result.returncode != 0:
        raise AssertionError(f"{script} exited {result.returncode}\nstdout:\n{result.stdout[-3000:]}\n"
                             f"stderr:\n{result.stderr[-5000:]}")
    return result


@cache
def recipe_module(script: str) -> ModuleType:  # loaded by path: a recipe's name starts with a digit
    spec = importlib.util.spec_from_file_location(f"recipe_{Path(script).stem}", REPO / "recipes" / script)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def run_in_process(script: str, argv: list[str], shared_xla_cache: bool = True) -> subprocess.CompletedProcess[str]:
    """``main(argv)`` here, its output captured, its exit code as the interpreter's (1 for an exception)."""
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
    """Fail a run asking for another device count (JAX has started here) or several JAX processes."""
    from experiment.config import load_config

    try:
        train = load_config(argv[1], argv[2:]).train
    except Exception:  # noqa: BLE001 (a bad config): the recipe reports it, as in a subprocess
        return
    if train.distributed or train.cpu_devices not in (0, in_process_devices()):
        raise AssertionError(f"{argv}: train.cpu_devices={train.cpu_devices} / train.distributed need a process of "
                             "their own: run_recipe(..., subprocess_=True)")


@contextlib.contextmanager
def recipe_process_state(shared_xla_cache: bool = True) -> Iterator[None]:
    """Put back what a recipe changes for its process: environment, working directory, logging, signal handlers,
    process hooks, JAX's compilation cache (without ``shared_xla_cache``: none, and JAX's in-memory caches cleared,
    so the run compiles everything into its run folder's cache, as a fresh process does)."""
    import jax
    from jax._src import compilation_cache

    from tracking import process_hooks

    environ, cwd, root = dict(os.environ), os.getcwd(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in logging.root.manager.loggerDict}
    handlers_by_signal = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    cache_options = {key: getattr(jax.config, key) for key in CACHE_OPTIONS}
    hooks_were_installed = getattr(process_hooks, "_installed", None) is not None
    jax.devices()  # started before the recipe: it keeps this process's device count, as a library user's run does
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
        for handler in set(root.handlers) - set(handlers):
            handler.close()
        root.handlers[:] = handlers
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


def replace_environ(env: dict[str, str]) -> None:
    """``os.environ`` = ``env``, touching only what differs (each putenv/unsetenv races native threads' getenv)."""
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    os.environ.update({name: value for name, value in env.items() if os.environ.get(name) != value})


def start_recipe(script: str, config: Path, output: Path, *overrides: str, env: dict[str, str] | None = None,
                 shared_xla_cache: bool = True, devices: int | None = None) -> subprocess.Popen[bytes]:
    """``recipes/<script>`` in the background, stdout and stderr to the file ``output`` (a pipe nobody reads could
    fill and stall it). ``env`` replaces ``recipe_env(config.parent, shared_xla_cache, devices)``."""
    check_integration(script)
    env = env or recipe_env(config.parent, shared_xla_cache, devices)
    with output.open("wb") as sink:
        return subprocess.Popen(recipe_command(script, config, *overrides), cwd=REPO, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)


start_pretrain = functools.partial(start_recipe, "04_pretrain.py")  # (config, output, *overrides, env=...)


def wait_until(proc: subprocess.Popen[Any], ready: Callable[[], bool], timeout: float = 400,
               output: Path | None = None, poll_s: float = 0.05) -> None:
    """Poll ``ready()``; fail, killing ``proc``, if it ends first or ``timeout`` passes (quoting its log)."""
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = output.read_text(errors="replace")[-4000:] if output is not None and output.is_file() else ""
                raise AssertionError(f"the recipe ended (exit {proc.poll()}) or its moment did not come within "
                                     f"{timeout} s:\n{tail}")
            time.sleep(poll_s)
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise


def signal_when(proc: subprocess.Popen[Any], ready: Callable[[], bool], sig: int = signal.SIGKILL, timeout: float = 400,
                output: Path | None = None, poll_s: float = 0.05, exit_timeout: float = 120) -> int:
    """``wait_until(ready)``, then send ``sig`` and wait for the exit; returns the exit code."""
    wait_until(proc, ready, timeout, output, poll_s)
    proc.send_signal(sig)
    return proc.wait(timeout=exit_timeout)


def logged_steps(run_dir: Path) -> list[int]:  # train/step of each finished line
    return [record["train/step"] for record in read_train_log(run_dir)]


def error_line(proc: subprocess.CompletedProcess[str]) -> str:  # the one-line error a recipe prints last
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""
