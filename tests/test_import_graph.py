"""The import rules of the tree: import-linter's contracts in pyproject.toml ([tool.importlinter]: the layering
of experiment/layers.py, no cycle between sibling modules, a model family's data module importing only
experiment), and no circle of modules at all (a package's ``__init__`` and one of its modules included)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
from importlinter import configuration
from importlinter.application.use_cases import lint_imports

from experiment.families import FAMILY_PACKAGES
from experiment.layers import PACKAGE_LAYERS

REPO = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]


def test_the_import_contracts_hold() -> None:
    configuration.configure()  # what the lint-imports command does first
    # each contract's report, the broken imports named with their lines, is in the captured stdout
    assert lint_imports(str(REPO / "pyproject.toml"), cache_dir=None, no_logo=True, is_debug_mode=True)


def test_no_two_modules_import_each_other_directly_or_round_a_circle() -> None:
    graph = grimp.build_graph(*CONFIG["root_packages"], cache_dir=None)
    circles: dict[frozenset[str], tuple[str, ...]] = {}  # a circle through an import: that import, the way back
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if graph.chain_exists(importer=imported, imported=module):
                circle = (module, *graph.find_shortest_chain(imported, module))
                circles.setdefault(frozenset(circle), circle)
    assert not circles, "\n".join(" -> ".join(circle) for circle in circles.values())


def test_the_contracts_name_every_layer_and_every_family() -> None:
    contracts = {contract["id"]: contract for contract in CONFIG["contracts"]}
    assert contracts["layers"]["layers"] == list(reversed(PACKAGE_LAYERS)) == list(reversed(CONFIG["root_packages"]))
    assert all((REPO / package).is_dir() for package in PACKAGE_LAYERS)
    assert set(contracts["family-folders"]["modules"]) == set(FAMILY_PACKAGES.values())
    assert set(contracts["family-data"]["source_modules"]) == {
        name for package in FAMILY_PACKAGES.values() for name in (package, f"{package}.config")}
