"""What the corpus and shard Beam pipelines share: importing the optional extra with a clear error,
writing data files atomically through Beam's filesystems (local paths, gs://, s3://, hdfs://: whatever
the workers can reach), and reading back the small summary records the workers staged for the driver."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from experiment.errors import ConfigError, DataError
from experiment.files import atomic_open
from experiment.jsonl import parse_jsonl

_WORKER_ERROR = re.compile(r"\b(DataError|ConfigError): (.+)")


def import_beam(config_key: str) -> Any:
    """``apache_beam``, or a one-line error naming the config key that asked for it."""
    try:
        import apache_beam as beam
    except ImportError as exc:
        raise ConfigError(f"config key '{config_key}': 'beam' needs the beam extra "
                          "(pip install 'ru-pretrain[beam]'; it pins protobuf below 7, so use its own venv)") from exc
    return beam


class HashingWriter:
    """A binary file handle that also counts the bytes written and their MD5, W&B's reference digest,
    so a worker that writes a shard also says what W&B would otherwise read the whole file for."""

    def __init__(self, handle: Any) -> None:
        self._handle, self._md5, self.bytes = handle, hashlib.md5(usedforsecurity=False), 0

    def write(self, data: bytes) -> int:
        self._md5.update(data)
        self.bytes += len(data)
        return self._handle.write(data)

    @property
    def md5_b64(self) -> str:
        return base64.b64encode(self._md5.digest()).decode("ascii")


def join_uri(base: str, name: str) -> str:
    """``base/name`` for a local folder or any Beam filesystem URI (``Path`` would fold ``gs://`` to ``gs:/``)."""
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.join(base, name)


@contextlib.contextmanager
def atomic_create(uri: str) -> Iterator[HashingWriter]:
    """Write ``uri`` through Beam's FileSystems under a hidden temporary name beside it, renamed into
    place only when complete (a retried bundle rewrites the same name); on error the temporary is deleted.
    A local path goes through ``atomic_open``: fsynced file and folder, replaced in one rename (Beam's
    local filesystem neither syncs nor replaces, so a crash could leave an empty shard under its name)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    if "://" not in uri:
        with atomic_open(uri, "wb") as local:
            yield HashingWriter(local)
        return
    folder, name = FileSystems.split(uri)
    temporary = FileSystems.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    handle = FileSystems.create(temporary, compression_type=CompressionTypes.UNCOMPRESSED)
    try:
        writer = HashingWriter(handle)
        yield writer
        handle.close()
        if FileSystems.exists(uri):  # object stores do not rename over an existing object
            FileSystems.delete([uri])
        FileSystems.rename([temporary], [uri])
    except BaseException:
        handle.close()
        with contextlib.suppress(Exception):
            FileSystems.delete([temporary])
        raise


def file_reference(uri: str, writer: HashingWriter) -> dict[str, Any]:
    """A written file as W&B's reference entry wants it: name, URI, size and base64 MD5."""
    return {"name": uri.rstrip("/").rsplit("/", 1)[-1], "uri": uri, "size": writer.bytes, "md5": writer.md5_b64}


def recording_opener(references: list[dict[str, Any]]) -> Callable[[str], Any]:
    """``atomic_create`` that appends each finished file's ``file_reference`` to ``references``."""

    @contextlib.contextmanager
    def opener(uri: str) -> Iterator[HashingWriter]:
        with atomic_create(uri) as writer:
            yield writer
        references.append(file_reference(uri, writer))

    return opener


def staging_folder(output: str) -> str:
    """A fresh folder for the workers' summaries beside the output, on the same filesystem as the data."""
    return join_uri(output, f".beam-summaries-{uuid.uuid4().hex}")


def delete_folder(uri: str) -> None:
    """Delete a staging folder's files, then the folder where the filesystem has folders (object stores
    only have the files); summaries already read, a leftover would cost nothing but its few bytes."""
    from apache_beam.io.filesystems import FileSystems

    with contextlib.suppress(Exception):
        files = [m.path for m in FileSystems.match([join_uri(uri, "*")])[0].metadata_list]
        if files:
            FileSystems.delete(files)
    with contextlib.suppress(Exception):
        FileSystems.delete([uri])


def run_staged(beam: Any, options: list[str], output: str, build: Callable[[Any, str], None],
               names: tuple[str, ...]) -> dict[str, list[Any]]:
    """Run a pipeline whose ``build(pipeline, staging)`` stages its summaries as ``<staging>/<name>*``
    text files (a fresh folder beside ``output``, on the workers' filesystem); returns each name's
    JSON rows and deletes the folder."""
    staging = staging_folder(output)
    try:
        run_pipeline(beam, options, lambda pipeline: build(pipeline, staging))
        return {name: read_staged_json(join_uri(staging, f"{name}*")) for name in names}
    finally:
        delete_folder(staging)


def read_staged_json(pattern: str) -> list[Any]:
    """Every JSON line of the files matching ``pattern`` (local or a Beam filesystem such as gs://).

    Only summaries are staged this way (one line per shard, one for the counts): the driver's memory
    and disk stay independent of the corpus size.
    """
    from apache_beam.io.filesystems import FileSystems

    rows: list[Any] = []
    for match in FileSystems.match([pattern])[0].metadata_list:
        with FileSystems.open(match.path) as handle:  # Beam renames a staged file into place once complete
            rows.extend(parse_jsonl(handle.read().decode("utf-8"), match.path, torn_tail="error").values)
    return rows


def run_pipeline(beam: Any, options: list[str], build: Callable[[Any], None]) -> None:
    """Build and run a pipeline; a DataError/ConfigError raised on a worker comes back as that error,
    one line (runners wrap worker exceptions in their own, with the remote traceback as text)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    try:
        with beam.Pipeline(options=PipelineOptions(options or ["--runner=DirectRunner"])) as pipeline:
            build(pipeline)
    except (DataError, ConfigError) as exc:  # in-process runners re-raise it with the step's name appended
        raise type(exc)(_without_step(str(exc))) from exc
    except Exception as exc:
        found = _WORKER_ERROR.search(str(exc))
        if found is None:
            raise
        kind = DataError if found.group(1) == "DataError" else ConfigError
        raise kind(_without_step(found.group(2))) from exc


def _without_step(message: str) -> str:
    return re.sub(r"\s*\[while running .*$", "", message.strip().splitlines()[0]).strip()
