"""The import layering of the top-level packages: a package may import only packages listed before it.

``tests/test_import_graph.py`` checks every import in the tree against this order (lazy imports
inside functions and ``importlib.import_module("...")`` included), and that no two modules import
each other, directly or round a circle. docs/ cite it as the direction of imports.
"""

from __future__ import annotations

# lowest first: experiment (config, errors, files, manifests, run folder, the corpus file format);
# tracking (W&B and the recipe harness); then the stages in pipeline order; recipes on top
PACKAGE_LAYERS: tuple[str, ...] = (
    "experiment", "tracking", "model", "tokenizer", "data_prep", "cost", "trainer", "eval", "recipes",
)


def may_import(importer: str, imported: str, layers: tuple[str, ...] = PACKAGE_LAYERS) -> bool:
    """Whether top-level package ``importer`` may import ``imported`` (itself, or one to its left in ``layers``)."""
    return layers.index(imported) <= layers.index(importer)
