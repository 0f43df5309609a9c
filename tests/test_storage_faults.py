"""A storage server that fails for a while costs retries, never data: the real clients (gcsfs on aiohttp, s3fs on
aiobotocore) against fake-gcs-server and moto, behind tests/fault_proxy.py, which injects the faults.

Every operation the run folder rests on meets every fault, on both backends, all the cases of a test at once
(each on a bucket of its own, its fault matching only that bucket's requests). A case's outcome is "ok" (the
right bytes, after retries: the fault was injected), "error" (an OSError, one line, and the store holds the old
version or the new one whole), "exists"/"changed" (FileExistsError / PreconditionFailed where another writer's
object is there) or "wrong" (the client reports something false, or the store holds bytes nobody wrote).
``EXPECTED`` lists every outcome that is not "ok", and why. The "wrong" ones:

- an exclusive create, or a conditional replace, whose answer is lost (the connection drops after the server
  acted, or the response is cut): the client retries, the retry fails the precondition its first try met, and
  the caller hears FileExistsError / PreconditionFailed about its own write, on both backends.
  ``experiment.storage.retry``'s checked variants read the object back and answer right (the "(checked)" rows);
- fake-gcs-server only: a resumable-upload chunk sent again after its answer was lost is appended again (the
  emulator ignores Content-Range; GCS ignores the bytes it already has): the object grows by the chunk.

Beyond the matrix: a hung request (cut after the socket timeout and retried), botocore's retry quota (an S3
outage leaves the client retrying nothing for a while), the proxy relaying answers unchanged. A whole run
meeting an outage is tests/test_bucket_runs.py's.
"""

from __future__ import annotations

import http.client
import os
import random
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from experiment.files import atomic_open, atomic_write_json, read_json_object
from experiment.storage import BucketPath, backends, create_exclusive, location
from experiment.storage.retry import create_exclusive_checked, replace_if_checked
from tests.fault_proxy import FaultProxy, Rule

ENV = {"gs": "STORAGE_EMULATOR_HOST", "s3": "AWS_ENDPOINT_URL"}
FLAVOR = {"gs": "gcs", "s3": "s3"}
PART = 5 << 20  # upload part: gcsfs's block; s3fs's (50 MiB) is lowered to it so a 12 MiB stream is multipart
CASE_TIMEOUT_S = 45.0  # every case of a test together; a case still running then is a hang


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


def _through_proxy(scheme: str, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point ``scheme``'s client at ``proxy``, through filesystems made from now on (the test's own)."""
    monkeypatch.setenv(ENV[scheme], proxy.url)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setattr(backends, "_filesystems", {})


@pytest.fixture(params=["gs", "s3"])
def proxied(request: pytest.FixtureRequest, storage_servers: Any,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any, FaultProxy]]:
    """(scheme, storage_servers, proxy): the backend's client pointed at a fault proxy in front of its server."""
    scheme = request.param
    with FaultProxy(storage_servers.endpoint(scheme), flavor=FLAVOR[scheme]) as proxy:
        _through_proxy(scheme, proxy, monkeypatch)
        if scheme == "s3":
            backends.filesystem("s3").default_block_size = PART
        yield scheme, storage_servers, proxy


# ---------------------------------------------------------------------------------------------
# operations: prepare (no fault), act (under the fault), verify (after it)


@dataclass
class Op:
    name: str
    # (scheme, bucket) -> (method, path) patterns of the request to hit [, how many of them to let through first]
    target: Callable[[str, str], tuple[Any, ...]]
    prepare: Callable[[BucketPath], Any]
    act: Callable[[BucketPath, Any], Any]
    verify: Callable[[BucketPath, Any, Any, BaseException | None], str]  # -> "ok" | "error" | "exists" | "wrong: ..."


def _upload(scheme: str, bucket: str) -> tuple[str, str]:
    return ("POST", f"/upload/storage/v1/b/{bucket}/o\\?uploadType=multipart") if scheme == "gs" else \
        ("PUT", f"^/{bucket}/")


def _get_object(scheme: str, bucket: str) -> tuple[str, str]:
    return ("GET", f"/b/{bucket}/o/.*alt=media") if scheme == "gs" else ("GET", f"^/{bucket}/")


def _listing(scheme: str, bucket: str) -> tuple[str, str]:
    return ("GET", f"/storage/v1/b/{bucket}/o\\?") if scheme == "gs" else ("GET", f"^/{bucket}\\?list-type")


def _stream_part(scheme: str, bucket: str) -> tuple[str, str]:
    return ("POST", f"/b/{bucket}/o\\?.*upload_id=") if scheme == "gs" else ("PUT", f"^/{bucket}/.*partNumber=")


def _stream_finish(scheme: str, bucket: str) -> tuple[str, str, int]:
    # gcsfs: the last chunk (the third of 5+5+2 MiB) finalizes the resumable upload; s3fs: CompleteMultipartUpload
    return ("POST", f"/b/{bucket}/o\\?.*upload_id=", 2) if scheme == "gs" else \
        ("POST", f"^/{bucket}/.*\\?uploadId=", 0)


def _describe(data: Any) -> str:
    if isinstance(data, bytes):
        return f"{len(data)} bytes {data[:12]!r}"
    return "nothing" if data is None else repr(data)[:80]


def _read(path: BucketPath) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _written(found: bytes | None, expected: bytes, exc: BaseException | None, what: str) -> str:
    """A plain write's outcome: ok (the new bytes), error (raised; nothing there, or the new bytes whole)."""
    if exc is None:
        return "ok" if found == expected else f"wrong: {what} reads {_describe(found)} after a write that succeeded"
    if found in (None, expected):
        return "error"
    return f"wrong: {what} reads {_describe(found)} after {one_line(exc)}"


def _write_bytes() -> Op:
    data = payload(100_000, 1)

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        return _written(_read(root / "w" / "obj.bin"), data, exc, "the object")

    return Op("write_bytes", _upload, lambda root: None,
              lambda root, state: (root / "w" / "obj.bin").write_bytes(data), verify)


def _write_json() -> Op:
    record = {"step": 6, "ppl": "низкая", "pad": "x" * 2000}

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        found = _read(root / "eval.json")
        whole = found is not None and read_json_object(root / "eval.json") == record
        if exc is None:
            return "ok" if whole else f"wrong: reads {_describe(found)}"
        return "error" if found is None or whole else f"wrong: reads {_describe(found)} after {one_line(exc)}"

    return Op("atomic_write_json", _upload, lambda root: None,
              lambda root, state: atomic_write_json(root / "eval.json", record), verify)


def _stream(finish: bool) -> Op:
    chunks = [payload(1 << 20, 100 + i) for i in range(12)]

    def act(root: BucketPath, state: Any) -> None:
        with atomic_open(root / "shard.bin", "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        return _written(_read(root / "shard.bin"), b"".join(chunks), exc, "the 12 MiB object")

    return Op("atomic_open wb, last part" if finish else "atomic_open wb, a part",
              _stream_finish if finish else _stream_part, lambda root: None, act, verify)


def _reads(name: str) -> Op:
    data = payload(300_000, 2)

    def prepare(root: BucketPath) -> None:
        (root / "r" / "obj.bin").write_bytes(data)
        (root / "r" / "sub" / "b.txt").write_bytes(b"b")

    def act(root: BucketPath, state: Any) -> Any:
        if name == "read_bytes":
            return (root / "r" / "obj.bin").read_bytes()
        if name == "read_range":
            return (root / "r" / "obj.bin").read_range(1000, 201_000)
        if name == "iterdir":
            return [p.name for p in (root / "r").iterdir()]
        return {key: stat.size for key, stat in (root / "r").list_objects().items()}

    expected: Any = {"read_bytes": data, "read_range": data[1000:201_000], "iterdir": ["obj.bin", "sub"],
                     "list_objects": {"obj.bin": len(data), "sub/b.txt": 1}}[name]

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        if exc is not None:
            return "error"
        return "ok" if result == expected else f"wrong: {name} returned {_describe(result)}"

    return Op(name, _listing if name in ("iterdir", "list_objects") else _get_object, prepare, act, verify)


def _token() -> bytes:
    return f"holder {os.getpid()} {threading.get_ident()} {time.time_ns()}".encode()


def _create(checked: bool) -> Op:
    def act(root: BucketPath, state: Any) -> Any:
        state["data"] = _token()
        return (create_exclusive_checked if checked else create_exclusive)(root / "lock", state["data"])

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        found = _read(root / "lock")
        if exc is None:
            return "ok" if found == state["data"] else f"wrong: created, but the object reads {_describe(found)}"
        if isinstance(exc, FileExistsError) and found == state["data"]:
            return "wrong: FileExistsError, though the object holds this caller's own token"
        return "error" if found in (None, state["data"]) else f"wrong: the object reads {_describe(found)}"

    return Op("create_exclusive (checked)" if checked else "create_exclusive", _upload, lambda root: {}, act, verify)


def _create_taken(checked: bool) -> Op:
    theirs = b"held by another process"

    def act(root: BucketPath, state: Any) -> Any:
        return (create_exclusive_checked if checked else create_exclusive)(root / "lock", _token())

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        found = _read(root / "lock")
        if found != theirs:
            return f"wrong: the other holder's object now reads {_describe(found)}"
        if exc is None:
            return "wrong: created over another holder's object"
        return "exists" if isinstance(exc, FileExistsError) else "error"

    return Op(f"create_exclusive{' (checked)' if checked else ''}, name taken", _upload,
              lambda root: create_exclusive(root / "lock", theirs), act, verify)


def _replace(checked: bool, raced: bool = False) -> Op:
    """replace_if at the generation read; ``raced``: another writer replaced the object after that read."""

    def prepare(root: BucketPath) -> dict[str, Any]:
        written = backends.create((root / "lease").url, b"renewed 1")
        if raced:
            backends.replace_if((root / "lease").url, b"taken over", written.generation)
        return {"generation": written.generation, "data": _token()}

    def act(root: BucketPath, state: Any) -> Any:
        return (replace_if_checked if checked else backends.replace_if)((root / "lease").url, state["data"],
                                                                        state["generation"])

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        found = _read(root / "lease")
        if raced:
            if found != b"taken over":
                return f"wrong: the other writer's object now reads {_describe(found)}"
            if exc is None:
                return "wrong: replaced an object another writer had replaced"
            return "changed" if isinstance(exc, backends.PreconditionFailed) else "error"
        if exc is None:
            now = backends.stat((root / "lease").url)
            if found != state["data"]:
                return f"wrong: replaced, but the object reads {_describe(found)}"
            return "ok" if now is not None and now.generation == result.generation else \
                f"wrong: returned generation {result.generation}, the object is at {now}"
        if isinstance(exc, backends.PreconditionFailed) and found == state["data"]:
            return "wrong: PreconditionFailed (\"changed since it was read\"), though the object holds this write"
        return "error" if found in (b"renewed 1", state["data"]) else f"wrong: the object reads {_describe(found)}"

    name = f"replace_if{' (checked)' if checked else ''}{', raced' if raced else ''}"
    return Op(name, _upload, prepare, act, verify)


OPS = [_write_bytes(), _write_json(), _stream(False), _stream(True), _reads("read_bytes"), _reads("read_range"),
       _reads("iterdir"), _reads("list_objects"), _create(False), _create(True), _create_taken(False),
       _create_taken(True), _replace(False), _replace(True), _replace(True, raced=True)]


# ---------------------------------------------------------------------------------------------
# faults and what each case is expected to come to


ANSWERS = {  # the server answers with an error: it never saw the request
    "503 x2": {"kind": "status", "status": 503, "count": 2},  # s3: ServiceUnavailable
    "429 x2": {"kind": "status", "status": 429, "count": 2},  # s3: SlowDown; gcs: rateLimitExceeded
    "429 bare x2": {"kind": "status", "status": 429, "count": 2, "body": b"Too Many Requests\n"},  # a gateway's
    "500 x2": {"kind": "status", "status": 500, "count": 2},
}
LOST = {  # the connection is lost
    "drop at head x2": {"kind": "drop", "when": "head", "count": 2},  # request body unread, never forwarded
    "drop unsent x2": {"kind": "drop", "when": "request", "count": 2},  # request read, never forwarded
    "drop answer x1": {"kind": "drop", "when": "response", "count": 1},  # the server acted; no answer
    "cut body x1": {"kind": "cut", "count": 1},  # the answer's head and half its body (an empty body: half the head)
}
FAULTS = {**ANSWERS, **LOST}

_LOST_ANSWER = ("drop answer x1", "cut body x1")
_TAKEN = ("create_exclusive, name taken", "create_exclusive (checked), name taken")
EXPECTED: dict[tuple[str, str, str], str] = {
    # the object of another holder stays; the caller hears FileExistsError ("exists") whatever came between
    **{(scheme, op, fault): "exists" for scheme in ("gs", "s3") for op in _TAKEN for fault in FAULTS},
    **{(scheme, "replace_if (checked), raced", fault): "changed" for scheme in ("gs", "s3") for fault in FAULTS},
    # WRONG: the answer to a conditional write is lost, the client's retry fails the precondition its first
    # try met, and the caller hears that somebody else holds / changed its own object (fixed by the checked rows)
    **{(scheme, op, fault): "wrong" for scheme in ("gs", "s3") for op in ("create_exclusive", "replace_if")
       for fault in _LOST_ANSWER},
    # fake-gcs-server appends a chunk sent again after its answer was lost, whatever its Content-Range says
    # (GCS ignores the bytes it already has): the object grows by 5 MiB. An emulator's fault, not gcsfs's
    **{("gs", "atomic_open wb, a part", fault): "wrong" for fault in _LOST_ANSWER},
    # fake-gcs-server answers 404 to a finished upload session (GCS answers 200 and the object): the object is
    # whole, the caller hears FileNotFoundError naming the upload URL
    **{("gs", "atomic_open wb, last part", fault): "error" for fault in _LOST_ANSWER},
    # (a 429 without S3's throttling code, a gateway's plain page, is retried too: botocore retries it only with a
    # code, experiment.storage.backends makes s3fs retry it; measured as an error at once before that)
}


def expected(scheme: str, op: str, fault: str) -> str:
    return EXPECTED.get((scheme, op, fault), "ok")


@dataclass
class Case:
    op: Op
    fault: str
    root: BucketPath
    state: Any = None
    rule: Rule | None = None
    outcome: str = "hang"
    exc: BaseException | None = None
    seconds: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def kind(self) -> str:
        return self.outcome.split(":")[0]

    def row(self, scheme: str) -> str:
        hits = self.rule.hits if self.rule else 0
        error = one_line(self.exc) if self.exc else ""
        return (f"{scheme} | {self.op.name:38} | {self.fault:16} | {self.outcome[:70]:8} | expected "
                f"{expected(scheme, self.op.name, self.fault):7} | {hits} faults | {self.seconds:4.1f} s | {error}")


def run_cases(scheme: str, servers: Any, proxy: FaultProxy, ops: list[Op], faults: dict[str, dict[str, Any]]) \
        -> list[Case]:
    """Every op under every fault, at once, each on a bucket of its own; each case's outcome."""
    cases = []
    for op in ops:
        for fault in faults:
            root = location(servers.new_bucket(scheme, "fault"))
            assert isinstance(root, BucketPath)
            cases.append(Case(op, fault, root, op.prepare(root)))
    for case in cases:
        method, path, after = (*case.op.target(scheme, case.root.bucket), 0)[:3]
        case.rule = proxy.add(method=method, path=path, after=after, **faults[case.fault])

    def run(case: Case) -> None:
        start = time.monotonic()
        result: Any = None
        try:
            result = case.op.act(case.root, case.state)
        except Exception as exc:  # noqa: BLE001 - every outcome is recorded
            case.exc = exc
        case.seconds = time.monotonic() - start
        try:
            case.outcome = case.op.verify(case.root, case.state, result, case.exc)
        except Exception as exc:  # noqa: BLE001
            case.outcome = f"wrong: cannot verify: {one_line(exc)}"
        case.done.set()

    for case in cases:
        threading.Thread(target=run, args=(case,), daemon=True).start()  # a hung case must not hang the session
    deadline = time.monotonic() + CASE_TIMEOUT_S
    for case in cases:
        case.done.wait(max(0.0, deadline - time.monotonic()))
    return cases


def check_cases(scheme: str, cases: list[Case]) -> None:
    problems = []
    for case in cases:
        want = expected(scheme, case.op.name, case.fault)
        if case.kind != want:
            problems.append(case)
            continue
        assert case.rule is not None
        if case.rule.hits == 0:
            problems.append(case)  # the fault never met the request it was meant for: the case proves nothing
        elif case.kind == "ok" and case.rule.count is not None and case.rule.hits != case.rule.count:
            problems.append(case)  # succeeded without meeting every fault it was given
        elif case.kind in ("error", "exists", "changed"):
            assert case.exc is not None
            if not isinstance(case.exc, OSError) or not str(case.exc).strip():
                problems.append(case)  # callers turn an OSError into one line; anything else escapes them
    table = "\n".join(case.row(scheme) for case in cases)
    assert not problems, "\n".join(case.row(scheme) for case in problems) + "\n\nall cases:\n" + table
    print("\n" + table)


@pytest.mark.parametrize("faults", [ANSWERS, LOST], ids=["error answers", "lost connections"])
def test_a_failing_server_costs_retries_not_data(proxied: tuple[str, Any, FaultProxy],
                                                 faults: dict[str, dict[str, Any]]) -> None:
    """Each group on a client of its own: botocore's retry quota (500 tokens, 5 a retry, refunded on success)
    is per client, and one group's retries stay well within it."""
    scheme, servers, proxy = proxied
    check_cases(scheme, run_cases(scheme, servers, proxy, OPS, faults))


def test_checked_create_is_plain_create_on_a_local_disk(tmp_path: Path) -> None:
    create_exclusive_checked(tmp_path / "runs" / "lock", b"mine")
    with pytest.raises(FileExistsError):
        create_exclusive_checked(tmp_path / "runs" / "lock", b"mine")  # a local create loses no answer: no read-back
    assert (tmp_path / "runs" / "lock").read_bytes() == b"mine"


# ---------------------------------------------------------------------------------------------
# a hung request, a long outage


def _scale_timeouts(scheme: str, seconds: float) -> Any:
    """The test's filesystem with its request timeout lowered from backends.REQUEST_TIMEOUT_S (60 s) to
    ``seconds``, before its first request (s3fs makes its client then)."""
    fs = backends.filesystem(scheme)
    if scheme == "gs":
        fs.requests_timeout = seconds
    else:
        fs.config_kwargs = {**fs.config_kwargs, "connect_timeout": seconds, "read_timeout": seconds}
    return fs


def test_a_hung_request_is_cut_after_the_timeout(proxied: tuple[str, Any, FaultProxy]) -> None:
    """One request that never gets an answer. s3: cut after the read timeout and retried (botocore's 10 attempts,
    inside s3fs's retries of ReadTimeoutError, nested twice for a read: a read that never gets an answer was
    measured at 75 attempts, the rest cut by the retry quota: 75 x 60 s + backoff, over an hour, at the
    production timeout). gs: cut after ``requests_timeout`` and NOT retried: aiohttp raises the builtin
    TimeoutError for its total timeout, which gcsfs's ``retry_request`` does not catch; fsspec turns it into
    FSTimeoutError, whose message is empty. With a socket-read timeout (``aiohttp.ClientTimeout(sock_read=...)``)
    aiohttp raises a ClientError, which gcsfs retries: the fix for backends._make_gcs."""
    import aiohttp
    from fsspec.exceptions import FSTimeoutError

    scheme, servers, proxy = proxied
    fs = _scale_timeouts(scheme, 1.0)
    root = location(servers.new_bucket(scheme))
    assert isinstance(root, BucketPath)
    (root / "obj").write_bytes(b"hello")
    stall = proxy.stall(20.0, count=1, method="GET")
    start = time.monotonic()
    if scheme == "s3":
        assert (root / "obj").read_bytes() == b"hello"
        assert stall.hits == 1 and time.monotonic() - start < 10
        return
    with pytest.raises(FSTimeoutError) as caught:
        (root / "obj").read_bytes()
    assert stall.hits == 1 and 0.9 < time.monotonic() - start < 10
    assert isinstance(caught.value, OSError) and str(caught.value) == ""  # nothing to say which object, or why
    fs.requests_timeout = aiohttp.ClientTimeout(total=None, sock_connect=1.0, sock_read=1.0)
    stall = proxy.stall(20.0, count=1, method="GET")
    assert (root / "obj").read_bytes() == b"hello"
    assert stall.hits == 1


def test_an_s3_outage_spends_the_clients_retries(storage_servers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's standard retry mode takes 5 tokens of a per-client quota of 500 for each retry: a few dozen calls
    failing together (an outage) get far fewer retries than their attempts allow (40 reads of 6 attempts each made
    146-147 requests in eight runs, not 240), and a fresh client retries a single 500. Whether the outage's client
    retries the next single 500 as well varied from run to run (about half the runs did, 2026-12-06: the quota is
    not reliably empty afterwards), so that is not asserted."""
    with FaultProxy(storage_servers.s3_endpoint, flavor="s3") as proxy:
        _through_proxy("s3", proxy, monkeypatch)
        root = location(storage_servers.new_bucket("s3"))
        assert isinstance(root, BucketPath)
        (root / "obj").write_bytes(b"hello")
        outage = proxy.fail(503, method="GET")
        errors: list[BaseException] = []

        def read() -> None:
            try:
                (root / "obj").read_bytes()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=read, daemon=True) for _ in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(CASE_TIMEOUT_S)
        assert len(errors) == 40 and all(isinstance(e, OSError) for e in errors)
        # S3_MAX_ATTEMPTS (6) each, 240 in all, but for the quota: 40 first tries and about 100 retries
        assert 40 < outage.hits < 200, outage.hits
        proxy.remove(outage)
        monkeypatch.setattr(backends, "_filesystems", {})  # a fresh client, a full quota
        blip = proxy.fail(500, count=1, method="GET")
        assert (root / "obj").read_bytes() == b"hello" and blip.hits == 1


class _Framings(socketserver.ThreadingTCPServer):
    """An upstream answering each request in one framing: Content-Length, chunked, or until it closes."""

    daemon_threads = True
    allow_reuse_address = True
    BODY = b"".join(b"line %d\n" % i for i in range(5000))

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while True:
                line = self.rfile.readline()
                if not line:
                    return
                while self.rfile.readline() not in (b"\r\n", b""):
                    pass
                path = line.split()[1].decode()
                body = _Framings.BODY
                if path == "/chunked":
                    pieces = [body[i:i + 7000] for i in range(0, len(body), 7000)]
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
                        b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: 1\r\n\r\n")
                elif path == "/eof":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
                    return
                else:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), self.Handler)


def test_the_proxy_relays_answers_unchanged_and_counts(storage_servers: Any) -> None:
    upstream = _Framings()
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with FaultProxy(f"http://127.0.0.1:{upstream.server_address[1]}", latency=0.03) as proxy:
            connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
            start = time.monotonic()
            for path in ("/length", "/chunked", "/length", "/eof"):  # one keep-alive connection, until /eof
                connection.request("GET", path)
                answer = connection.getresponse()
                assert answer.status == 200 and answer.read() == _Framings.BODY, path
            assert time.monotonic() - start >= 4 * 0.03  # the latency, per request
            assert proxy.seen == proxy.forwarded == 4 and proxy.injected == 0
            proxy.fail(503, count=1)
            connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
            connection.request("GET", "/length")
            refused = connection.getresponse()
            assert refused.status == 503 and refused.read().startswith(b"503 Service Unavailable")
            connection.request("GET", "/length")  # the same connection, after an error answer
            assert connection.getresponse().read() == _Framings.BODY
            assert (proxy.seen, proxy.forwarded, proxy.injected) == (6, 5, 1)
    finally:
        upstream.shutdown()
        upstream.server_close()
    # a storage server's own answers, straight and through the proxy, after an Expect: 100-continue upload
    bucket = storage_servers.new_bucket("gs")[len("gs://"):]
    with FaultProxy(storage_servers.gcs_endpoint, flavor="gcs") as proxy:
        body = payload(3 << 20, 7)
        answers = []
        for port in (proxy.port, int(storage_servers.gcs_endpoint.rsplit(":", 1)[1])):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name=via-{port}", body=body,
                               headers={"Expect": "100-continue", "Content-Type": "application/octet-stream"})
            put = connection.getresponse()
            put.read()
            connection.request("GET", f"/download/storage/v1/b/{bucket}/o/via-{port}?alt=media",
                               headers={"Range": "bytes=5-100004"})
            got = connection.getresponse()
            answers.append((put.status, got.status, got.read(), got.getheader("Content-Range")))
        assert answers[0] == answers[1] and answers[0][:2] == (200, 206) and answers[0][2] == body[5:100005]
        assert proxy.seen == proxy.forwarded == 2
