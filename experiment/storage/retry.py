"""Conditional writes to a bucket that survive a lost answer.

A client that sends a conditional write (create only if absent, replace only if still at a generation) and
loses the answer (the connection drops after the server acted, a response is cut, a proxy times out) retries
it, as gcsfs and botocore do by themselves. The server already acted on the first try, so the retry fails its
precondition: the client reports "the object exists" / "the object changed" for an object that holds its own
write. For an exclusive create that means FileExistsError, "somebody else holds it", for a lock this process
holds, or a log segment this process wrote (tests/test_storage_faults.py shows it on both backends).

The functions here are the backends' conditional writes plus one check: on a failed precondition they read the
object back, and when it holds exactly the bytes this call wrote (at one generation, read twice), the write
was this call's own and they return as if the answer had arrived. That is right only when no other writer
can write the same bytes: callers put something unique to this attempt in ``data`` (a lock holder's
host, pid and random token; ``unique_token()``). Any other failed precondition is raised as before.
"""

from __future__ import annotations

import uuid

from experiment.storage import RunPath, backends, create_exclusive
from experiment.storage.backends import ObjectStat, PreconditionFailed
from experiment.storage.path import BucketPath
from experiment.storage.urls import ObjectUrl

__all__ = ["create_checked", "create_exclusive_checked", "replace_if_checked", "unique_token"]


def unique_token() -> str:
    """Something no other writer writes: put it in ``data`` for the functions here to tell their own writes."""
    return uuid.uuid4().hex


def own_write(url: ObjectUrl, data: bytes) -> ObjectStat | None:
    """The object's stat if it holds exactly ``data`` (the same generation before and after the read), else
    None (another writer's bytes, no object, or an object changing meanwhile)."""
    before = backends.stat(url)
    if before is None or before.size != len(data):
        return None
    try:
        found = BucketPath(url).read_bytes()
    except FileNotFoundError:
        return None
    after = backends.stat(url)
    if found != data or after is None or after.generation != before.generation:
        return None
    return before


def create_checked(url: ObjectUrl, data: bytes) -> ObjectStat:
    """``backends.create``: write the object only if none exists, its stat; FileExistsError only when the object
    that exists is not this call's own write (``data`` must be unique to this caller)."""
    try:
        return backends.create(url, data)
    except FileExistsError:
        mine = own_write(url, data)
        if mine is None:
            raise
        return mine


def create_exclusive_checked(path: RunPath, data: bytes) -> None:
    """``experiment.storage.create_exclusive`` (a local file or an object), where a lost answer on a bucket
    is no FileExistsError (see ``create_checked``)."""
    if isinstance(path, BucketPath):
        create_checked(path.url, data)
        return
    create_exclusive(path, data)  # a local create loses no answer


def replace_if_checked(url: ObjectUrl, data: bytes, generation: str) -> ObjectStat:
    """``backends.replace_if``: overwrite the object only if it is still at ``generation``, its new stat;
    PreconditionFailed only when the object is not this call's own write (``data`` must be unique to it)."""
    try:
        return backends.replace_if(url, data, generation)
    except PreconditionFailed:
        mine = own_write(url, data)
        if mine is None or mine.generation == generation:
            raise
        return mine
