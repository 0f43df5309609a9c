"""The object stores behind bucket URLs: one fsspec filesystem per scheme, set up from the ecosystem's own settings.

- ``gs://``: gcsfs (the JSON API) with application default credentials; ``STORAGE_EMULATOR_HOST`` points it at an
  emulator, anonymously. Retries with exponential backoff on 429, 5xx and dropped connections are gcsfs's own
  (``retry_request``, 6 attempts: about 35 s before it gives up on a server that refuses connections); a socket
  that connects or reads nothing for ``REQUEST_TIMEOUT_S`` is cut and retried the same way (a timeout on the
  whole request would neither be retried by gcsfs nor let a large download take its time).
- ``s3://``: s3fs on botocore with botocore's own settings: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for an
  S3-compatible provider (Yandex Object Storage, Cloud.ru, Selectel, VK Cloud, MinIO...), the region
  (``AWS_REGION`` / ``AWS_DEFAULT_REGION``, or the profile), path-style addressing from the profile
  (``s3 = addressing_style = path`` in ``~/.aws/config``, ``AWS_CONFIG_FILE``) or ``AWS_S3_ADDRESSING_STYLE``, and
  the usual credential chain. botocore retries throttling, 5xx and connection errors (``standard`` mode,
  ``S3_MAX_ATTEMPTS`` attempts), s3fs ``S3FS_RETRIES`` times more, a 429 without S3's throttling code too (a
  provider's gateway answers so).

What each backend does when a server fails for a while, measured against a fault-injecting proxy, is in
tests/test_storage_faults.py; a conditional write whose answer was lost is told from another writer's by
``experiment.storage.retry``.

Listing caches are off: every host sees what the others wrote a moment ago. The operations the run folder's
guarantees rest on, beyond reading and writing whole objects, are here per backend: creating an object only if
none exists (GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``), replacing or deleting it only if it is still
the version read (GCS generation, S3 ETag), and the storage's own clock (an object's update time).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from experiment.errors import ConfigError
from experiment.storage.urls import ObjectUrl

REQUEST_TIMEOUT_S = 60.0  # connecting, or waiting for the next bytes of an answer; then the request is retried
S3_READ_TIMEOUT_S = 30.0  # botocore's socket read timeout: a hung S3 server costs attempts x this
S3_MAX_ATTEMPTS = 6  # botocore's attempts per S3 request (first try included)
S3FS_RETRIES = 4  # s3fs's own tries around botocore's (a dropped read, a throttled answer botocore does not retry)
GCS_EMULATOR = "STORAGE_EMULATOR_HOST"


class PreconditionFailed(FileExistsError):
    """The object is not the version the caller read: another process wrote or removed it meanwhile."""


@dataclass(frozen=True)
class ObjectStat:
    """What a bucket says of one object, without reading it."""

    size: int
    generation: str  # GCS generation, S3 ETag: changes with every write of the object
    updated: float  # Unix time of the last write, by the storage's clock
    checksum: str | None = None  # the storage's own checksum of the data: GCS crc32c, S3 ETag


_lock = threading.Lock()
_filesystems: dict[tuple[str, int], Any] = {}


def filesystem(scheme: str) -> Any:
    """The process's fsspec filesystem for ``scheme`` (made on first use; a forked child makes its own)."""
    key = (scheme, os.getpid())
    with _lock:
        if key not in _filesystems:
            _filesystems[key] = _make(scheme)
        return _filesystems[key]


def _make(scheme: str) -> Any:
    if scheme == "gs":
        return _make_gcs()
    if scheme == "s3":
        return _make_s3()
    raise ValueError(f"no backend for {scheme}://")


def _make_gcs() -> Any:
    try:
        # gcsfs's core class: the package's default (ExtendedGcsFileSystem) first asks the storage control
        # API for the bucket's type over gRPC, which an emulator does not serve (60 s per bucket here)
        from gcsfs.core import GCSFileSystem
    except ImportError as exc:  # pragma: no cover - a base dependency
        raise ConfigError(f"gs:// paths need gcsfs ({exc}): pip install gcsfs") from exc
    import aiohttp

    emulator = os.environ.get(GCS_EMULATOR, "")
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_TIMEOUT_S, sock_read=REQUEST_TIMEOUT_S)
    return GCSFileSystem(token="anon" if emulator else None, use_listings_cache=False, skip_instance_cache=True,
                         requests_timeout=timeout)


def _make_s3() -> Any:
    try:
        import s3fs
    except ImportError as exc:  # pragma: no cover - a base dependency
        raise ConfigError(f"s3:// paths need s3fs ({exc}): pip install s3fs") from exc
    config: dict[str, Any] = {"retries": {"max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
                              "connect_timeout": REQUEST_TIMEOUT_S, "read_timeout": S3_READ_TIMEOUT_S}
    style = os.environ.get("AWS_S3_ADDRESSING_STYLE", "").strip()
    if style:
        if style not in ("path", "virtual", "auto"):
            raise ConfigError(f"AWS_S3_ADDRESSING_STYLE={style!r} is not path, virtual or auto")
        config["s3"] = {"addressing_style": style}
    client: dict[str, Any] = {}
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        client["region_name"] = region
    # botocore retries a 429 only with a throttling error code; a gateway's bare "429 Too Many Requests" is
    # throttling too (s3fs's hook is process-wide: set when the first S3 filesystem is made, never at import)
    s3fs.core.set_custom_error_handler(_retry_bare_429)
    fs = s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, config_kwargs=config,
                           client_kwargs=client)
    fs.retries = S3FS_RETRIES  # a class attribute of s3fs (5), not a constructor argument
    return fs


def _retry_bare_429(exc: BaseException) -> bool:
    response = getattr(exc, "response", None) or {}
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 429 or "(429)" in str(exc)


def endpoint(scheme: str) -> str | None:
    """The endpoint a scheme talks to when it is not the cloud's own (an emulator, an S3-compatible provider)."""
    if scheme == "gs":
        return os.environ.get(GCS_EMULATOR) or None
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _timestamp(value: Any) -> float:
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def stat_of(scheme: str, info: dict[str, Any]) -> ObjectStat:
    """An fsspec ``info()`` (or listing entry) of an object as an ObjectStat."""
    if scheme == "gs":
        return ObjectStat(int(info["size"]), str(info["generation"]), _timestamp(info["updated"]), info.get("crc32c"))
    etag = str(info.get("ETag") or info.get("etag") or "")
    return ObjectStat(int(info["size"]), etag, _timestamp(info["LastModified"]), etag or None)


def stat(url: ObjectUrl) -> ObjectStat | None:
    """The object's stat, or None where there is no object (a prefix with objects under it is no object)."""
    fs = filesystem(url.scheme)
    try:
        info = fs.info(url.fs_path)
    except FileNotFoundError:
        return None
    if info.get("type") != "file":
        return None
    return stat_of(url.scheme, info)


def create(url: ObjectUrl, data: bytes) -> ObjectStat:
    """Write the object only if none exists (FileExistsError otherwise); its stat."""
    fs = filesystem(url.scheme)
    try:
        fs.pipe_file(url.fs_path, data, mode="create")
    except FileExistsError as exc:  # gcsfs names the upload URL: name the object
        raise FileExistsError(str(url)) from exc
    except OSError as exc:
        if _precondition(exc):  # s3fs reports a 412 as EINVAL
            raise FileExistsError(str(url)) from exc
        raise
    found = stat(url)
    if found is None:  # pragma: no cover - a store that lost a write it acknowledged
        raise OSError(f"{url} was written but cannot be found")
    return found


def _precondition(exc: BaseException) -> bool:
    text = str(exc)
    return "412" in text or "PreconditionFailed" in text or "pre-conditions" in text or "Precondition" in text


def replace_if(url: ObjectUrl, data: bytes, generation: str) -> ObjectStat:
    """Overwrite the object only if it is still at ``generation``; PreconditionFailed otherwise."""
    fs = filesystem(url.scheme)
    if url.scheme == "gs":
        from fsspec.asyn import sync

        async def upload() -> dict[str, Any]:
            boundary = "ru-pretrain-object"
            body = ((f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                     f"{json.dumps({'name': url.key})}\r\n--{boundary}\r\n"
                     "Content-Type: application/octet-stream\r\n\r\n").encode()
                    + data + f"\r\n--{boundary}--\r\n".encode())
            _, content = await fs._call("POST", f"{fs._location}/upload/storage/v1/b/{url.bucket}/o",
                                        uploadType="multipart", ifGenerationMatch=generation, data=body,
                                        headers={"Content-Type": f"multipart/related; boundary={boundary}"})
            return json.loads(content)

        try:
            info = sync(fs.loop, upload)
        except FileExistsError as exc:  # gcsfs reports a 412 as FileExistsError
            raise PreconditionFailed(f"{url} changed since it was read") from exc
        except FileNotFoundError as exc:
            raise PreconditionFailed(f"{url} was removed since it was read") from exc
        return stat_of("gs", {**info, "size": int(info.get("size", len(data)))})
    try:
        fs.call_s3("put_object", Bucket=url.bucket, Key=url.key, Body=data, IfMatch=generation)
    except (OSError, ValueError) as exc:
        if _precondition(exc) or isinstance(exc, FileNotFoundError):
            raise PreconditionFailed(f"{url} changed since it was read") from exc
        raise
    found = stat(url)
    if found is None:
        raise PreconditionFailed(f"{url} was removed just after it was written")
    return found


def delete_if(url: ObjectUrl, generation: str) -> bool:
    """Delete the object if it is still at ``generation``; False when it is not (or is gone).

    The object is read first on every backend; GCS then checks the generation again on the server
    (``ifGenerationMatch``). S3's conditional delete is not offered by every S3-compatible provider (nor by
    fake-gcs-server for GCS): there a writer that replaced the object between the read and the delete (after
    this holder's lease lapsed: minutes of silence) would lose its object. Callers delete only what they hold."""
    found = stat(url)
    if found is None or found.generation != generation:
        return False
    fs = filesystem(url.scheme)
    if url.scheme == "gs":
        try:
            fs.call("DELETE", "b/{}/o/{}", url.bucket, url.key, ifGenerationMatch=generation)
        except (FileNotFoundError, FileExistsError):
            return False
        except OSError as exc:
            if _precondition(exc):
                return False
            raise
        return True
    fs.rm_file(url.fs_path)
    return True


# the libraries whose exceptions mean "the storage could not be reached, or kept refusing, after retries"
_STORAGE_PACKAGES = ("aiohttp", "botocore", "aiobotocore", "gcsfs", "s3fs", "fsspec", "google.auth", "urllib3")


def _from_storage(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    if module.split(".")[0] in {p.split(".")[0] for p in _STORAGE_PACKAGES} and not isinstance(
            exc, FileNotFoundError | FileExistsError | IsADirectoryError | NotADirectoryError):
        return True
    if isinstance(exc, TimeoutError | ConnectionError):  # raised by the clients' own retries giving up
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_filename)
            tb = tb.tb_next
        return any(f"/{package.split('.')[0]}/" in frame for frame in frames for package in _STORAGE_PACKAGES)
    return False


def storage_failure_reason(exc: BaseException) -> str | None:
    """What went wrong talking to a bucket, in a few words (None: ``exc`` is not a storage failure): the
    first exception of the chain raised by a storage client."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _from_storage(current):
            text = " ".join(str(current).split())[:300]
            return f"{type(current).__name__}{': ' + text if text else ''}"
        current = current.__cause__ or current.__context__
    return None
