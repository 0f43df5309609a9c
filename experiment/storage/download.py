"""A bucket folder as a local one, for the libraries that only open local files (a Hugging Face model folder
read by safetensors and transformers, a tokenizer folder to adopt).

The copy lives under the host's local root (``experiment.runfolder.host_local_root``), one folder per bucket
prefix. Each object is downloaded to a temporary name and renamed into place only when its size matches the
listing, and a record beside the copy names every object's size and generation: a second call downloads only
what changed in the bucket since, and an interrupted download is never taken for a complete one.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from experiment.errors import DataError
from experiment.jsontext import parse_json
from experiment.storage.path import BucketPath

log = logging.getLogger("experiment.storage")
COPY_RECORD = ".ru-pretrain-copy.json"  # in a local copy: {name: "size-generation"} of the objects it holds


def local_copy(folder: BucketPath | Path, what: str, root: Path) -> Path:
    """``folder`` itself when it is local; a bucket prefix copied under ``root`` (only the objects that changed
    since the last copy are downloaded). DataError naming ``what`` when the prefix holds nothing."""
    if isinstance(folder, Path):
        return folder
    objects = folder.list_objects()
    if not objects:
        raise DataError(f"{what}: {folder} holds no files")
    target = root / folder.scheme / folder.bucket / folder.key
    target.mkdir(parents=True, exist_ok=True)
    record_path = target / COPY_RECORD
    try:
        record = parse_json(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    wanted = {name: f"{found.size}-{found.generation}" for name, found in objects.items()}
    fetched = 0
    for name, version in sorted(wanted.items()):
        local = target / name
        if record.get(name) == version and local.is_file() and local.stat().st_size == objects[name].size:
            continue
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(f".{local.name}.{os.getpid()}.part")
        folder.fs.get_file((folder / name).fs_path, str(partial))
        if partial.stat().st_size != objects[name].size:
            partial.unlink(missing_ok=True)
            raise DataError(f"{what}: {folder / name} changed while it was copied: run again")
        os.replace(partial, local)
        fetched += 1
    for stale in set(record) - set(wanted):
        (target / stale).unlink(missing_ok=True)
    partial = record_path.with_name(f".{record_path.name}.{os.getpid()}.part")
    partial.write_text(json.dumps(wanted, indent=1), encoding="utf-8")
    os.replace(partial, record_path)  # the record names only what is in place
    log.info("%s: %s copied to %s (%d of %d files fetched)", what, folder, target, fetched, len(wanted))
    return target
