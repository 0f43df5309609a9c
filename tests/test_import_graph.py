"""The import graph of the tree: no package cycle, no module circle, every package edge down the layering.

Every ``.py`` under the top-level packages is parsed with ``ast``; an import anywhere in a file counts
(inside functions too: a lazy import still ties two modules together), and so does
``importlib.import_module("literal")``. The layering is ``experiment.layers.PACKAGE_LAYERS``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from experiment.layers import PACKAGE_LAYERS, may_import

REPO = Path(__file__).resolve().parents[1]

@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``file:line``."""

    source: str
    target: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line} -> {self.target}"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def collect_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Module name -> file for every ``.py`` under the given top-level package folders."""
    modules: dict[str, Path] = {}
    for package in packages:
        folder = root / package
        if folder.is_dir():
            modules[package] = folder / "__init__.py"  # a namespace package (no __init__.py) is a node too
            for path in sorted(folder.rglob("*.py")):
                if "__pycache__" not in path.parts:
                    modules[module_name(root, path)] = path
    return modules


def imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterable[tuple[str, int]]:
    """``(dotted name, line)`` for every import statement and literal ``import_module`` call in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield base, node.lineno
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule
                yield f"{base}.{alias.name}", node.lineno
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__"):
                yield node.args[0].value, node.lineno


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The tree's module that ``name`` loads (its longest known prefix); None outside the tree."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_edges(root: Path, packages: Iterable[str]) -> list[Edge]:
    """Every import between two modules of the tree (a module importing itself or a name of its own is left out)."""
    modules = collect_modules(root, packages)
    edges: dict[tuple[str, str, int], Edge] = {}
    for module, path in modules.items():
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        file = str(path.relative_to(root))
        for name, line in imported_names(tree, module, path.name == "__init__.py"):
            target = resolve(name, modules)
            if target is not None and target != module:
                edges.setdefault((module, target, line), Edge(module, target, file, line))
    # ``from pkg.mod import name`` yields both pkg.mod and pkg.mod.name: where the second resolved to
    # pkg.mod as well, the edge is already there once (same source, target and line)
    return sorted(edges.values(), key=lambda e: (e.file, e.line, e.target))


def strongly_connected(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Tarjan's components of size > 1 (a circle of imports), each sorted, in sorted order."""
    graph: dict[str, set[str]] = {node: set() for node in nodes}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the tree's few hundred modules
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def top(module: str) -> str:
    return module.split(".")[0]


def shortest_circle(component: list[str], edges: Iterable[tuple[str, str]]) -> list[str]:
    """The shortest circle inside a strongly connected component, as ``[a, b, ..., a]`` (first by name on ties)."""
    members = set(component)
    graph: dict[str, set[str]] = {node: set() for node in component}
    for source, target in edges:
        if source in members and target in members:
            graph[source].add(target)
    best: list[str] = []
    for start in sorted(component):
        parents: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in parents:
            following = []
            for node in frontier:
                for nxt in sorted(graph[node]):
                    if nxt not in parents:
                        parents[nxt] = node
                        following.append(nxt)
            frontier = following
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(parents[path[-1]])
        path.reverse()
        if not best or len(path) < len(best):
            best = path
    return best


def describe_circle(kind: str, component: list[str], edges: list[Edge], node_of: Callable[[str], str]) -> str:
    """The component's shortest circle, each step named by one import (file:line -> module)."""
    circle = shortest_circle(component, ((node_of(e.source), node_of(e.target)) for e in edges))
    steps = []
    for source, target in zip(circle, circle[1:], strict=False):
        imports = [e for e in edges if node_of(e.source) == source and node_of(e.target) == target]
        more = f" (+{len(imports) - 1} more)" if len(imports) > 1 else ""
        steps.append(f"{imports[0]}{more}")
    members = f" (the circle is part of {', '.join(component)})" if len(component) > len(circle) - 1 else ""
    return f"{kind} {' -> '.join(circle)} import each other: {'; '.join(steps)}{members}"


def package_cycles(edges: list[Edge]) -> list[str]:
    """One message per package circle, naming an import for each step of it."""
    cross = [e for e in edges if top(e.source) != top(e.target)]
    components = strongly_connected([], ((top(e.source), top(e.target)) for e in cross))
    return [describe_circle("packages", component, cross, top) for component in components]


def module_circles(edges: list[Edge]) -> list[str]:
    """One message per circle of modules (a strongly connected component of two or more), naming its imports."""
    components = strongly_connected([], ((e.source, e.target) for e in edges))
    return [describe_circle("modules", component, edges, lambda module: module) for component in components]


def layering_violations(edges: list[Edge], layers: tuple[str, ...] = PACKAGE_LAYERS) -> list[str]:
    order = " < ".join(layers)
    return [f"{e} ({top(e.source)} may not import {top(e.target)}: {order})" for e in edges
            if top(e.source) != top(e.target) and not may_import(top(e.source), top(e.target), layers)]


@pytest.fixture(scope="module")
def tree_edges() -> list[Edge]:
    edges = import_edges(REPO, PACKAGE_LAYERS)
    assert len(edges) > 100, "the checker found almost no imports: is it reading the tree?"
    return edges


def test_no_cycle_between_top_level_packages(tree_edges: list[Edge]) -> None:
    cycles = package_cycles(tree_edges)
    assert not cycles, "\n".join(cycles)


def test_no_circle_of_modules(tree_edges: list[Edge]) -> None:
    circles = module_circles(tree_edges)
    assert not circles, "\n".join(circles)


def test_every_package_edge_follows_the_layering(tree_edges: list[Edge]) -> None:
    violations = layering_violations(tree_edges)
    assert not violations, "\n".join(violations)


def family_data_violations(edges: list[Edge], packages: Iterable[str]) -> list[str]:
    """Imports of a family's data module (``<package>.config``, and the package's ``__init__``) that reach
    beyond ``experiment``: config load imports those modules by name (experiment/families.py), so they must
    bring in no jax and no model code; and imports of one family's folder from another's."""
    packages = set(packages)
    data = {f"{package}.config" for package in packages} | packages
    found = [f"{e} (a family's data module imports only experiment)" for e in edges
             if e.source in data and top(e.target) != "experiment"]
    owner = {module: package for package in packages for module in {e.source for e in edges}
             if module == package or module.startswith(f"{package}.")}
    found += [f"{e} (one family's folder imports another's)" for e in edges
              if e.source in owner and any(e.target == p or e.target.startswith(f"{p}.") for p in packages - {owner[e.source]})]
    return found


def test_family_folders_are_found_by_name_without_their_model_code(tree_edges: list[Edge]) -> None:
    from experiment.families import FAMILY_PACKAGES

    packages = set(FAMILY_PACKAGES.values())
    assert all((REPO / Path(*package.split("."))).is_dir() for package in packages)
    violations = family_data_violations(tree_edges, packages)
    assert not violations, "\n".join(violations)


def test_family_data_checker_flags_a_model_import(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "experiment/__init__.py": "", "experiment/errors.py": "",
        "model/__init__.py": "", "model/shared.py": "",
        "model/a/__init__.py": "", "model/a/config.py": "from experiment import errors\nfrom model import shared\n",
        "model/b/__init__.py": "", "model/b/model.py": "from model.a import config\n",
    })
    violations = family_data_violations(import_edges(tmp_path, ("experiment", "model")), {"model.a", "model.b"})
    assert {v.split(" -> ")[0] for v in violations} == {"model/a/config.py:2", "model/b/model.py:1"}
    assert "model/a/config.py:2 -> model.shared (a family's data module imports only experiment)" in violations
    assert "model/b/model.py:1 -> model.a.config (one family's folder imports another's)" in violations


def test_every_layer_is_a_folder_of_the_tree() -> None:
    assert all((REPO / package).is_dir() for package in PACKAGE_LAYERS)
    assert len(set(PACKAGE_LAYERS)) == len(PACKAGE_LAYERS)


# ---------------------------------------------------------------- the checker itself, on a seeded tree

def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_checker_finds_a_seeded_lazy_cycle_and_names_the_imports(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "low/__init__.py": "",
        "low/base.py": "import os\n\ndef helper():\n    from high.user import thing  # lazy, still an edge\n",
        "high/__init__.py": "",
        "high/user.py": "from low.base import helper\n\nthing = helper\n",
    })
    edges = import_edges(tmp_path, ("low", "high"))
    assert {(e.source, e.target) for e in edges} == {("low.base", "high.user"), ("high.user", "low.base")}
    [package_message] = package_cycles(edges)
    assert package_message == ("packages high -> low -> high import each other: high/user.py:1 -> low.base; "
                               "low/base.py:4 -> high.user")
    [module_message] = module_circles(edges)
    assert "low/base.py:4 -> high.user" in module_message and "high/user.py:1 -> low.base" in module_message
    [violation] = layering_violations(edges, ("low", "high"))
    assert violation.startswith("low/base.py:4 -> high.user")


def test_checker_follows_import_module_relative_and_submodule_imports(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import importlib\n\ndef load():\n    return importlib.import_module('pkg.b')\n",
        "pkg/b.py": "from . import c\n",
        "pkg/c.py": "from pkg import a\n",
        "pkg/d.py": "import numpy\nfrom pkg.a import load\n",
    })
    edges = import_edges(tmp_path, ("pkg",))
    assert {(e.source, e.target) for e in edges} == {
        ("pkg.a", "pkg.b"), ("pkg.b", "pkg"), ("pkg.b", "pkg.c"), ("pkg.c", "pkg"), ("pkg.c", "pkg.a"),
        ("pkg.d", "pkg.a")}
    [circle] = module_circles(edges)
    assert circle == ("modules pkg.a -> pkg.b -> pkg.c -> pkg.a import each other: pkg/a.py:4 -> pkg.b; "
                      "pkg/b.py:1 -> pkg.c; pkg/c.py:1 -> pkg.a")
    assert not package_cycles(edges)
