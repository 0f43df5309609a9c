"""The import layering of the top-level packages: a package may import only packages listed before it.

pyproject.toml's import-linter contracts (``[tool.importlinter]``, run by ``tests/test_import_graph.py``) hold
the tree to this order, with no cycle between sibling modules; docs/ cite it as the direction of imports.
"""

from __future__ import annotations

# lowest first: experiment (config, errors, files, manifests, run folder, the corpus file format);
# tracking (W&B and the recipe harness); then the stages in pipeline order; recipes on top
PACKAGE_LAYERS: tuple[str, ...] = (
    "experiment", "tracking", "model", "tokenizer", "data_prep", "cost", "trainer", "eval", "recipes",
)

