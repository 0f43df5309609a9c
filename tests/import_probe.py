"""Run in a fresh interpreter by tests/test_import_side_effects.py: what importing modules changes in the process.

    python tests/import_probe.py ROOT PACKAGE [PACKAGE ...]

1. Imports every third-party module the packages' modules import at module level (``from x import y``
   also reads ``y``, for packages that load their submodules lazily), so that what *they* do on import
   is the baseline; a third-party package that is not installed (an optional extra such as lm-eval)
   is replaced by stub modules, so the project module that imports it is still checked.
2. Records the process state a module must not change on import: handlers, filters, level and
   propagation of the root and every named logger (absl's included), ``sys.unraisablehook``,
   ``sys.excepthook``, ``threading.excepthook``, warnings filters and ``showwarning``, signal handlers,
   ``os.environ``, the umask, ``sys.path``, the working directory, atexit callbacks, running threads,
   ``faulthandler`` and JAX's config values.
3. Imports every module of the packages (files under ROOT/PACKAGE), records the state again and
   prints a JSON object: ``modules`` imported, ``failed`` (module: error), ``stubbed`` third-party
   roots, and ``changes``, one line per difference.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import faulthandler
import importlib
import importlib.abc
import importlib.machinery
import json
import logging
import os
import signal
import sys
import threading
import types
import warnings
from pathlib import Path
from typing import Any


def module_names(root: Path, packages: list[str]) -> list[str]:
    names = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


def module_level_imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names read from it)`` of the imports that run when ``path`` is imported: module and
    class bodies, ``if``/``try`` blocks, not function bodies."""
    found: list[tuple[str, list[str]]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((alias.name, []) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((node.module, [alias.name for alias in node.names]))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        visit([n for n in inner if isinstance(n, ast.stmt)] +
                              [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Modules under the given roots, each an empty module whose every attribute is a new class."""

    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def stub(attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            if attr[:1].isupper():  # a class to subclass or instantiate
                return type(attr, (), {"__init__": lambda self, *a, **k: None})
            return _decorator_factory

        module.__getattr__ = stub  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _decorator_factory(*args: Any, **kwargs: Any) -> Any:
    """A stub function: used as ``@f`` it returns what it decorates, as ``@f(...)`` a decorator that does."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda obj: obj


def _describe(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}@{id(obj):x}"


def _umask() -> str:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next(line.split()[1] for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration):
        return "unknown"


def snapshot() -> dict[str, Any]:
    state: dict[str, Any] = {}
    loggers = {"<root>": logging.getLogger()}
    loggers.update({name: lg for name, lg in logging.Logger.manager.loggerDict.items()
                    if isinstance(lg, logging.Logger)})
    for name, lg in loggers.items():
        state[f"logger {name}"] = {"handlers": [_describe(h) for h in lg.handlers],
                                   "filters": [_describe(f) for f in lg.filters], "level": lg.level,
                                   "propagate": lg.propagate, "disabled": lg.disabled}
    state["logging.disable"] = logging.root.manager.disable
    state["logging record factory"] = repr(logging.getLogRecordFactory())
    state["logging logger class"] = repr(logging.getLoggerClass())
    for hook in ("unraisablehook", "excepthook", "displayhook", "breakpointhook"):
        state[f"sys.{hook}"] = repr(getattr(sys, hook))
    state["threading.excepthook"] = repr(threading.excepthook)
    state["warnings.filters"] = [repr(f) for f in warnings.filters]
    state["warnings.showwarning"] = repr(warnings.showwarning)
    for sig in sorted(signal.valid_signals()):
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            state[f"signal {sig}"] = repr(signal.getsignal(sig))
    state["os.environ"] = dict(os.environ)
    state["umask"] = _umask()
    state["sys.path"] = list(sys.path)
    state["cwd"] = os.getcwd()
    state["atexit callbacks"] = atexit._ncallbacks()  # noqa: SLF001 (no public count)
    state["threads"] = sorted(t.name for t in threading.enumerate())
    state["faulthandler"] = faulthandler.is_enabled()
    jax = sys.modules.get("jax")
    if jax is not None:
        state["jax.config"] = {k: repr(v) for k, v in jax.config.values.items()}
    return state


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changes = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if key.startswith("logger ") and old is None:  # a logger created on import: fine while it is plain
            plain = {"handlers": [], "filters": [], "level": 0, "propagate": True, "disabled": False}
            if new != plain:
                changes.append(f"{key}: created as {new}")
            continue
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            for sub in sorted(set(old) | set(new)):
                if old.get(sub) != new.get(sub):
                    changes.append(f"{key}[{sub}]: {old.get(sub)!r} -> {new.get(sub)!r}")
        else:
            changes.append(f"{key}: {old!r} -> {new!r}")
    return changes


def main(root: Path, packages: list[str]) -> dict[str, Any]:
    sys.path.insert(0, str(root))
    ours = set(packages)
    modules = module_names(root, packages)
    third_party: dict[str, set[str]] = {}
    for name in modules:
        path = root.joinpath(*name.split(".")).with_suffix(".py")
        if not path.is_file():
            path = root.joinpath(*name.split("."), "__init__.py")
        for imported, names in module_level_imports(path):
            if imported.split(".")[0] not in ours and imported != "__future__":
                third_party.setdefault(imported, set()).update(names)
    missing: set[str] = set()
    for imported, names in sorted(third_party.items()):
        try:
            module = importlib.import_module(imported)
        except ModuleNotFoundError as exc:
            missing.add((exc.name or imported).split(".")[0])
            continue
        for attr in names:
            try:
                getattr(module, attr)
            except AttributeError:
                with contextlib.suppress(ImportError):  # a name that is neither: the import itself fails alike
                    importlib.import_module(f"{imported}.{attr}")
    if missing:
        sys.meta_path.insert(0, _Stubs(missing))
    before = snapshot()
    failed = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # reported, and the test fails on it: every module must import
            failed[name] = f"{type(exc).__name__}: {exc}"
    after = snapshot()
    return {"modules": modules, "failed": failed, "stubbed": sorted(missing), "changes": differences(before, after)}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]).resolve(), sys.argv[2:])))
