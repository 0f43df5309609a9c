"""Run generated Python in a child process that cannot write outside its own folder, reach the network, spawn
processes or run forever, and read back what it printed: the runner behind the code tasks (eval/code_tasks.py).

    program text --written to a fresh temporary folder--> python -I -B -c BOOTSTRAP (new session, stdin closed,
    environment scrubbed, HOME and TMPDIR the folder) --> [namespaces] --> rlimits --> audit hooks --> exec(program)
    parent: wall-clock timeout -> SIGKILL to the whole process group; stdout/stderr tails read back; folder removed

Three layers, each stopping the hostile cases on its own where it applies (README "Code tasks and the sandbox"):

- **Namespaces** (``isolation="namespaces"``, used when ``namespaces_available()``: unprivileged user namespaces,
  as ``unshare -rmn`` needs): the child enters new user, mount, network and PID namespaces; every mount is remounted
  read-only but a bind mount of the run's folder; then it enters a second user namespace with no uid mapping, which
  drops its capabilities and locks those read-only flags (a mount copied into a less privileged namespace cannot be
  made writable again). The network namespace has only a downed loopback: no route anywhere. The program runs as
  PID 1's child of its own PID namespace; when the runner dies, the kernel kills every process in it.
- **Resource limits** (always): RLIMIT_CPU (SIGXCPU, then SIGKILL), RLIMIT_AS (memory: allocations fail),
  RLIMIT_FSIZE (a file, stdout's included, cannot grow past it), RLIMIT_NPROC, RLIMIT_NOFILE, no core files.
  RLIMIT_NPROC does not bind a process whose real uid is root: the audit hooks are what stop a fork bomb there.
- **Audit hooks** (``guards=True``, always in production; PEP 578 ``sys.addaudithook``, installed after the
  bootstrap's own imports and before the program): refuse opening a file for writing, creating, removing,
  renaming, linking or changing the mode of a path outside the folder, creating sockets, forking, spawning or
  exec'ing processes, sending signals, loading native code through ctypes and raising resource limits. They are
  a guard against accidents, not a security boundary: CPython's own documentation says hooks can be bypassed by
  code that is determined to (e.g. a C extension already loaded, or memory corruption).

What is NOT isolated, in either mode: the program can read every file the runner's user can read (the
namespaces make the file system read-only, not invisible) and can use the CPU and memory its limits allow.
Without namespaces (a kernel or container that forbids unprivileged user namespaces) the file system and the
network are guarded by the audit hooks alone. Run untrusted code from unknown sources in a VM or container.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Isolation = Literal["auto", "namespaces", "guards"]
SETUP_FAILED = 97  # the bootstrap's exit code when the namespaces could not be set up (nothing of the program ran)


@dataclass(frozen=True)
class Limits:
    """What one run may use. The defaults fit a HumanEval-sized function and its tests with room to spare."""

    wall_s: float = 10.0  # then SIGKILL to the process group
    cpu_s: int = 5  # RLIMIT_CPU
    memory_bytes: int = 1 << 30  # RLIMIT_AS (address space: the interpreter itself maps ~30 MiB)
    file_bytes: int = 1 << 20  # RLIMIT_FSIZE: any file the program writes, its stdout and stderr included
    processes: int = 16  # RLIMIT_NPROC (not binding for root: see the module docstring)
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 64 << 10  # how much of the end of stdout and of stderr the parent reads back


@dataclass(frozen=True)
class Outcome:
    """How one run ended. ``status``: ``ok`` (exit code 0), ``error`` (another exit code), ``killed`` (a
    signal: the CPU or file-size limit, or the program's own), ``timeout`` (the wall clock ran out)."""

    status: str
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str
    isolation: str  # "namespaces" or "guards"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not the program's failure): e.g. namespaces asked for and unavailable."""


# The child's first code: ``python -I -B -c BOOTSTRAP <settings JSON>``. Standard library only; runs in the
# run's folder (cwd). Kept as text so that nothing of this project is importable or needed in the child.
BOOTSTRAP = r'''
import json, os, resource, sys
settings = json.loads(sys.argv[1])
work = os.path.realpath(settings["work"])
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # before the fork below: no process of a run dumps core


def enter_namespaces():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    NEWNS, NEWUSER, NEWPID, NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
    RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
    KEEP = {"nosuid": NOSUID, "nodev": NODEV, "noexec": NOEXEC, "noatime": 1024, "nodiratime": 2048,
            "relatime": 1 << 21}

    def check(result, what):
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    def mount(source, target, flags):
        return libc.mount(source, target.encode(), None, flags, None)

    uid, gid = os.getuid(), os.getgid()
    check(libc.unshare(NEWUSER | NEWNS | NEWNET | NEWPID), "unshare")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")
    check(mount(None, "/", REC | PRIVATE), "make / private")
    check(mount(work.encode(), work, BIND), "bind the run's folder")
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 for a space, as the kernel writes it
            mounts.append((point, fields[5].split(",")))
    for point, options in mounts:
        if point == work:
            continue
        flags = REMOUNT | BIND | RDONLY
        for option in options:
            flags |= KEEP.get(option, 0)
        mount(None, point, flags)
    top = {}  # a path mounted over twice lists both; the later one is on top, the only one reachable
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            top[fields[4].encode().decode("unicode_escape")] = fields[5].split(",")
    # a mount left writable would be a way out: the run fails rather than go on (proc's files are not files)
    writable = [p for p, options in top.items() if p != work and "rw" in options and not p.startswith("/proc")]
    if writable:
        raise OSError(f"mounts still writable: {writable}")
    # a second user namespace without a uid map: no capabilities over the mounts above, whose flags it locks
    check(libc.unshare(NEWUSER), "drop privileges")
    pid = os.fork()  # the child is PID 1 of the new PID namespace
    if pid:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            os.kill(os.getpid(), -code)  # end as the program did: killed by the same signal
        os._exit(code)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the runner gone (killed at the timeout): this PID 1 and all below


if settings["namespaces"]:
    try:
        enter_namespaces()
    except Exception as exc:
        print(f"sandbox setup failed: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(97)

limits = settings["limits"]
# RLIMIT_NPROC counts every process and thread of the real user: in a user namespace only the sample's, outside one
# also the runner's (a JAX process holds hundreds of threads), where it would refuse the sample any thread; there
# the audit hooks refuse fork and spawn instead
nproc = (("RLIMIT_NPROC", limits["processes"]),) if settings["namespaces"] else ()
for name, value in (("RLIMIT_CPU", limits["cpu_s"]), ("RLIMIT_AS", limits["memory_bytes"]),
                    ("RLIMIT_FSIZE", limits["file_bytes"]), *nproc,
                    ("RLIMIT_NOFILE", limits["open_files"]), ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
os.chdir(work)
source = open("program.py", encoding="utf-8").read()

if settings["guards"]:
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
                   "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
                   "os.chflags": (0,), "os.mkfifo": (0,), "os.mknod": (0,), "shutil.rmtree": (0,),
                   "os.setxattr": (0,), "os.removexattr": (0,)}
    REFUSED = ("socket.", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
               "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen", "pty.spawn", "ctypes.",
               "resource.setrlimit", "resource.prlimit", "os.startfile", "webbrowser.open")
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep

    def inside(path):
        if isinstance(path, int):  # an already open descriptor
            return True
        name = realpath(fsdecode(path))
        return name == work or name.startswith(work + sep) or name == "/dev/null"

    def guard(event, args):
        if event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags > 0 and flags & WRITE_FLAGS)
            if writes and path is not None and not inside(path):
                raise PermissionError(f"sandbox: writing outside the run's folder is refused: {path!r}")
        elif event in PATH_EVENTS:
            for i in PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    raise PermissionError(f"sandbox: {event} outside the run's folder is refused: {args[i]!r}")
        elif event.startswith(REFUSED):
            raise PermissionError(f"sandbox: {event} is refused")

    sys.addaudithook(guard)

del settings, limits
exec(compile(source, "program.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
'''


def _tail(path: Path, limit: int) -> str:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - limit))
        return handle.read().decode("utf-8", errors="replace")


def _scrubbed_env(work: Path) -> dict[str, str]:
    """The child's whole environment: nothing of the runner's (tokens, cloud credentials, proxies) passes."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}


def run_python(source: str, limits: Limits = Limits(), *, isolation: Isolation = "auto",
               guards: bool = True) -> Outcome:
    """Run ``source`` as a Python program in the sandbox (module docstring) and say how it ended.

    ``isolation``: ``namespaces`` (an error where they are unavailable), ``guards`` (audit hooks and limits
    only) or ``auto`` (namespaces where ``namespaces_available()``). ``guards=False`` leaves the audit hooks
    out, which only tests use: to show what the namespaces stop on their own."""
    if isolation == "auto":
        isolation = "namespaces" if namespaces_available() else "guards"
    if isolation == "namespaces" and not namespaces_available():
        raise SandboxError("isolation='namespaces' asked for, but this machine does not allow unprivileged user "
                           "namespaces (kernel.unprivileged_userns_clone, or a container's seccomp profile)")
    if not guards and isolation != "namespaces":
        raise SandboxError("guards=False without namespaces would run the program unisolated")
    return _run(source, limits, namespaces=isolation == "namespaces", guards=guards)


def _run(source: str, limits: Limits, *, namespaces: bool, guards: bool) -> Outcome:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ru-sandbox-") as private:
        # the output files live beside the run's folder, not in it: the program holds only their descriptors
        work, out_path, err_path = Path(private) / "work", Path(private) / "stdout", Path(private) / "stderr"
        work.mkdir()
        (work / "program.py").write_text(source, encoding="utf-8")
        settings = {"work": str(work), "namespaces": namespaces, "guards": guards, "limits": asdict(limits)}
        with out_path.open("wb") as out, err_path.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-I", "-B", "-c", BOOTSTRAP, json.dumps(settings)], cwd=work,
                env=_scrubbed_env(work), stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True,
                start_new_session=True)  # its own process group: the timeout kills it and everything it started
            try:
                returncode: int | None = process.wait(timeout=limits.wall_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out, returncode = True, None
            finally:
                _kill_group(process.pid)
                process.wait()
        stdout, stderr = _tail(out_path, limits.output_bytes), _tail(err_path, limits.output_bytes)
    if returncode == SETUP_FAILED and stderr.startswith("sandbox setup failed"):
        raise SandboxError(stderr.strip().splitlines()[-1])
    status = ("timeout" if timed_out else "ok" if returncode == 0 else
              "killed" if returncode is not None and returncode < 0 else "error")
    return Outcome(status, returncode, round(time.perf_counter() - started, 4), stdout, stderr,
                   "namespaces" if namespaces else "guards")


def _kill_group(pgid: int) -> None:
    """SIGKILL to every process left in the run's group (after a timeout, or stragglers after a normal exit)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@functools.cache
def namespaces_available() -> bool:
    """Whether this machine lets an unprivileged process make the namespaces (tried once per process: a
    trivial program run with them, which must write in its folder and find no network)."""
    if not sys.platform.startswith("linux"):
        return False
    probe = ("import socket\nopen('probe', 'w').write('x')\ntry:\n"
             "    socket.create_connection(('192.0.2.1', 9), timeout=1)\nexcept OSError:\n    print('no network')\n")
    try:
        outcome = _run(probe, Limits(wall_s=20), namespaces=True, guards=False)
    except SandboxError:
        return False
    return outcome.ok and outcome.stdout.strip() == "no network"
