"""W&B artifacts for the files a stage writes: lineage from corpus to report, offline too."""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from experiment.storage import BucketPath, RunPath

log = logging.getLogger("tracking")


def artifact_name(text: str) -> str:
    """W&B artifact names allow letters, digits, dashes, underscores and dots."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "artifact"


def log_files(run: Any, name: str, artifact_type: str, paths: Iterable[RunPath],
              metadata: dict[str, Any] | None = None, aliases: list[str] | None = None,
              root: RunPath | None = None) -> Any:
    """Log ``paths`` (files, by their base names, or by their paths under ``root`` when given) as one
    artifact of ``run``; returns the artifact, or None for a disabled run. Files in a bucket are copied
    through a local temporary file (W&B copies what it logs into its own folder)."""
    if run is None or getattr(run, "disabled", False):
        return None
    import wandb

    artifact = wandb.Artifact(artifact_name(name), type=artifact_type, metadata=metadata or {})
    with tempfile.TemporaryDirectory(prefix="ru-pretrain-artifact-") as staging:
        for index, path in enumerate(paths):
            name = path.relative_to(root).as_posix() if root is not None else path.name  # type: ignore[arg-type]
            if isinstance(path, BucketPath):
                local = Path(staging) / f"{index}-{path.name}"
                local.write_bytes(path.read_bytes())
                artifact.add_file(str(local), name=name)
            else:
                artifact.add_file(str(path), name=name)
    run.log_artifact(artifact, aliases=aliases)
    return artifact


def log_reference(run: Any, name: str, artifact_type: str, folder: str | RunPath,
                  metadata: dict[str, Any] | None = None, files: list[dict[str, Any]] | None = None) -> Any:
    """Log a large output folder (a corpus, shards) as an artifact of ``run`` by reference: a ``file://``
    URI per file with its size and checksum (W&B's MD5, which reads each file once), never a copy, so the
    bytes stay where the stage wrote them and W&B (offline too) keeps no second copy on disk. On a bucket
    the same call takes ``gs://``/``s3://`` folders, whose checksums are the stores' own.

    ``files``: data files already measured where they were written (Beam workers), as
    ``{"name", "uri", "size", "md5"}`` (MD5 in W&B's base64): local ones entered as they are, nothing read
    here; bucket ones referenced through W&B's handler (object metadata only, never the bytes);
    the folder's other files (its manifest and report) are referenced and checksummed as usual.
    Returns the artifact, or None for a disabled run."""
    if run is None or getattr(run, "disabled", False):
        return None
    try:
        if files is None:
            artifact = _reference_artifact(name, artifact_type, folder, metadata, checksum=True)
        else:
            artifact = _measured_reference_artifact(name, artifact_type, Path(folder), metadata, files)
    except Exception as exc:
        # W&B's bucket handlers need their own clients and credentials: lineage is no reason to fail
        if not isinstance(folder, BucketPath) and "://" not in str(folder):
            raise
        log.warning("W&B could not reference %s (%s: %s): the %s artifact is not logged", folder, type(exc).__name__,
                    str(exc).splitlines()[0][:200] if str(exc) else "", artifact_type)
        return None
    run.log_artifact(artifact)
    return artifact


def _measured_reference_artifact(name: str, artifact_type: str, folder: Path, metadata: dict[str, Any] | None,
                                 files: list[dict[str, Any]]) -> Any:
    import wandb
    from wandb.sdk.artifacts.artifact_manifest_entry import ArtifactManifestEntry

    artifact = wandb.Artifact(artifact_name(name), type=artifact_type, metadata=metadata or {})
    measured = {entry["name"] for entry in files}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name not in measured and not path.name.startswith("."):
            artifact.add_reference(path.resolve().as_uri(), name=path.name, checksum=True)
    writer_md5: dict[str, str] = {}
    for entry in files:
        if "://" in entry["uri"]:
            # a bucket: W&B's handler takes the store's own digest (an ETag, which is not always the MD5) from the
            # object's metadata and checks it on download; the workers' MD5s go into the metadata instead
            artifact.add_reference(entry["uri"], name=entry["name"], checksum=True)
            writer_md5[entry["name"]] = entry["md5"]
            continue
        # a local file: the entry W&B's own file handler makes, with the digest the writer computed
        artifact.manifest.add_entry(ArtifactManifestEntry(path=entry["name"], ref=Path(entry["uri"]).resolve().as_uri(),
                                                          digest=entry["md5"], size=entry["size"]))
    if writer_md5:
        artifact.metadata = {**artifact.metadata, "writer_md5": writer_md5}
    return artifact


def _reference_artifact(name: str, artifact_type: str, folder: str | RunPath, metadata: dict[str, Any] | None,
                        checksum: bool) -> Any:
    import wandb

    artifact = wandb.Artifact(artifact_name(name), type=artifact_type, metadata=metadata or {})
    uri = folder if "://" in str(folder) else Path(folder).resolve().as_uri()
    artifact.add_reference(str(uri), checksum=checksum)
    return artifact


def use_reference(run: Any, name: str, artifact_type: str, folder: str | RunPath,
                  metadata: dict[str, Any] | None = None) -> Any:
    """Record ``folder`` (e.g. a base model the run starts from) as an input artifact of ``run``, by
    reference: nothing is uploaded or hashed again (put the files' hashes in ``metadata``). W&B cannot
    mark inputs offline: an offline run logs the reference as its own artifact. Returns the artifact,
    or None for a disabled run."""
    if run is None or getattr(run, "disabled", False):
        return None
    artifact = _reference_artifact(name, artifact_type, folder, metadata, checksum=False)
    if getattr(run, "offline", False):
        run.log_artifact(artifact)
    else:
        run.use_artifact(artifact)
    return artifact


def add_folder(artifact: Any, folder: RunPath) -> None:
    """``artifact.add_dir`` for a local folder or a bucket prefix (copied through a local temporary folder:
    W&B copies what it adds into its own staging folder at once)."""
    if not isinstance(folder, BucketPath):
        artifact.add_dir(str(folder))
        return
    with tempfile.TemporaryDirectory(prefix="ru-pretrain-artifact-") as staging:
        for name in folder.list_objects():
            local = Path(staging) / name
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes((folder / name).read_bytes())
        artifact.add_dir(staging)


def add_files(artifact: Any, paths: Iterable[RunPath]) -> None:
    """``artifact.add_file`` of each of ``paths`` by its base name, local or in a bucket."""
    with tempfile.TemporaryDirectory(prefix="ru-pretrain-artifact-") as staging:
        for index, path in enumerate(paths):
            if isinstance(path, BucketPath):
                local = Path(staging) / f"{index}-{path.name}"
                local.write_bytes(path.read_bytes())
                artifact.add_file(str(local), name=path.name)
            else:
                artifact.add_file(str(path), name=path.name)
