"""Modules a user names to extend the package before a recipe reads its config (e.g. a model family).

A recipe runs in its own process, so a model family defined outside the package (a test's module,
a user's project) is registered there only if that process imports it: ``RU_PRETRAIN_PLUGINS`` lists
such modules, comma-separated, and the recipe harness imports them before loading the config.
"""

from __future__ import annotations

import importlib
import os

from experiment.errors import ConfigError

PLUGINS_ENV = "RU_PRETRAIN_PLUGINS"


def plugin_modules() -> list[str]:
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def load_plugins() -> list[str]:
    """Import every module named in ``RU_PRETRAIN_PLUGINS``; one that fails is a one-line ConfigError."""
    names = plugin_modules()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any failure of a user's module is reported, not a traceback
            first = (str(exc).splitlines() or [""])[0][:300]
            raise ConfigError(f"environment variable {PLUGINS_ENV}: module '{name}' failed to import "
                              f"({type(exc).__name__}: {first})") from exc
    return names
