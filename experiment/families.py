"""The model families that ship, by name: the one table a new family adds a line to.

A family is one folder under model/ (e.g. model/llama/, model/gemma3/). Its ``config`` module holds data
only (the ``model:`` section dataclasses in ``SECTIONS``, named sizes in ``PRESETS``, and ``AXIS_RULES``,
its logical axis names with their default mesh axes) and imports nothing above ``experiment``
(tests/test_import_graph.py checks), so config load reads a family's section, presets and axis names
by importing that one module: recipes 01-03 never import jax, and no stage imports the model code of
a family it does not run. Its ``family`` module registers the ``ModelFamily`` (builder, FLOPs,
adapter: model/family.py), imported by ``model.registry`` when a stage first asks for the family.

A family defined outside the package (a user's project, a test's module) registers its section with
``experiment.sections.model.register_model_section`` and its ``ModelFamily`` with
``model.family.register_family`` when its module is imported (``RU_PRETRAIN_PLUGINS`` for recipes).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from experiment.errors import ConfigError

# family name -> the package of its folder (several Llama-shaped families share model/llama/)
FAMILY_PACKAGES: dict[str, str] = {
    "llama": "model.llama",
    "mistral": "model.llama",
    "qwen2": "model.llama",
    "qwen3": "model.llama",
    "gemma3": "model.gemma3",
    "qwen3_moe": "model.qwen3_moe",
    "deepseek_v3": "model.deepseek_v3",
}


def shipped_families() -> tuple[str, ...]:
    return tuple(sorted(FAMILY_PACKAGES))


def family_config_module(family: str) -> ModuleType:
    """The data module (``<package>.config``) of a shipped family; an unknown name is one line."""
    if family not in FAMILY_PACKAGES:
        raise ConfigError(f"config key 'model.family': unknown model family '{family}' "
                          f"(known: {', '.join(shipped_families())})")
    return importlib.import_module(f"{FAMILY_PACKAGES[family]}.config")


def family_module(family: str) -> ModuleType:
    """The module that registers a shipped family's ``ModelFamily`` (``<package>.family``), imported."""
    family_config_module(family)  # the one-line error for an unknown name
    return importlib.import_module(f"{FAMILY_PACKAGES[family]}.family")
