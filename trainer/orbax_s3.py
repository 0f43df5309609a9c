"""Orbax 0.12 checkpoints on ``s3://`` (AWS S3 and S3-compatible stores), as Orbax already writes them on ``gs://``.

Orbax 0.12 saves straight to ``gs://bucket/prefix``: TensorStore's ``gcs`` driver writes the arrays, etils.epath
(gcsfs) makes the folders and small files, and each step is committed by writing ``commit_success.txt`` into it
last (``atomicity.CommitFileTemporaryPath``) instead of renaming a temporary folder (a bucket has no rename: it is
a copy of every object, then a delete). For ``s3://`` it does neither: its TensorStore spec builder knows only
``gs://`` and local paths (the public record: marin-community/marin#8120) and folds ``s3://b/k`` to ``s3:/b/k``,
then refuses it as a relative path; and its default commit protocol for anything not ``gs://`` is the rename one.

``enable_s3()`` (idempotent; call it before opening a manager) teaches Orbax 0.12 ``s3://``. It wraps, never
copies, five private functions; each wrapper handles ``s3://`` and hands every other path to the original
unchanged, so local and ``gs://`` checkpoints are written exactly as before:

- ``orbax.checkpoint._src.serialization.tensorstore_utils._normalize_path``: keeps ``s3://`` whole (the original
  runs ``os.path.normpath``, which folds ``//``, and repairs only ``gs:/``);
- ``tensorstore_utils._use_gcs_driver``: true for ``s3://`` too. Both spec builders
  (``_build_ocdbt_kvstore_tspec``, ``_build_non_ocdbt_kvstore_tspec``) read it as "a bucket URL served by a
  TensorStore driver": it skips their absolute-path check and makes them ask ``get_kvstore_for_gcs`` for the
  base kvstore spec;
- ``orbax.checkpoint._src.path.gcs_utils.get_kvstore_for_gcs``: for ``s3://`` returns TensorStore's ``s3``
  kvstore spec (``bucket``, ``path``, ``aws_region``, ``endpoint``) instead of asserting a ``gs`` scheme. The
  OCDBT wrapping, read coalescing and everything else the builders add stay Orbax's own;
- ``orbax.checkpoint._src.path.atomicity_defaults.get_default_temporary_path_class`` and
  ``get_item_default_temporary_path_class``: ``CommitFileTemporaryPath`` for ``s3://`` when the caller chose no
  mode, as the originals do for ``gs://``. The manager's public option (``checkpoint_options_for``) already
  selects it; the default matters to any reader opened without it: with the rename protocol's default, a step
  folder that lacks its commit marker (a save cut off mid-way) would be taken as complete.

Where the S3 side comes from (the settings botocore, s3fs and every AWS SDK read, so Orbax's folder operations
through s3fs and TensorStore's array writes reach the same store):

- endpoint: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL`` (an S3-compatible provider, MinIO, an emulator);
  neither: AWS itself;
- region: ``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else ``us-east-1`` (what S3-compatible providers accept
  when they have one region);
- credentials: the ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``) variables when
  they are set, else TensorStore's default AWS chain (the shared credentials file and profile, then the instance
  metadata): the order botocore follows for s3fs.

The endpoint and region are read when a spec is built (each save and restore), so a change of environment
between managers is honoured. The patch is checked against the Orbax version: any release outside 0.12.x is
refused with an error naming the version, because the wrapped functions are private and may change shape.
Several processes writing one step (multi-host saves) are not covered here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import posixpath
import re
import threading
from collections.abc import Callable
from typing import Any

SUPPORTED_ORBAX = (0, 12)  # the minor release whose private functions are wrapped below
DEFAULT_REGION = "us-east-1"
BUCKET_SCHEMES = ("gs://", "s3://")
_S3 = re.compile(r"^s3:/+")  # ``s3://`` and the ``s3:/`` that os.path.normpath folds it to
_WRAPPED = "__orbax_s3_original__"  # set on each wrapper: the function it wraps (also marks it as installed)
_lock = threading.Lock()


class OrbaxVersionError(RuntimeError):
    """The installed Orbax is not the release whose private functions ``enable_s3`` knows."""


def orbax_version() -> str:
    return importlib.metadata.version("orbax-checkpoint")


def check_orbax_version(version: str | None = None) -> None:
    """Raise OrbaxVersionError unless ``version`` (default: the installed one) is 0.12.x."""
    version = version or orbax_version()
    parts = re.match(r"^(\d+)\.(\d+)", version)
    if parts is None or (int(parts[1]), int(parts[2])) != SUPPORTED_ORBAX:
        wanted = ".".join(map(str, SUPPORTED_ORBAX))
        raise OrbaxVersionError(
            f"trainer.orbax_s3 wraps private functions of orbax-checkpoint {wanted}.x; this is {version}: check "
            f"that Orbax still lacks s3:// (marin-community/marin#8120) and that the wrapped functions keep their "
            f"signatures, then update SUPPORTED_ORBAX, or pin orbax-checkpoint=={wanted}.*")


def is_s3(path: object) -> bool:
    """Whether ``path`` (a str, an epath.Path or any object whose str is a URL) names an ``s3://`` location."""
    return _S3.match(_as_text(path)) is not None


def _as_text(path: object) -> str:
    # epath.Path and BucketPath both print as their URL; an os.PathLike's fspath is the same text
    return path.as_posix() if hasattr(path, "as_posix") else str(path)


def normalize_s3(path: str) -> str:
    """``s3://bucket/key`` with ``.``, ``..``, doubled and trailing slashes resolved inside the key, as
    ``os.path.normpath`` does for a local path, keeping the ``//`` after the scheme."""
    rest = _S3.sub("", path, count=1)
    return "s3://" + posixpath.normpath(rest).lstrip("/")


def s3_endpoint() -> str | None:
    """The S3 endpoint of the environment (an S3-compatible provider), or None for AWS itself."""
    value = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return value.rstrip("/") if value else None


def s3_region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def s3_kvstore_spec(path: str) -> dict[str, Any]:
    """TensorStore's ``s3`` kvstore spec for ``s3://bucket/key``: key without a trailing slash, as Orbax's
    ``get_kvstore_for_gcs`` gives it for ``gs://``, so both stores get the same object layout."""
    bucket, _, key = normalize_s3(path).removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"an s3:// checkpoint path needs a bucket name: {path!r}")
    spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": key, "aws_region": s3_region()}
    endpoint = s3_endpoint()
    if endpoint:
        spec["endpoint"] = endpoint
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        # the first link of the default chain, named: the default chain would also try the profile files on
        # every open and log an error line for each file that is missing
        spec["aws_credentials"] = {"type": "environment"}
    return spec


def _modules() -> tuple[Any, Any, Any, Any]:
    prefix = "orbax.checkpoint._src."
    return tuple(importlib.import_module(prefix + name) for name in  # type: ignore[return-value]
                 ("serialization.tensorstore_utils", "path.gcs_utils", "path.atomicity_defaults", "path.atomicity"))


def _wrap(module: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(module, name, None)
    if original is None:
        raise OrbaxVersionError(f"{module.__name__}.{name} is gone in orbax-checkpoint {orbax_version()}: "
                                "trainer.orbax_s3 needs updating")
    if getattr(original, _WRAPPED, None) is not None:
        return  # installed already (idempotent across calls and across reloads of this module)
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _WRAPPED, original)
    setattr(module, name, wrapper)


def enable_s3() -> None:
    """Teach this process's Orbax 0.12 ``s3://`` checkpoint directories (see the module docstring); idempotent,
    thread-safe. OrbaxVersionError for another Orbax release."""
    check_orbax_version()
    ts_utils, gcs_utils, atomicity_defaults, atomicity = _modules()
    with _lock:
        _wrap(ts_utils, "_normalize_path",
              lambda original: lambda path: normalize_s3(path) if is_s3(path) else original(path))
        _wrap(ts_utils, "_use_gcs_driver",
              lambda original: lambda directory: is_s3(directory) or original(directory))
        _wrap(gcs_utils, "get_kvstore_for_gcs",
              lambda original: lambda ckpt_path: s3_kvstore_spec(ckpt_path) if is_s3(ckpt_path)
              else original(ckpt_path))

        def commit_file_on_s3(original: Callable[..., Any]) -> Callable[..., Any]:
            def default_class(path: Any, *, atomicity_options: Any = None) -> Any:
                mode = getattr(atomicity_options, "mode", None)
                if is_s3(path) and (mode is None or mode.value == "auto"):
                    return atomicity.CommitFileTemporaryPath
                return original(path, atomicity_options=atomicity_options)
            return default_class

        _wrap(atomicity_defaults, "get_default_temporary_path_class", commit_file_on_s3)
        _wrap(atomicity_defaults, "get_item_default_temporary_path_class", commit_file_on_s3)
        fresh_listings("s3")


def fresh_listings(scheme: str) -> None:
    """Make etils.epath list ``scheme``'s buckets afresh on every call, in this process (``"s3"`` or ``"gs"``).

    Orbax lists step folders and checks commit markers through etils.epath, which keeps one fsspec filesystem
    per scheme (s3fs, gcsfs). fsspec caches directory listings by default and forgets them only on that
    instance's own writes, so a manager in a long-lived process (eval beside a training run, ``reload()``) would
    never see a step another process committed, nor a marker another process removed (measured: ``reload()``
    still gave ``[1]`` after another process committed step 2, on both servers). This turns the cache off
    through ``fsspec.config.conf`` (fsspec's public defaults) for the filesystems made later, and for those
    fsspec already keeps in its instance cache (etils's among them). Every fsspec user of the scheme in this
    process then lists afresh: a request more per check, against folders that hold a few steps."""
    import fsspec
    import fsspec.config

    protocol = "gcs" if scheme == "gs" else scheme
    fsspec.config.conf.setdefault(protocol, {})["use_listings_cache"] = False  # instances made from now on
    try:
        kind = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):  # no s3fs / gcsfs: nothing of that scheme is listed in this process
        return
    # instances made already, the one etils holds among them; none is made here (making a gcsfs one looks for
    # Google credentials, seconds where there are none)
    for filesystem in list(getattr(kind, "_cache", {}).values()):
        cache = getattr(filesystem, "dircache", None)
        if cache is not None and cache.use_listings_cache:
            cache.use_listings_cache = False
            cache.clear()


def s3_enabled() -> bool:
    """Whether ``enable_s3`` has run in this process (all its wrappers are in place)."""
    ts_utils, gcs_utils, atomicity_defaults, _ = _modules()
    functions = (ts_utils._normalize_path, ts_utils._use_gcs_driver, gcs_utils.get_kvstore_for_gcs,
                 atomicity_defaults.get_default_temporary_path_class,
                 atomicity_defaults.get_item_default_temporary_path_class)
    return all(getattr(function, _WRAPPED, None) is not None for function in functions)


def is_bucket_directory(directory: object) -> bool:
    return _as_text(directory).startswith(BUCKET_SCHEMES) or is_s3(directory)


def checkpoint_options_for(directory: object) -> dict[str, Any]:
    """Keyword arguments for ``ocp.CheckpointManagerOptions`` that a checkpoint folder at ``directory`` needs.

    For a bucket (``gs://``, ``s3://``): the commit-file protocol, chosen through Orbax's public option
    (``atomicity_options=AtomicityOptions(mode=COMMIT_FILE)``, the successor of the deprecated
    ``temporary_path_class=CommitFileTemporaryPath``): a step is written in place and is complete once its
    ``commit_success.txt`` exists; a rename would be a copy and a delete of every object, not atomic. For
    ``s3://`` it also calls ``enable_s3()``, for ``gs://`` ``fresh_listings("gs")``: a manager sees the steps
    other processes commit. A local folder needs nothing: ``{}`` keeps Orbax's rename protocol.
    """
    if not is_bucket_directory(directory):
        return {}
    if is_s3(directory):
        enable_s3()
    else:
        fresh_listings("gs")
    import orbax.checkpoint as ocp

    return {"atomicity_options": ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)}
