"""The import rules of the tree: import-linter's contracts in pyproject.toml ([tool.importlinter]: the layering of
experiment/layers.py, no cycle between sibling modules, tools/ outside the library), two contracts written here for
every family experiment.families registers (its data module imports only experiment; no family imports another's
folder), and no circle of modules at all (a package's ``__init__`` and one of its modules included)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import grimp
from importlinter import configuration
from importlinter.application.use_cases import lint_imports

from experiment.families import FAMILY_PACKAGES
from experiment.layers import PACKAGE_LAYERS

REPO = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]


def family_contracts() -> list[dict[str, Any]]:
    above_experiment = [package for package in PACKAGE_LAYERS if package != "experiment"]
    return [
        {"id": "family-data", "name": "a model family's config module and __init__ import only experiment",
         "type": "forbidden", "as_packages": False, "allow_indirect_imports": True,
         "source_modules": [name for package in FAMILY_PACKAGES.values() for name in (package, f"{package}.config")],
         "forbidden_modules": [name for package in above_experiment for name in (package, f"{package}.**")]},
        {"id": "family-folders", "name": "a model family's folder imports nothing of another family's",
         "type": "independence", "modules": sorted(FAMILY_PACKAGES.values())},
    ]


def ini(config: dict[str, Any]) -> str:
    """import-linter's INI form of a [tool.importlinter] table (lists one item a line)."""
    def lines(section: str, table: dict[str, Any]) -> list[str]:
        values = {key: "\n    ".join(["", *value]) if isinstance(value, list) else str(value)
                  for key, value in table.items() if key not in ("contracts", "id")}
        return [f"[{section}]", *(f"{key} = {value}" for key, value in values.items()), ""]
    text = lines("importlinter", config)
    for contract in config["contracts"]:
        text += lines(f"importlinter:contract:{contract['id']}", contract)
    return "\n".join(text)


def test_the_import_contracts_hold(tmp_path: Path) -> None:
    (config := tmp_path / ".importlinter").write_text(
        ini({**CONFIG, "contracts": CONFIG["contracts"] + family_contracts()}), encoding="utf-8")
    configuration.configure()  # what the lint-imports command does first
    # each contract's report, the broken imports named with their lines, is in the captured stdout
    assert lint_imports(str(config), cache_dir=None, no_logo=True, is_debug_mode=True)


def test_no_two_modules_import_each_other_directly_or_round_a_circle() -> None:
    graph = grimp.build_graph(*CONFIG["root_packages"], cache_dir=None)
    circles: dict[frozenset[str], tuple[str, ...]] = {}  # a circle through an import: that import, the way back
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if graph.chain_exists(importer=imported, imported=module):
                circle = (module, *graph.find_shortest_chain(imported, module))
                circles.setdefault(frozenset(circle), circle)
    assert not circles, "\n".join(" -> ".join(circle) for circle in circles.values())


def test_the_layers_contract_is_experiment_layers() -> None:
    contracts = {contract["id"]: contract for contract in CONFIG["contracts"]}
    assert contracts["layers"]["layers"] == list(reversed(PACKAGE_LAYERS))
    assert CONFIG["root_packages"] == [*PACKAGE_LAYERS, "tools"]
    assert contracts["tools-outside"]["source_modules"] == list(PACKAGE_LAYERS)
