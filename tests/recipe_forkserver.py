"""Recipe processes forked from a server that has already imported what a recipe imports.

A recipe started as a fresh interpreter spends about 1.5 s of CPU importing jax, flax, orbax, grain, wandb and
our packages before any work, and the tests that need a recipe in a process of its own (killed, signalled,
several at once, on a device count of its own) start about twenty. Here a server per test process imports all
that once, without starting JAX's backends, and forks one child per run. The child is a process of its own as a
subprocess is: its own pid, killed and signalled for real, its exit code as ``subprocess.Popen`` reports it
(``-9`` for a SIGKILL), its output in a file. It takes the run's environment, working directory and argv, then
sets every JAX option from that environment, as a fresh interpreter importing jax would have (the server
imports jax with no ``JAX_*`` variable set, so each option the child's environment does not name keeps jax's
default); XLA reads ``XLA_FLAGS`` when the child starts its backend. It exits as the interpreter does: other
threads joined, atexit handlers run, output flushed.

What differs from a fresh interpreter, knowingly: the children share the server's string-hash seed, and
modules are imported before the run's environment is set (a library reading an environment variable at
import, other than jax's options, reads the server's; none of the recipes' settings is such a variable).
``RU_TEST_FORK_RECIPES=0`` starts plain subprocesses instead.

The protocol: JSON lines. The client writes ``{"id", "script", "argv", "env", "cwd", "stdout", "stderr"}`` (the
script: a path to a file whose ``main(argv)`` runs it, as every recipe's does);
the server answers ``{"id", "pid"}`` once forked and ``{"exit": pid, "code": exit code}`` once it reaped it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FORK_SWITCH = "RU_TEST_FORK_RECIPES"
# the recipes the tests start in processes of their own, imported by the server with all they import
PRELOADED_RECIPES = ("04_pretrain.py", "09_generate.py")


def fork_enabled() -> bool:
    return os.environ.get(FORK_SWITCH, "1") != "0" and hasattr(os, "fork")


# ---------------------------------------------------------------------------------------------- the server


def preload() -> None:
    """Import what the recipes run by the tests import, and what W&B imports when a run starts; JAX's
    backends stay unstarted (a child chooses its devices)."""
    import wandb.sdk.launch  # noqa: F401  (imported by wandb.init, on every run)
    from jax._src import xla_bridge

    from tests.recipe_runner import recipe_module

    for script in PRELOADED_RECIPES:
        recipe_module(script)
    assert not xla_bridge._backends, "importing the recipes started JAX's backends: a fork would inherit them"


def serve() -> None:
    """Read requests on stdin and fork a child per request; report each child's pid and its exit code."""
    preload()
    write = sys.stdout.buffer
    write.write(b'{"ready": true}\n')
    write.flush()
    pending, stdin = b"", sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.02)
        if readable:
            chunk = os.read(stdin, 1 << 16)
            if not chunk:
                return  # the client is gone: the children it started run on, as subprocesses would
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    run_child(request)  # never returns
                write.write(json.dumps({"id": request["id"], "pid": pid}).encode() + b"\n")
                write.flush()
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            write.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            write.flush()


def run_child(request: dict[str, Any]) -> None:
    """In the forked child: take the run's environment, output files, directory and argv, run the recipe's
    ``main``, and exit as the interpreter would. Never returns."""
    code = 1
    try:
        redirect_output(request["stdout"], request["stderr"])
        os.environ.clear()
        os.environ.update(request["env"])
        apply_jax_environment()
        os.chdir(request["cwd"])
        script, argv = Path(request["script"]), request["argv"]
        sys.argv = [str(script), *argv]
        code = exit_code_of(lambda: script_module(script).main(argv))
        threading._shutdown()  # type: ignore[attr-defined]  (the interpreter joins other threads before atexit)
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 (nothing may escape into the server's loop)
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def script_module(path: Path) -> Any:
    """The script at ``path`` as a module (a recipe: the one the server imported)."""
    from tests.recipe_runner import recipe_module

    if path.parent == REPO / "recipes":
        return recipe_module(path.name)
    spec = importlib.util.spec_from_file_location(f"forked_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exit_code_of(main: Any) -> int:
    """``main()``'s exit code as the interpreter gives it (SystemExit's code; 1 and the traceback for an
    uncaught exception; a message as SystemExit's code is printed and exits 1)."""
    try:
        main()
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        return 1


def redirect_output(stdout: str, stderr: str) -> None:
    """fds 1 and 2 onto the run's files (one file for both when they are the same), stdin onto /dev/null,
    and Python's streams over them unbuffered, as PYTHONUNBUFFERED makes a fresh interpreter's."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, path in ((1, stdout), (2, stderr)):
        if fd == 2 and path == stdout:
            os.dup2(1, 2)
            continue
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)


def apply_jax_environment() -> None:
    """Set each JAX option the environment names, parsed as jax parses it at import (the server imported jax
    with no ``JAX_*`` variable set: an option the environment does not name has jax's default already)."""
    import jax
    from jax._src import config as jax_config

    for name, holder in jax.config._value_holders.items():
        text = os.environ.get(name.upper())
        if text is None:
            continue
        default = holder.value
        if isinstance(default, bool):
            value: Any = jax_config.bool_env(name.upper(), default)
        elif isinstance(default, int):
            value = int(text)
        elif isinstance(default, float):
            value = float(text)
        else:
            value = text
        jax.config.update(name, value)


def server_environment() -> dict[str, str]:
    """The server's environment: this process's without the JAX options and XLA's flags (each child sets the
    run's before JAX reads them)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("JAX_") and k != "XLA_FLAGS"}


# ---------------------------------------------------------------------------------------------- the client


class ForkServer:
    """This process's server: started at the first request, stopped when this process exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pids: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self._next_id = 0
        self._server_gone = False
        self._server = subprocess.Popen([sys.executable, "-c", "from tests.recipe_forkserver import serve; serve()"],
                                        cwd=REPO, env=server_environment(), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)
        assert self._server.stdout is not None and self._server.stdin is not None
        ready = self._server.stdout.readline()
        if json.loads(ready or b"{}").get("ready") is not True:
            raise RuntimeError(f"the recipe fork server did not start (exit {self._server.wait()}): see stderr above")
        self._reader = threading.Thread(target=self._read, name="recipe-forkserver-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._server.stdout is not None
        for line in self._server.stdout:
            message = json.loads(line)
            with self._changed:
                if "pid" in message:
                    self._pids[message["id"]] = message["pid"]
                else:
                    self._exits[message["exit"]] = message["code"]
                self._changed.notify_all()
        with self._changed:
            self._server_gone = True
            self._changed.notify_all()

    def start(self, script: Path, argv: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> ForkedRecipe:
        assert self._server.stdin is not None
        with self._changed:
            self._next_id += 1
            request = {"id": self._next_id, "script": str(script), "argv": argv, "env": env, "cwd": str(REPO),
                       "stdout": str(stdout), "stderr": str(stderr)}
            self._server.stdin.write(json.dumps(request).encode() + b"\n")
            self._server.stdin.flush()
            self._wait_for(lambda: request["id"] in self._pids, 60, "fork")
            pid = self._pids.pop(request["id"])
        return ForkedRecipe([sys.executable, str(script), *argv], pid, self)

    def exit_code(self, pid: int, timeout: float | None = 0) -> int | None:
        """The child's exit code; None while it runs (after waiting up to ``timeout`` s, None: for ever)."""
        with self._changed:
            if timeout != 0:
                self._wait_for(lambda: pid in self._exits, timeout, None)
            return self._exits.get(pid)

    def _wait_for(self, ready: Any, timeout: float | None, what: str | None) -> None:
        """Under the lock: wait until ``ready()``; the server's end fails the wait."""
        if not self._changed.wait_for(lambda: ready() or self._server_gone, timeout):
            if what is not None:
                raise RuntimeError(f"the recipe fork server did not {what} within {timeout} s")
            return
        if not ready():
            raise RuntimeError(f"the recipe fork server exited ({self._server.poll()})")

    def close(self) -> None:
        if self._server.poll() is None:
            assert self._server.stdin is not None
            self._server.stdin.close()
            self._server.wait(timeout=30)


class ForkedRecipe:
    """A forked recipe run with the part of ``subprocess.Popen``'s interface the tests use."""

    def __init__(self, args: list[str], pid: int, server: ForkServer) -> None:
        self.args, self.pid, self._server = args, pid, server
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # as Popen: nothing once the exit is known (the server reaps the child at once, and its pid may be reused)
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_server: ForkServer | None = None
_server_lock = threading.Lock()


def fork_server() -> ForkServer:
    global _server
    with _server_lock:
        if _server is None:
            _server = ForkServer()
            atexit.register(_server.close)
        return _server


def start_forked(script: Path, argv: list[str], env: dict[str, str], stdout: Path,
                 stderr: Path | None = None) -> ForkedRecipe:
    """``python <script> argv`` forked from this process's server (the script's ``main(argv)``), its output to ``stdout`` (and ``stderr``;
    the same file when None); the files are created empty first, as the redirections of a shell are."""
    for path in {stdout, stderr or stdout}:
        path.write_bytes(b"")
    return fork_server().start(script, argv, env, stdout, stderr or stdout)
