"""A storage server that fails for a while costs retries, never data: the real clients (gcsfs on aiohttp, s3fs on
botocore) against fake-gcs-server and moto, behind tests/fault_proxy.py, which injects the faults.

Every operation the run folder rests on meets every fault, on both backends, all cases of a backend at once
(each on a bucket of its own, the fault matching that bucket's requests): the outcome is either the right bytes
after retries, or an exception, and then the store holds the old version or the new one whole. EXPECTED says
which, case by case; "wrong" marks the cases where the client reports something false (an exclusive create
whose answer was lost reports FileExistsError though the object is its own): ``experiment.storage.retry``
turns those into the right answer, and the ``checked`` rows show it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from experiment.files import atomic_open, atomic_write_json, read_json_object
from experiment.storage import BucketPath, create_exclusive, location
from experiment.storage import backends
from tests.fault_proxy import FaultProxy, Rule

ENV = {"gs": "STORAGE_EMULATOR_HOST", "s3": "AWS_ENDPOINT_URL"}
FLAVOR = {"gs": "gcs", "s3": "s3"}
PART = 5 << 20  # upload part: gcsfs's block; s3fs's (50 MiB) is lowered to it so a 12 MiB stream is multipart
CASE_TIMEOUT_S = 45.0


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}"


@pytest.fixture(params=["gs", "s3"])
def proxied(request: pytest.FixtureRequest, storage_servers: Any,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, FaultProxy]]:
    """(storage_servers, proxy): the backend's client pointed at a fault proxy in front of its server, through
    filesystems made for this test."""
    scheme = request.param
    with FaultProxy(storage_servers.endpoint(scheme), flavor=FLAVOR[scheme]) as proxy:
        monkeypatch.setenv(ENV[scheme], proxy.url)
        monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        monkeypatch.setattr(backends, "_filesystems", {})
        if scheme == "s3":
            backends.filesystem("s3").default_block_size = PART
        proxy.scheme = scheme  # type: ignore[attr-defined]
        yield storage_servers, proxy


# ---------------------------------------------------------------------------------------------
# operations: prepare (no fault), act (under the fault), verify (after it)


@dataclass
class Op:
    name: str
    # (scheme, bucket) -> (method, path) patterns of the request to hit [, how many of them to let through first]
    target: Callable[[str, str], tuple[Any, ...]]
    prepare: Callable[[BucketPath], Any]
    act: Callable[[BucketPath, Any], Any]
    verify: Callable[[BucketPath, Any, Any, BaseException | None], str]  # -> "ok" | "error" | "wrong: ..."


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


def _same(found: bytes | None, expected: bytes, old: bytes | None, exc: BaseException | None, what: str) -> str:
    """The outcome of a write: ok (new bytes, no error), error (an exception, the old or the new bytes whole)."""
    if exc is None:
        return "ok" if found == expected else f"wrong: {what} reads {_describe(found)} after a write that succeeded"
    if found in (old, expected):
        return "error"
    return f"wrong: {what} reads {_describe(found)} after {one_line(exc)}"


def _describe(data: bytes | None) -> str:
    return "nothing" if data is None else f"{len(data)} bytes {data[:16]!r}"


def _read(path: BucketPath) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _write_bytes() -> Op:
    data = payload(100_000, 1)

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        return _same(_read(root / "w" / "obj.bin"), data, None, exc, "the object")

    return Op("write_bytes", _upload, lambda root: None, lambda root, state: (root / "w" / "obj.bin").write_bytes(data),
              verify)


def _write_json() -> Op:
    record = {"step": 6, "ppl": "низкая", "pad": "x" * 2000}

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        found = _read(root / "eval.json")
        if exc is None:
            return "ok" if read_json_object(root / "eval.json") == record else f"wrong: reads {_describe(found)}"
        return "error" if found is None or read_json_object(root / "eval.json") == record else \
            f"wrong: reads {_describe(found)} after {one_line(exc)}"

    return Op("atomic_write_json", _upload, lambda root: None, lambda root, state: atomic_write_json(root / "eval.json",
                                                                                                    record), verify)


def _stream(finish: bool) -> Op:
    chunks = [payload(1 << 20, 100 + i) for i in range(12)]

    def act(root: BucketPath, state: Any) -> None:
        with atomic_open(root / "shard.bin", "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        return _same(_read(root / "shard.bin"), b"".join(chunks), None, exc, "the 12 MiB object")

    return Op("atomic_open wb (finish)" if finish else "atomic_open wb (part)",
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
        return "ok" if result == expected else f"wrong: {name} returned {_describe(result) if isinstance(result, bytes) else result}"

    return Op(name, _listing if name in ("iterdir", "list_objects") else _get_object, prepare, act, verify)


def _create(checked: bool) -> Op:
    def act(root: BucketPath, state: Any) -> Any:
        token = f"holder {threading.get_ident()} {time.time_ns()}".encode()
        state["data"] = token
        if checked:
            from experiment.storage.retry import create_exclusive_checked

            return create_exclusive_checked(root / "lock", token)
        return create_exclusive(root / "lock", token)

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        found = _read(root / "lock")
        if exc is None:
            return "ok" if found == state["data"] else f"wrong: created, but the object reads {_describe(found)}"
        if isinstance(exc, FileExistsError) and found == state["data"]:
            return "wrong: FileExistsError, though the object holds this caller's own token"
        return "error" if found in (None, state["data"]) else f"wrong: the object reads {_describe(found)}"

    return Op("create_exclusive (checked)" if checked else "create_exclusive", _upload, lambda root: {}, act, verify)


def _create_taken() -> Op:
    theirs = b"held by another process"

    def act(root: BucketPath, state: Any) -> Any:
        return create_exclusive(root / "lock", b"mine")

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        found = _read(root / "lock")
        if found != theirs:
            return f"wrong: the other holder's object now reads {_describe(found)}"
        if exc is None:
            return "wrong: created over another holder's object"
        return "exists" if isinstance(exc, FileExistsError) else "error"

    return Op("create_exclusive on a taken name", _upload, lambda root: create_exclusive(root / "lock", theirs), act,
              verify)


def _replace(checked: bool) -> Op:
    def prepare(root: BucketPath) -> dict[str, Any]:
        written = backends.create((root / "lease").url, b"renewed 1")
        return {"generation": written.generation, "data": f"renewed 2 {time.time_ns()}".encode()}

    def act(root: BucketPath, state: Any) -> Any:
        if checked:
            from experiment.storage.retry import replace_if_checked

            return replace_if_checked((root / "lease").url, state["data"], state["generation"])
        return backends.replace_if((root / "lease").url, state["data"], state["generation"])

    def verify(root: BucketPath, state: Any, result: Any, exc: BaseException | None) -> str:
        found = _read(root / "lease")
        if exc is None:
            stat = backends.stat((root / "lease").url)
            if found != state["data"]:
                return f"wrong: replaced, but the object reads {_describe(found)}"
            return "ok" if stat is not None and stat.generation == result.generation else \
                f"wrong: returned generation {result.generation}, the object is at {stat}"
        if isinstance(exc, backends.PreconditionFailed) and found == state["data"]:
            return "wrong: PreconditionFailed (\"changed since it was read\"), though the object holds this write"
        return "error" if found in (b"renewed 1", state["data"]) else f"wrong: the object reads {_describe(found)}"

    return Op("replace_if (checked)" if checked else "replace_if", _upload, prepare, act, verify)


OPS = [_write_bytes(), _write_json(), _stream(False), _stream(True), _reads("read_bytes"), _reads("read_range"),
       _reads("iterdir"), _reads("list_objects"), _create(False), _create(True), _create_taken(), _replace(False),
       _replace(True)]


# ---------------------------------------------------------------------------------------------
# faults


FAULTS: dict[str, dict[str, Any]] = {
    "503 x2": {"kind": "status", "status": 503, "count": 2},
    "429 x2": {"kind": "status", "status": 429, "count": 2},
    "429 plain x2": {"kind": "status", "status": 429, "count": 2, "body": b"Too Many Requests\n"},
    "500 x2": {"kind": "status", "status": 500, "count": 2},
    "drop head x2": {"kind": "drop", "when": "head", "count": 2},
    "drop before x2": {"kind": "drop", "when": "request", "count": 2},
    "drop after x1": {"kind": "drop", "when": "response", "count": 1},
    "cut body x1": {"kind": "cut", "count": 1},
}


@dataclass
class Case:
    op: Op
    fault: str
    root: BucketPath
    state: Any = None
    rule: Rule | None = None
    outcome: str = "hang"
    error: str = ""
    seconds: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)


def run_cases(servers: Any, proxy: FaultProxy, ops: list[Op], faults: list[str]) -> list[Case]:
    """Every op under every fault, at once, each on a bucket of its own; each case's outcome."""
    scheme = proxy.scheme  # type: ignore[attr-defined]
    cases = []
    for op in ops:
        for fault in faults:
            root = location(servers.new_bucket(scheme, "fault"))
            assert isinstance(root, BucketPath)
            cases.append(Case(op, fault, root, op.prepare(root)))
    for case in cases:
        method, path, after = (*case.op.target(scheme, case.root.bucket), 0)[:3]
        case.rule = proxy.add(method=method, path=path, after=after, **FAULTS[case.fault])

    def run(case: Case) -> None:
        start = time.monotonic()
        result: Any = None
        exc: BaseException | None = None
        try:
            result = case.op.act(case.root, case.state)
        except Exception as caught:  # noqa: BLE001 - every outcome is recorded
            exc = caught
        case.seconds = time.monotonic() - start
        if exc is not None:
            case.error = one_line(exc)
        try:
            case.outcome = case.op.verify(case.root, case.state, result, exc)
        except Exception as caught:  # noqa: BLE001
            case.outcome = f"verify failed: {one_line(caught)}"
        case.done.set()

    threads = [threading.Thread(target=run, args=(case,), daemon=True) for case in cases]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + CASE_TIMEOUT_S
    for case in cases:
        case.done.wait(max(0.0, deadline - time.monotonic()))
    return cases


def table(cases: list[Case]) -> str:
    return "\n".join(f"{c.op.name:28} {c.fault:16} {c.outcome:8.60} hits={c.rule.hits if c.rule else 0} "
                     f"{c.seconds:5.1f}s {c.error}" for c in cases)


def test_explore(proxied: tuple[Any, FaultProxy]) -> None:
    servers, proxy = proxied
    cases = run_cases(servers, proxy, OPS, list(FAULTS))
    print("\n" + table(cases))
