"""eval/sandbox.py: a generated program that writes outside its folder, opens a socket, runs forever, forks without
end or eats memory is stopped, ends as a failure, and this process (the runner) carries on unharmed. Each hostile
case runs under the audit-hook guards alone (what every machine gets) and, where the kernel allows unprivileged
user namespaces, under the namespaces alone (guards off) and under both."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from eval.sandbox import Limits, SandboxError, namespaces_available, run_python
from tests.conftest import skip_unless_required

pytestmark = pytest.mark.integration  # every test starts a child interpreter

FAST = Limits(wall_s=5, cpu_s=2, memory_bytes=512 << 20)


def needs_namespaces() -> None:
    if not namespaces_available():
        skip_unless_required("this machine forbids unprivileged user namespaces (unshare -rmn fails)")


# (isolation, guards): the hooks alone, the namespaces alone, both
GUARDS, NAMESPACES, BOTH = ("guards", True), ("namespaces", False), ("namespaces", True)
LAYERS = [pytest.param(GUARDS, id="guards"), pytest.param(NAMESPACES, id="namespaces"),
          pytest.param(BOTH, id="both")]


def run(source: str, layer: tuple[str, bool], limits: Limits = FAST):
    isolation, guards = layer
    if isolation == "namespaces":
        needs_namespaces()
    return run_python(source, limits, isolation=isolation, guards=guards)


@pytest.mark.parametrize("layer", LAYERS)
def test_a_plain_program_runs_and_writes_in_its_own_folder(layer: tuple[str, bool]) -> None:
    outcome = run("import os\nopen('out.txt', 'w').write('x')\nos.mkdir('d')\nos.rename('out.txt', 'd/o')\n"
                  "print(open('d/o').read(), os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])", layer)
    assert outcome.ok, outcome.stderr
    assert outcome.stdout.split() == ["x", "True"]


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("attempt", [
    "open(SENTINEL, 'w').write('escaped')",
    "open(SENTINEL, 'a').write('escaped')",
    "import os\nos.close(os.open(SENTINEL, os.O_CREAT | os.O_WRONLY))",
    "import os\nos.symlink(SENTINEL, 'link')\nopen('link', 'w').write('escaped')",
    "import pathlib\npathlib.Path(SENTINEL).write_text('escaped')",
])
def test_writing_outside_its_folder_fails_and_nothing_is_written(tmp_path: Path, layer: tuple[str, bool],
                                                                 attempt: str) -> None:
    sentinel = tmp_path / "sentinel.txt"
    outcome = run(f"SENTINEL = {str(sentinel)!r}\n{attempt}\n", layer)
    assert outcome.status == "error"
    assert not sentinel.exists() and not sentinel.is_symlink()


@pytest.mark.parametrize("layer", LAYERS)
def test_removing_or_renaming_a_file_outside_fails(tmp_path: Path, layer: tuple[str, bool]) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("mine", encoding="utf-8")
    for attempt in (f"import os\nos.remove({str(kept)!r})", f"import os\nos.rename({str(kept)!r}, 'stolen')",
                    f"import shutil\nshutil.rmtree({str(tmp_path)!r})"):
        assert run(attempt, layer).status == "error", attempt
    assert kept.read_text(encoding="utf-8") == "mine"


@pytest.mark.parametrize("layer", LAYERS)
def test_a_socket_gets_nowhere(layer: tuple[str, bool]) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never routed, so an unguarded attempt fails too, but only after
    # connect's own timeout; here it must fail at once (no socket at all, or no network)
    outcome = run("import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=3)\nprint('connected')", layer)
    assert outcome.status == "error" and "connected" not in outcome.stdout
    assert outcome.seconds < 3
    assert ("socket" in outcome.stderr and "refused" in outcome.stderr) or "unreachable" in outcome.stderr


@pytest.mark.parametrize("layer", LAYERS)
def test_an_endless_loop_is_killed_by_the_cpu_limit(layer: tuple[str, bool]) -> None:
    started = time.perf_counter()
    outcome = run("while True:\n    pass\n", layer, Limits(wall_s=30, cpu_s=1))
    assert outcome.status == "killed" and not outcome.ok
    assert time.perf_counter() - started < 30


@pytest.mark.parametrize("layer", LAYERS)
def test_a_sleeper_is_killed_at_the_wall_clock_timeout(layer: tuple[str, bool]) -> None:
    outcome = run("import time\nprint('started', flush=True)\ntime.sleep(600)\nprint('woke')", layer,
                  Limits(wall_s=1.5, cpu_s=5))
    assert outcome.status == "timeout" and outcome.returncode is None
    assert outcome.stdout.split() == ["started"]
    assert outcome.seconds < 10


@pytest.mark.parametrize("layer", [pytest.param(GUARDS, id="guards"), pytest.param(BOTH, id="both")])
def test_a_fork_bomb_is_refused(layer: tuple[str, bool]) -> None:
    for bomb in ("import os\nwhile True:\n    os.fork()", "import subprocess\nsubprocess.run(['sh', '-c', ':'])",
                 "import multiprocessing\nmultiprocessing.Process(target=print).start()"):
        outcome = run(bomb, layer)
        assert outcome.status == "error" and "refused" in outcome.stderr, bomb


@pytest.mark.parametrize("layer", [pytest.param(GUARDS, id="guards"), pytest.param(BOTH, id="both")])
def test_native_code_and_raised_limits_are_refused(layer: tuple[str, bool]) -> None:
    for attempt in ("import ctypes\nctypes.CDLL(None).fork()", "import resource\n"
                    "resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))"):
        outcome = run(attempt, layer)
        assert outcome.status == "error" and "refused" in outcome.stderr, attempt


def test_a_write_relative_to_a_directory_descriptor_gets_past_the_guards_alone(tmp_path: Path) -> None:
    """What README calls the audit hooks' limit: they judge a path against the cwd, so a path relative to an
    open directory outside goes unseen. Only the namespaces' read-only file system stops it."""
    attempt = (f"import os\nos.close(os.open('sentinel', os.O_CREAT | os.O_WRONLY, "
               f"dir_fd=os.open({str(tmp_path)!r}, os.O_RDONLY)))")
    assert run(attempt, GUARDS).ok and (tmp_path / "sentinel").exists()
    (tmp_path / "sentinel").unlink()
    outcome = run(attempt, BOTH)
    assert outcome.status == "error" and "Read-only file system" in outcome.stderr
    assert not (tmp_path / "sentinel").exists()


def test_processes_a_program_starts_die_with_it_at_the_timeout() -> None:
    """Namespaces without the guards: forking is allowed (RLIMIT_NPROC and the PID namespace bound it); at the
    timeout the whole PID namespace goes, a child that left the process group with setsid included."""
    needs_namespaces()
    outcome = run("import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n"
                  "        time.sleep(600)\nprint('forked', flush=True)\ntime.sleep(600)", NAMESPACES, Limits(wall_s=2))
    assert outcome.status == "timeout" and outcome.stdout.split() == ["forked"]
    time.sleep(0.5)
    sleepers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(_our_bootstrap())]
    assert not sleepers, "a sandboxed process outlived its run"


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _our_bootstrap() -> str:
    import sys

    return f"{sys.executable} -I -B -c"


@pytest.mark.parametrize("layer", LAYERS)
def test_a_memory_hog_fails_to_allocate(layer: tuple[str, bool]) -> None:
    outcome = run("block = bytearray(2 << 30)\nprint('allocated')", layer, Limits(memory_bytes=256 << 20))
    assert outcome.status == "error" and "MemoryError" in outcome.stderr


@pytest.mark.parametrize("layer", LAYERS)
def test_output_is_bounded(layer: tuple[str, bool]) -> None:
    outcome = run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", layer,
                  Limits(file_bytes=1 << 20, output_bytes=1000))
    assert not outcome.ok and len(outcome.stdout) <= 1000


def test_the_environment_is_scrubbed_and_stdin_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RU_SANDBOX_SECRET", "token-123")
    outcome = run_python("import os, sys\nprint(sorted(os.environ))\nprint(repr(sys.stdin.read()))", FAST)
    assert outcome.ok, outcome.stderr
    assert "RU_SANDBOX_SECRET" not in outcome.stdout and "token-123" not in outcome.stdout
    assert outcome.stdout.splitlines()[-1] == "''"


def test_the_runs_folder_is_removed_afterwards() -> None:
    outcome = run_python("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())", FAST)
    assert outcome.ok and not Path(outcome.stdout.strip()).exists()


def test_no_isolation_at_all_is_refused() -> None:
    with pytest.raises(SandboxError, match="unisolated"):
        run_python("print(1)", FAST, isolation="guards", guards=False)


def test_the_runner_is_unharmed_after_hostile_runs(tmp_path: Path) -> None:
    cwd, env = os.getcwd(), dict(os.environ)
    for hostile in ("import os\nos.chdir('/')\nos.environ.clear()", "import signal, os\nos.kill(os.getppid(), 9)"):
        run_python(hostile, FAST)
    assert os.getcwd() == cwd and dict(os.environ) == env
    assert run_python("print(6 * 7)", FAST).stdout.strip() == "42"
