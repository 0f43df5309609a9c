"""Bucket URLs: ``gs://bucket/prefix`` and ``s3://bucket/prefix``, told apart from local paths and checked.

A string that starts with a scheme the project writes to (``gs://``, ``s3://``) is a bucket location;
anything else is a local path, as before. A string that looks like a URL of another kind, or a bucket
URL written wrongly (``s3:/bucket``, ``gs:bucket``, ``S3://...``, an empty bucket or a ``..`` in the key)
is one error naming the key it came from: pathlib would otherwise fold it into a local folder named
``s3:`` and the run would write there without a word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from experiment.errors import ConfigError

SCHEMES = ("gs", "s3")
_ANY_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(/*)(.*)$", re.S)
# the bucket names both clouds accept (GCS also takes "_", and dots up to 222 characters: kept simple here)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


@dataclass(frozen=True)
class ObjectUrl:
    """A location in a bucket: ``scheme://bucket/key`` (``key`` without leading or trailing slash)."""

    scheme: str
    bucket: str
    key: str = ""

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}" if self.key else f"{self.scheme}://{self.bucket}"

    @property
    def fs_path(self) -> str:
        """The ``bucket/key`` form fsspec's filesystems take."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    def child(self, *names: str) -> ObjectUrl:
        parts = [p for name in names for p in str(name).split("/") if p]
        return ObjectUrl(self.scheme, self.bucket, "/".join([self.key, *parts] if self.key else parts))


def is_bucket_url(text: object) -> bool:
    return isinstance(text, str) and text.startswith(tuple(f"{s}://" for s in SCHEMES))


def looks_like_url(text: str) -> bool:
    """A scheme before a colon (``x://``, ``s3:/x``, ``gs:x``), not a Windows drive letter (``C:\\``)."""
    match = _ANY_URL.match(text)
    return bool(match) and len(match.group(1)) > 1


def parse_url(text: str, key: str = "") -> ObjectUrl:
    """``text`` as a bucket URL; ConfigError naming ``key`` (the config key or file it came from) if it is
    not a well-formed ``gs://`` or ``s3://`` URL."""
    where = f"config key '{key}': " if key and "." in key and "/" not in key else (f"{key}: " if key else "")
    match = _ANY_URL.match(text)
    if not match:
        raise ConfigError(f"{where}{text!r} is not a bucket URL (gs://bucket/prefix or s3://bucket/prefix)")
    scheme, slashes, rest = match.groups()
    if scheme.lower() in SCHEMES and (scheme != scheme.lower() or slashes != "//"):
        raise ConfigError(f"{where}{text!r} is not a well-formed bucket URL: did you mean "
                          f"{scheme.lower()}://{rest.lstrip('/')}?")
    if scheme not in SCHEMES:
        raise ConfigError(f"{where}{text!r}: the scheme '{scheme}:' is not one this project reads or writes "
                          "(gs:// for Google Cloud Storage, s3:// for S3-compatible storage, or a local path)")
    bucket, _, path = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise ConfigError(f"{where}{text!r}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, "
                          "'-', '_' or '.', starting and ending with a letter or digit)")
    parts = path.split("/")
    while parts and parts[-1] == "":
        parts.pop()  # a trailing slash names the same prefix
    if any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise ConfigError(f"{where}{text!r}: the object path has an empty, '.' or '..' part")
    return ObjectUrl(scheme, bucket, "/".join(parts))


def check_location(text: str, key: str) -> None:
    """Refuse a string that is meant as a location but is neither a local path nor a good bucket URL."""
    if is_bucket_url(text) or looks_like_url(text):
        parse_url(text, key)


def check_any_url(text: str, key: str) -> None:
    """For keys Beam's filesystems read too (``hdfs://``, a test scheme): refuse only a malformed gs:// or s3:// URL
    (``s3:/b``, ``gs:b``, ``S3://b``, a bad bucket name); any other scheme is Beam's to judge."""
    match = _ANY_URL.match(text)
    if match and match.group(1).lower() in SCHEMES:
        parse_url(text, key)
