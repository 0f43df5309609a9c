"""One subprocess with 8 fake CPU devices for the session (the ``eight_devices`` fixture): JAX fixes its device
count when it starts, so multi-device checks cannot run in the pytest process. A check is a module-level function
of its test module taking and returning JSON values. One that raises fails its test with the traceback; a worker
that dies or hangs fails the check it ran with its stderr's tail, and the next check starts a fresh worker."""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class CheckFailed(AssertionError):
    """A check raised in the worker, or the worker died or hung while running it."""


class DeviceWorker:
    """The parent's handle: ``run(fn, *args)`` runs ``fn(*args)`` in the worker and returns its result."""

    def __init__(self, devices: int = 8) -> None:
        self.devices = devices
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0  # how many workers this handle started (a test checks that the checks share one)
        # stderr goes to a file, not a pipe: a chatty check (XLA warnings) can never block on a full pipe
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the handle, closed in __exit__

    def _start(self) -> subprocess.Popen[bytes]:  # the session's XLA flags (tests/conftest.py), its device count
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={self.devices}"
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags.strip(),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        env.pop("JAX_NUM_CPU_DEVICES", None)  # no other test's device count
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.device_worker"], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        self.starts += 1
        return self.proc

    def _stderr_since(self, offset: int) -> str:
        self._stderr.seek(offset)
        return self._stderr.read().decode("utf-8", "replace")[-4000:]

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 600) -> Any:
        """``fn(*args)`` on the worker's devices; ``fn`` must be importable (a module-level function)."""
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        name = f"{fn.__module__}:{fn.__qualname__}"
        self._stderr.seek(0, os.SEEK_END)
        offset = self._stderr.tell()
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # it died starting up: reported below with its stderr
            proc.stdin.write((json.dumps({"fn": name, "args": list(args)}) + "\n").encode())
            proc.stdin.flush()
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self.close()
                raise CheckFailed(f"{name}: no answer from the {self.devices}-device worker in {timeout:.0f} s "
                                  f"(killed); its stderr:\n{self._stderr_since(offset)}")
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                code = proc.wait()
                self.proc = None
                raise CheckFailed(f"{name}: the {self.devices}-device worker died (exit code {code}); its stderr:\n"
                                  f"{self._stderr_since(offset)}")
            line += chunk
        answer = json.loads(line)
        if not answer["ok"]:
            raise CheckFailed(f"{name} raised in the {self.devices}-device worker:\n{answer['error']}")
        return answer["result"]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # a no-op on an ended process
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> DeviceWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._stderr.close()


def serve() -> None:
    """The worker's loop: one JSON request per stdin line, one JSON answer per line on the original stdout."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    # anything a check (or a C library under it) prints to stdout goes to stderr, not into the answers
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import jax  # started here, once, with the device count the parent put in XLA_FLAGS

    for request in sys.stdin:
        call = json.loads(request)
        print(f"--- {call['fn']} on {jax.device_count()} devices", file=sys.stderr, flush=True)
        try:
            module, _, qualname = call["fn"].partition(":")
            fn: Any = functools.reduce(getattr, qualname.split("."), importlib.import_module(module))
            answer = {"ok": True, "result": fn(*call["args"])}
            json.dumps(answer)  # a result that is not JSON is the check's bug: reported as its failure
        except Exception:  # every failure of a check goes back to its test; the worker serves the next
            answer = {"ok": False, "error": traceback.format_exc()}
        # compiled programs of one check are of no use to the next: keep the worker's memory flat
        jax.clear_caches()
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
