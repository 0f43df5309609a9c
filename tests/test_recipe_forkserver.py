"""The recipe fork server (tests/recipe_forkserver.py) against plain subprocesses: a forked child sees the JAX
configuration and devices a fresh interpreter sees under the same environment, and ends as one does (exit
codes, signals, uncaught exceptions, atexit handlers after the other threads)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.recipe_forkserver import server_environment, start_forked
from tests.recipe_runner import REPO

# a fork server per test process imports the recipes: as slow to start as a recipe run
pytestmark = pytest.mark.integration

PROBE = '''
import atexit, json, os, signal, sys, threading, time

def main(argv):
    what = argv[0]
    if what == "jax":
        import jax
        options = {name: repr(holder.value) for name, holder in sorted(jax.config._value_holders.items())}
        print(json.dumps({"options": options, "devices": len(jax.devices()),
                          "sum": float(jax.numpy.arange(10.0).sum()), "cwd": os.getcwd(), "argv": sys.argv[1:],
                          "env": os.environ.get("PROBE_VALUE")}))
    elif what == "exit":
        sys.exit(int(argv[1]))
    elif what == "message":
        sys.exit("a message as the exit code")
    elif what == "raise":
        raise ValueError("uncaught")
    elif what == "atexit":
        marks = argv[1]
        def late_thread():
            time.sleep(0.3)
            with open(marks, "a") as f:
                f.write("thread ")
        threading.Thread(target=late_thread).start()
        atexit.register(lambda: open(marks, "a").write("atexit"))
        print("stdout line"); print("stderr line", file=sys.stderr)
    elif what in ("sleep", "sigterm"):
        if what == "sigterm":
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        print("sleeping", flush=True)
        time.sleep(60)

if __name__ == "__main__":
    main(sys.argv[1:])
'''


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    path = tmp_path / "probe.py"
    path.write_text(PROBE, encoding="utf-8")
    return path


def environment(**extra: str) -> dict[str, str]:
    return {**server_environment(), "JAX_PLATFORMS": "cpu", **extra}


def run_both(probe: Path, tmp_path: Path, argv: list[str], env: dict[str, str],
             sig: int | None = None) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of the probe as a fresh interpreter and forked; with ``sig``, signalled
    once it says it sleeps."""
    results = []
    for way in ("subprocess", "forked"):
        out, err = tmp_path / f"{way}.out", tmp_path / f"{way}.err"
        if way == "subprocess":
            with out.open("wb") as stdout, err.open("wb") as stderr:
                proc = subprocess.Popen([sys.executable, str(probe), *argv], cwd=REPO, env=env, stdout=stdout,
                                        stderr=stderr)
        else:
            proc = start_forked(probe, argv, env, out, err)  # type: ignore[assignment]
        if sig is not None:
            deadline = time.monotonic() + 60
            while "sleeping" not in out.read_text():
                assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
                time.sleep(0.01)
            proc.send_signal(sig)
        code = proc.wait(timeout=120)
        results.append((code, out.read_text(), err.read_text()))
    return results


@pytest.mark.parametrize(("variables", "devices"), [
    ({}, 1),
    ({"JAX_NUM_CPU_DEVICES": "3", "JAX_ENABLE_X64": "true", "JAX_DEFAULT_PRNG_IMPL": "rbg",
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_COMPILATION_CACHE_DIR": "{tmp}/cache"}, 3),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_DISABLE_JIT": "1"}, 4),
], ids=["defaults", "options", "xla-flags"])
def test_a_forked_child_sees_the_jax_configuration_of_a_fresh_interpreter(probe: Path, tmp_path: Path,
                                                                        variables: dict[str, str], devices: int) -> None:
    env = environment(PROBE_VALUE="seen", **{k: v.format(tmp=tmp_path) for k, v in variables.items()})
    (fresh, fresh_out, fresh_err), (forked, forked_out, forked_err) = run_both(probe, tmp_path, ["jax", "x"], env)
    assert fresh == forked == 0, (fresh_err[-2000:], forked_err[-2000:])
    want, got = json.loads(fresh_out), json.loads(forked_out)
    differing = {name: (value, got["options"].get(name)) for name, value in want["options"].items()
                 if got["options"].get(name) != value}
    assert not differing
    assert got == want
    assert got["devices"] == devices
    assert (got["env"], got["argv"], got["cwd"]) == ("seen", ["jax", "x"], str(REPO))


@pytest.mark.parametrize(("argv", "sig", "code", "stderr_has"), [
    (["exit", "0"], None, 0, ""),
    (["exit", "3"], None, 3, ""),
    (["message"], None, 1, "a message as the exit code"),
    (["raise"], None, 1, "ValueError: uncaught"),
    (["sleep"], signal.SIGKILL, -signal.SIGKILL, ""),
    (["sleep"], signal.SIGTERM, -signal.SIGTERM, ""),
    (["sigterm"], signal.SIGTERM, 143, ""),
], ids=["exit-0", "exit-3", "message", "raise", "sigkill", "sigterm-default", "sigterm-handled"])
def test_a_forked_child_ends_as_a_fresh_interpreter_does(probe: Path, tmp_path: Path, argv: list[str],
                                                         sig: int | None, code: int, stderr_has: str) -> None:
    (fresh, _, fresh_err), (forked, _, forked_err) = run_both(probe, tmp_path, argv, environment(), sig)
    assert fresh == forked == code, (fresh_err[-2000:], forked_err[-2000:])
    assert stderr_has in fresh_err and stderr_has in forked_err


def test_a_forked_child_joins_its_threads_then_runs_atexit_and_flushes(probe: Path, tmp_path: Path) -> None:
    results = []
    for way in ("subprocess", "forked"):
        marks = tmp_path / f"{way}.marks"
        marks.write_text("", encoding="utf-8")
        argv = ["atexit", str(marks)]
        out, err = tmp_path / f"{way}.out", tmp_path / f"{way}.err"
        if way == "subprocess":
            proc = subprocess.run([sys.executable, str(probe), *argv], env=environment(), capture_output=True,
                                  text=True, timeout=120)
            results.append((proc.returncode, proc.stdout, proc.stderr, marks.read_text(encoding="utf-8")))
        else:
            code = start_forked(probe, argv, environment(), out, err).wait(timeout=120)
            results.append((code, out.read_text(), err.read_text(), marks.read_text(encoding="utf-8")))
    assert results[0] == results[1] == (0, "stdout line\n", "stderr line\n", "thread atexit")
