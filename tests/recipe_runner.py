"""Run recipes as a user would: a subprocess per recipe, in a temporary run root."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "configs" / "tiny.yaml"


def tiny_config(tmp_path: Path, **sections: dict) -> Path:
    """Write the tiny experiment with its run root in ``tmp_path``; ``sections`` replace keys."""
    cfg = yaml.safe_load(TINY.read_text(encoding="utf-8"))
    cfg["experiment"]["run_root"] = str(tmp_path / "runs")
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


XLA_CACHE_VARS = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")


@cache
def session_xla_cache() -> Path:
    """One XLA compilation cache for every JAX subprocess this test session starts, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="xla-cache-tests-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def xla_cache_env() -> dict[str, str]:
    """The environment that points a JAX process at the session's compilation cache, every program cached."""
    return dict(zip(XLA_CACHE_VARS, (str(session_xla_cache()), "0"), strict=True))


def recipe_env(tmp_path: Path, shared_xla_cache: bool = True) -> dict[str, str]:
    """A recipe's environment as a user's (offline hubs and W&B, JAX on the CPU). With ``shared_xla_cache`` its
    compiled programs go to one cache of the session instead of its run folder's xla_cache (recipe 04's
    default): the tests run the same tiny programs again and again, and a hit skips the compile, about half
    of a tiny run's time; min time 0 since the tiny programs each compile in well under a second."""
    env = dict(os.environ)
    env.update({"JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    for var in XLA_CACHE_VARS:
        env.pop(var, None)
    if shared_xla_cache:
        env.update(xla_cache_env())
    env.pop("WANDB_API_KEY", None)
    # a W&B service started by an earlier in-process test would be shared through this variable and
    # would still hold the id of a run the test killed: each recipe starts its own service, as for a user
    env.pop("WANDB_SERVICE", None)
    return env


def run_recipe(script: str, config: Path, *overrides: str, timeout: float = 600,
               check: bool = True, shared_xla_cache: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO / "recipes" / script), "--config", str(config), *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=recipe_env(config.parent, shared_xla_cache), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-5000:]}")
    return proc


# Runs a recipe as if a disk were full: fsync of a file under FSYNC_FULL fails with ENOSPC (where a
# full disk shows up for buffered writes), and shutil.disk_usage reports 1000 bytes free under USAGE_FULL.
FULL_DISK = """
import errno, os, runpy, shutil, sys
FSYNC_FULL, USAGE_FULL = sys.argv.pop(1), sys.argv.pop(1)
real_fsync, real_usage = os.fsync, shutil.disk_usage
def fsync(fd):
    if os.readlink(f"/proc/self/fd/{fd}").startswith(FSYNC_FULL):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    real_fsync(fd)
def disk_usage(path):
    usage = real_usage(path)
    return usage._replace(free=1000) if os.path.abspath(path).startswith(USAGE_FULL) else usage
os.fsync, shutil.disk_usage = fsync, disk_usage
sys.argv[0] = sys.argv.pop(1)
runpy.run_path(sys.argv[0], run_name="__main__")
"""
NOWHERE = Path("/nonexistent-path-for-full-disk-tests")


def run_recipe_on_full_disk(script: str, config: Path, *overrides: str, fsync_full: Path = NOWHERE,
                            usage_full: Path = NOWHERE, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``run_recipe`` with writes under ``fsync_full`` failing and no free space under ``usage_full``."""
    cmd = [sys.executable, "-c", FULL_DISK, str(fsync_full.resolve()), str(usage_full.resolve()),
           str(REPO / "recipes" / script), "--config", str(config), *overrides]
    return subprocess.run(cmd, cwd=REPO, env=recipe_env(config.parent), capture_output=True, text=True,
                          timeout=timeout)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one-line error a recipe prints last on stderr."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""
