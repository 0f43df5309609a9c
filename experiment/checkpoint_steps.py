"""Which steps of a checkpoint folder are finished: the one answer the trainer and every reader above it share.

Orbax writes a step on a disk into a ``<step>.orbax-checkpoint-tmp-*`` folder it renames to ``<step>`` once
complete; in a bucket, where a rename is a copy of every object, it writes ``<step>/`` in place and commits it
by writing ``commit_success.txt`` last (orbax.checkpoint's temporary_paths: a bucket step without it is not
finalized). The trainer (``trainer.checkpoint_integrity``) then writes ``<step>/checksums.json`` and marks the
folder ``.checksummed``. A step is finished when Orbax committed it and, in a folder whose steps carry checksums,
its checksums were written: a kill mid-save leaves neither, a kill between the commit and the checksums leaves
no checksums. Resume, branches and stages, and an anneal comparison's check of its parent (``tracking.sweep``,
which may not import the trainer) all read ``finished_steps``; the Orbax side stays in ``trainer``.
"""

from __future__ import annotations

from experiment.storage import BucketPath, RunPath

CHECKSUMS = "checksums.json"
COMMIT_MARKER = "commit_success.txt"  # Orbax's last object of a step it commits in place (a bucket)
CHECKSUMMED = ".checksummed"  # in a checkpoint folder: its steps carry checksums (written by this version)


def committed(step_dir: RunPath) -> bool:
    """Whether Orbax finished the step: its renamed folder exists (a disk), or its commit marker (a bucket)."""
    if isinstance(step_dir, BucketPath):
        return (step_dir / COMMIT_MARKER).is_file()
    return step_dir.is_dir()


def uses_checksums(directory: RunPath) -> bool:
    """Whether the steps of ``directory`` must have checksums: it says so, or one of them has them.

    A folder of an older version (steps, no marker, no checksums) is read unverified, so that an
    upgrade does not lose a run; a fresh folder gets the marker before its first save, so a step
    that lost its checksums there (a kill between Orbax's commit and the checksum write) is damaged."""
    if (directory / CHECKSUMMED).exists():
        return True
    return directory.is_dir() and any((p / CHECKSUMS).is_file() for p in directory.iterdir() if p.name.isdigit())


def finished_steps(checkpoint_dir: RunPath) -> list[int]:
    """Steps Orbax committed and whose checksums are written (an interrupted save stays a
    ``*.orbax-checkpoint-tmp*`` folder, or in a bucket a step without Orbax's commit marker, which gets no
    checksums; a step without checksums is not resumed from), or every committed step of a folder an older
    version wrote (``uses_checksums``)."""
    if isinstance(checkpoint_dir, BucketPath):  # one listing, not a request per step
        names = checkpoint_dir.list_objects()

        def steps_holding(file: str) -> set[str]:
            return {name.split("/", 1)[0] for name in names
                    if name.count("/") == 1 and name.endswith(f"/{file}") and name.split("/", 1)[0].isdigit()}

        checksummed = steps_holding(CHECKSUMS)
        verified = CHECKSUMMED in names or bool(checksummed)
        return sorted(int(step) for step in steps_holding(COMMIT_MARKER) if not verified or step in checksummed)
    if not checkpoint_dir.is_dir():
        return []
    verified = uses_checksums(checkpoint_dir)
    return sorted(int(p.name) for p in checkpoint_dir.iterdir()
                  if p.name.isdigit() and (not verified or (p / CHECKSUMS).is_file()))
