"""An HTTP/1.1 reverse proxy on loopback that injects faults into the traffic between a client and one server.

It sits in front of a storage API server (fake-gcs-server, moto) so that tests can show what a failing server
costs the real clients (gcsfs on aiohttp, s3fs on botocore): retries, or an error, never wrong data. Stdlib only::

    with FaultProxy(servers.gcs_endpoint, flavor="gcs") as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        proxy.fail(503, count=2)                          # the next two requests get a 503
        proxy.fail(429, seconds=1.5, method="GET")        # every GET for 1.5 s gets a 429
        proxy.drop("response", count=1, path=r"/b/bkt/")  # the server acts on it; the client hears nothing
        proxy.cut(count=1, at=0.5)                        # half the response body, then the connection closes
        proxy.stall(5.0, count=1)                         # no answer for 5 s, then the connection closes
        proxy.fail(500, count=1, method="POST", after=2)  # the third POST gets a 500
        proxy.latency = 0.030                             # 30 ms before every request is answered or forwarded
        ...
        proxy.seen, proxy.forwarded, proxy.injected, rule.hits, proxy.log  # counters

Faults are rules, checked in the order they were added; the first active rule whose ``method`` and ``path``
patterns match a request (``re.search`` on the method and on the raw request target, query included) takes
it (after letting ``after`` matching requests through), until ``count`` requests were taken or ``seconds``
have passed (neither: until ``remove``/``clear``). A request no rule takes is forwarded, and the server's
response is relayed byte for byte (head and body as they came, chunked framing included): a successful
response is never altered. One upstream connection is opened per request (the server sees no keep-alive; the
client keeps its connection). ``Expect: 100-continue`` is answered by the proxy itself, which then reads the
whole request body before forwarding it (without that header). Bodies are held whole in memory: sized for
tests, not for gigabytes.

Fault kinds (``FaultProxy.add`` takes them directly):

- ``status``: answer with ``status`` (503, 429, 500...) and an error body in the server's own format
  (``flavor``: "gcs" JSON, "s3" XML with ``code``, or "plain" text); the server never sees the request;
- ``drop`` ``when="head"``: close after reading the request head, body unread; ``"request"``: after reading
  the whole request, never forwarded; ``"response"``: forwarded (the server acted on it), the response
  discarded and the connection closed: the client cannot tell whether its request took effect;
- ``cut``: forwarded; the response head and part of its body (``at``: a fraction of Content-Length or a byte
  count; a response with an empty body is cut inside its head), then the connection closes;
- ``stall``: no answer for ``hold`` seconds (a hung server), then the connection closes unanswered.

``reset=True`` on a drop, cut or stall closes with a TCP RST instead of a FIN.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

_HEAD_LIMIT = 1 << 20
_COPY = 1 << 16
_REASONS = {400: "Bad Request", 408: "Request Timeout", 429: "Too Many Requests", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
_S3_CODES = {429: "SlowDown", 500: "InternalError", 503: "ServiceUnavailable", 504: "GatewayTimeout",
             408: "RequestTimeout"}
_GCS_REASONS = {429: "rateLimitExceeded", 500: "backendError", 503: "backendError"}


@dataclass
class Rule:
    """One fault and the requests it takes; ``hits`` counts the requests it took."""

    kind: str  # status | drop | cut | stall
    status: int = 503
    when: str = "request"  # drop: head | request | response
    at: float = 0.5  # cut: fraction (< 1) of the body, or a byte count (>= 1)
    hold: float = 0.0  # stall: how long to hold the connection
    count: int | None = None
    after: int = 0  # matching requests let through before the rule starts taking them
    until: float | None = None  # time.monotonic() after which the rule is spent
    method: re.Pattern[str] | None = None
    path: re.Pattern[str] | None = None
    code: str | None = None  # s3 flavor: the error Code
    body: bytes | None = None  # replaces the flavor's error body
    headers: dict[str, str] = field(default_factory=dict)  # added to a status answer (Retry-After...)
    reset: bool = False
    hits: int = 0
    passed: int = 0

    def active(self, now: float) -> bool:
        return (self.count is None or self.hits < self.count) and (self.until is None or now < self.until)

    def matches(self, method: str, target: str) -> bool:
        return (self.method is None or bool(self.method.search(method))) and \
            (self.path is None or bool(self.path.search(target)))


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


class _Closed(Exception):
    """The peer closed the connection (between requests: the normal end of a keep-alive connection)."""


def _parse_head(raw: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _head_bytes(first: str, headers: list[tuple[str, str]]) -> bytes:
    return ("\r\n".join([first, *(f"{k}: {v}" for k, v in headers)]) + "\r\n\r\n").encode("latin-1")


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Closed from None
        raise
    except (ConnectionError, asyncio.LimitOverrunError):
        raise _Closed from None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, raw (sizes, chunks, trailers): relayed as it came."""
    out = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        out += line
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            while True:  # trailers, up to the empty line
                trailer = await reader.readuntil(b"\r\n")
                out += trailer
                if trailer == b"\r\n":
                    return bytes(out)
        out += await reader.readexactly(size + 2)


class FaultProxy:
    """A reverse proxy to ``upstream`` (``http://host:port``) on a free loopback port; ``url`` is its address.

    ``flavor`` shapes injected error bodies like the server's own: "gcs" (JSON API errors), "s3" (XML errors)
    or "plain". Counters: ``seen`` (requests read), ``injected`` (faults injected), ``forwarded`` (requests sent
    upstream), ``log`` (one ``(method, target, outcome)`` per request: "forwarded <status>" or the fault)."""

    def __init__(self, upstream: str, *, flavor: str = "plain", latency: float = 0.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream {upstream!r}: an http://host:port URL")
        if flavor not in ("gcs", "s3", "plain"):
            raise ValueError(f"flavor {flavor!r}: gcs, s3 or plain")
        self.upstream = (parts.hostname, parts.port)
        self.flavor = flavor
        self.latency = latency
        self.seen = self.injected = self.forwarded = 0
        self.log: list[tuple[str, str, str]] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    # ------------------------------------------------------------------------------------ control
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, kind: str, *, count: int | None = None, seconds: float | None = None, method: str | None = None,
            path: str | None = None, after: int = 0, **options: Any) -> Rule:
        """A fault rule (see the module's doc): it takes ``count`` matching requests, or every matching request
        for ``seconds``; ``method`` and ``path`` are regular expressions searched in the method and the raw
        request target; ``after`` lets that many matching requests through first; ``options`` are the Rule's
        other fields (status, when, at, hold, code, body, headers, reset)."""
        if kind not in ("status", "drop", "cut", "stall"):
            raise ValueError(f"fault kind {kind!r}")
        if kind == "drop" and options.get("when", "request") not in ("head", "request", "response"):
            raise ValueError(f"drop when={options['when']!r}: head, request or response")
        rule = Rule(kind, count=count, after=after, method=re.compile(method) if method else None,
                    path=re.compile(path) if path else None, **options)
        if seconds is not None:
            rule.until = time.monotonic() + seconds
        with self._lock:
            self._rules.append(rule)
        return rule

    def fail(self, status: int = 503, **kwargs: Any) -> Rule:
        """Answer matching requests with ``status`` (the server never sees them)."""
        return self.add("status", status=status, **kwargs)

    def drop(self, when: str = "request", **kwargs: Any) -> Rule:
        """Close the connection without answering: after the request ``head``, the whole ``request``, or the
        server's ``response`` (the server acted on the request)."""
        return self.add("drop", when=when, **kwargs)

    def cut(self, at: float = 0.5, **kwargs: Any) -> Rule:
        """Relay the response head and part of its body (``at``), then close the connection."""
        return self.add("cut", at=at, **kwargs)

    def stall(self, hold: float, **kwargs: Any) -> Rule:
        """Hold matching requests ``hold`` seconds without answering, then close the connection."""
        return self.add("stall", hold=hold, **kwargs)

    def remove(self, rule: Rule) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        """No more faults (latency stays)."""
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[Rule]:
        with self._lock:
            return list(self._rules)

    def _take(self, method: str, target: str) -> Rule | None:
        now = time.monotonic()
        with self._lock:
            self.seen += 1
            for rule in self._rules:
                if rule.active(now) and rule.matches(method, target):
                    if rule.passed < rule.after:
                        rule.passed += 1
                        continue
                    rule.hits += 1
                    self.injected += 1
                    return rule
        return None

    def _record(self, request: _Request, outcome: str) -> None:
        with self._lock:
            self.log.append((request.method, request.target, outcome))

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> FaultProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, "127.0.0.1", 0, limit=_HEAD_LIMIT))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # pragma: no cover - a loopback bind that fails
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"fault-proxy->{self.upstream[1]}", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            loop.stop()

        with contextlib.suppress(RuntimeError):  # the loop already stopped
            asyncio.run_coroutine_threadsafe(shutdown(), loop)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------ serving
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (_Closed, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; whether the client connection stays open for another."""
        first, headers = _parse_head(await _read_head(reader))
        method, target, version = (first.split(" ", 2) + ["", ""])[:3]
        request = _Request(method, target, version, headers)
        rule = self._take(method, target)
        if rule is not None and rule.kind == "drop" and rule.when == "head":
            self._record(request, "drop head")
            self._close(writer, rule.reset)
            return False
        if (request.header("expect") or "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            request.headers = [(k, v) for k, v in headers if k.lower() != "expect"]
        if (request.header("transfer-encoding") or "").lower().endswith("chunked"):
            request.body = await _read_chunked(reader)
        else:
            request.body = await reader.readexactly(int(request.header("content-length") or 0))
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        keep = (request.header("connection") or "").lower() != "close" and version == "HTTP/1.1"
        if rule is not None and rule.kind == "status":
            self._record(request, f"status {rule.status}")
            await self._answer(writer, request, rule)
            return keep
        if rule is not None and rule.kind == "drop" and rule.when == "request":
            self._record(request, "drop request")
            self._close(writer, rule.reset)
            return False
        if rule is not None and rule.kind == "stall":
            self._record(request, f"stall {rule.hold:g}s")
            await asyncio.sleep(rule.hold)
            self._close(writer, rule.reset)
            return False
        return await self._forward(request, writer, rule, keep)

    async def _answer(self, writer: asyncio.StreamWriter, request: _Request, rule: Rule) -> None:
        status = rule.status
        reason = _REASONS.get(status, "Error")
        if rule.body is not None:
            body, kind = rule.body, "text/plain"
        elif self.flavor == "gcs":
            body = json.dumps({"error": {"code": status, "message": f"injected {status} (fault proxy)",
                                         "errors": [{"reason": _GCS_REASONS.get(status, "backendError"),
                                                     "message": f"injected {status}"}]}}).encode()
            kind = "application/json; charset=UTF-8"
        elif self.flavor == "s3":
            code = rule.code or _S3_CODES.get(status, "InternalError")
            body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>injected {status} '
                    f"(fault proxy)</Message><RequestId>fault-proxy</RequestId></Error>").encode()
            kind = "application/xml"
        else:
            body, kind = f"{status} {reason} (fault proxy)\n".encode(), "text/plain"
        headers = [("Content-Type", kind), ("Content-Length", str(len(body))), *rule.headers.items()]
        if request.method == "HEAD":
            body = b""
        writer.write(_head_bytes(f"HTTP/1.1 {status} {reason}", headers) + body)
        await writer.drain()

    @staticmethod
    def _close(writer: asyncio.StreamWriter, reset: bool) -> None:
        if reset:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    async def _forward(self, request: _Request, writer: asyncio.StreamWriter, rule: Rule | None, keep: bool) -> bool:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream, limit=_HEAD_LIMIT)
        try:
            up_writer.write(_head_bytes(f"{request.method} {request.target} {request.version}", request.headers)
                            + request.body)
            await up_writer.drain()
            while True:
                raw_head = await up_reader.readuntil(b"\r\n\r\n")
                status_line, headers = _parse_head(raw_head)
                status = int(status_line.split(" ", 2)[1])
                if status >= 200 or status == 101:
                    break  # a 1xx interim answer (the proxy answered Expect itself) is not relayed
            with self._lock:
                self.forwarded += 1
            if rule is not None and rule.kind == "drop":
                await self._drain_body(up_reader, request, status, headers)  # the server finished its work
                self._record(request, f"drop response (server said {status})")
                self._close(writer, rule.reset)
                return False
            encoding = (_header(headers, "transfer-encoding") or "").lower()
            length = _header(headers, "content-length")
            no_body = request.method == "HEAD" or status in (204, 304)
            if no_body:
                body = b""
            elif encoding.endswith("chunked"):
                body = await _read_chunked(up_reader)
            elif length is not None:
                body = await up_reader.readexactly(int(length))
            else:
                body = await up_reader.read()  # delimited by the server closing the connection
                keep = False
            if rule is not None and rule.kind == "cut":
                if body:
                    size = int(len(body) * rule.at) if rule.at < 1 else int(rule.at)
                    writer.write(raw_head + body[:max(0, min(size, len(body) - 1))])
                else:
                    writer.write(raw_head[:len(raw_head) // 2])
                self._record(request, f"cut (server said {status})")
                await writer.drain()
                self._close(writer, rule.reset)
                return False
            self._record(request, f"forwarded {status}")
            writer.write(raw_head)
            for offset in range(0, len(body), _COPY):
                writer.write(body[offset:offset + _COPY])
                await writer.drain()
            await writer.drain()
            if (_header(headers, "connection") or "").lower() == "close":
                keep = False
            return keep
        finally:
            up_writer.close()

    @staticmethod
    async def _drain_body(reader: asyncio.StreamReader, request: _Request, status: int,
                          headers: list[tuple[str, str]]) -> None:
        if request.method == "HEAD" or status in (204, 304):
            return
        if (_header(headers, "transfer-encoding") or "").lower().endswith("chunked"):
            await _read_chunked(reader)
        elif _header(headers, "content-length") is not None:
            await reader.readexactly(int(_header(headers, "content-length") or 0))
