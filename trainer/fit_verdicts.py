"""The TPU compiler's memory verdicts, kept: a rerun of the fit check on an unchanged program skips its compile.

An ahead-of-time compile for a topology takes minutes for a large model on a CPU (the 70B config's step for
v5p-128), and JAX's own compilation cache cannot help: an executable compiled for a topology without a TPU
attached cannot be read back ("PjRtCompiler must be constructed with a Client"). What recipe 04b keeps is
not the executable but what it reads from it: the per-device memory analysis, or the compiler's error.

An entry is keyed by everything the compiler's answer depends on: the lowered program's text (the whole step
with its shardings, donations and device count; each Pallas kernel's Mosaic module printed without its source
locations, see ``program_fingerprint``), the topology, the number of slices, the versions of jax,
jaxlib and libtpu, and the flags that reach XLA and libtpu (``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``). A change to
any of them is another key and a fresh compile. Entries are written atomically, carry their key and a checksum
of their answer, and one that does not verify (torn, edited, flipped) is compiled again with a warning naming
the file. What fits is decided at each run from the bytes and the current capacity table, never stored.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import re
from typing import Any

from experiment.files import atomic_write_json
from experiment.jsontext import parse_json
from experiment.storage import RunPath, location

log = logging.getLogger("trainer.fit_check")
FLAG_VARS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
MEMORY_PARTS = ("argument", "output", "alias", "temp", "generated_code")


@functools.cache
def compiler_versions() -> dict[str, str]:
    versions = {}
    for package in ("jax", "jaxlib", "libtpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "absent"
    return versions


# a Pallas TPU kernel in the lowered text: its Mosaic module, MLIR bytecode in base64, inside the custom call's
# JSON backend_config (quotes printed as \22)
MOSAIC_BODY = re.compile(r'(\\22body\\22: \\22)([A-Za-z0-9+/=]+)(\\22)')


def mosaic_module_text(body: str) -> str:
    """A kernel's Mosaic module printed without source locations. Its bytecode records the file of every
    operation, and the kernels' files live in the venv (site-packages/jax/experimental/pallas/...), so the
    same program lowered from two checkouts would otherwise hash apart. jax's private MLIR bindings: if they
    fail (another jax), the raw body is kept and such a program just is not found from another venv."""
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    context = mlir.make_ir_context()
    tpu.register_dialect(context)
    with context, ir.Location.unknown():
        context.allow_unregistered_dialects = True
        module = ir.Module.parse(base64.b64decode(body))
        PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
        return module.operation.get_asm(enable_debug_info=False)


def program_fingerprint(program_text: str) -> str:
    """``program_text`` with each Mosaic kernel replaced by the hash of ``mosaic_module_text``."""
    def canonical(match: re.Match[str]) -> str:
        try:
            text = mosaic_module_text(match.group(2))
        except Exception as exc:  # noqa: BLE001 (see mosaic_module_text)
            log.debug("a Mosaic kernel kept as lowered (%s)", exc)
            return match.group(0)
        return f"{match.group(1)}mosaic-sha256:{hashlib.sha256(text.encode()).hexdigest()}{match.group(3)}"

    return MOSAIC_BODY.sub(canonical, program_text)


def verdict_key(program_text: str, target: dict[str, Any]) -> str:
    """The entry's name: a hash of the lowered program (``program_fingerprint``) and of ``target`` (topology,
    slices), the compiler's versions and the flags that reach it."""
    context = {"target": target, "versions": compiler_versions(),
               "flags": {v: os.environ.get(v, "") for v in FLAG_VARS}}
    digest = hashlib.sha256(json.dumps(context, sort_keys=True).encode())
    digest.update(program_fingerprint(program_text).encode())
    return digest.hexdigest()


def _checksum(answer: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(answer, sort_keys=True).encode()).hexdigest()


def _is_answer(answer: Any) -> bool:
    """The compiler's memory parts in bytes, or its error line (with the time it took either way)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("compile_s"), int | float):
        return False
    if "error" in answer:
        return isinstance(answer["error"], str) and set(answer) == {"error", "compile_s"}
    memory = answer.get("memory_bytes")
    return set(answer) == {"memory_bytes", "compile_s"} and isinstance(memory, dict) and \
        set(memory) == set(MEMORY_PARTS) and all(isinstance(v, int) and v >= 0 for v in memory.values())


def worth_keeping(answer: dict[str, Any]) -> bool:
    """Memory figures and the compiler's out-of-HBM errors are the program's; any other failure (a host out
    of memory, a crash in the compiler, a feature the topology lacks that a newer libtpu may have) is not
    kept, so the next run tries again."""
    return "memory_bytes" in answer or not str(answer.get("error", "")).startswith("does not compile")


class FitVerdicts:
    """The verdicts in one folder (``<xla cache>/tpu_fit``), one JSON file per key."""

    def __init__(self, folder: RunPath | str) -> None:
        self.folder = location(folder)

    def path(self, key: str) -> RunPath:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored answer, or None when there is none or it does not verify (then a warning names the file)."""
        path = self.path(key)
        try:
            entry = parse_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("fit verdict %s is unreadable (%s): compiling again", path, exc)
            return None
        answer = entry.get("answer") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("key") != key or not _is_answer(answer) or \
                entry.get("sha256") != _checksum(answer):
            log.warning("fit verdict %s does not verify (its key, fields or checksum): compiling again", path)
            return None
        return answer

    def put(self, key: str, answer: dict[str, Any], about: dict[str, Any]) -> None:
        """Store ``answer`` (``about``: what was compiled, for a reader of the folder; not part of the check).
        A folder that cannot be written costs the next run a compile, not this one its report."""
        if not _is_answer(answer):
            raise ValueError(f"not a fit verdict: {answer!r}")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path(key), {"key": key, "answer": answer, "sha256": _checksum(answer),
                                               "versions": compiler_versions(), "about": about})
        except OSError as exc:
            log.warning("could not keep the fit verdict in %s (%s): the next run compiles again", self.folder, exc)
