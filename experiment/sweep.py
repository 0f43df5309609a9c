"""Variants of one experiment: the runs of a sweep, each named by what differs.

An experiment's YAML may declare ``experiment.variants`` (a list of overrides, each a mapping of
dotted config keys to values, optionally with a ``name``) and/or ``experiment.grid`` (dotted keys
to lists of values: every combination is one variant). ``experiment.variant: <name>`` selects one:
the config is then the YAML with that variant's overrides applied, its ``experiment.name``
``<sweep name>-<variant name>`` (its own run folder) and its W&B group the sweep's name, so every
variant's runs share one group. Plain data here (no config import): ``experiment.config`` applies
the overrides while it loads.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from experiment.errors import ConfigError, echo

NAME_KEY = "name"  # a variant's own name among its overrides


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]  # dotted config key -> value


def value_text(value: Any) -> str:
    """A value as it reads in a run name: 0.003 -> 3e-03, 128 -> 128, true -> true."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def variant_name(overrides: Mapping[str, Any]) -> str:
    """What differs, e.g. ``d_model-128_learning_rate-0.003`` (the last part of each key)."""
    text = "_".join(f"{key.rsplit('.', 1)[-1]}-{value_text(value)}" for key, value in overrides.items())
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-")


def _check_keys(overrides: Mapping[str, Any], where: str) -> None:
    for key in overrides:
        if not isinstance(key, str) or "." not in key or any(not part for part in key.split(".")):
            raise ConfigError(f"config key '{where}': {echo(key)} is not a dotted config key such as model.d_model")
        if key.startswith("experiment."):
            raise ConfigError(f"config key '{where}': {key} cannot vary (a variant's name, folder and group "
                              "come from the sweep)")


def expand_variants(variants: list[Mapping[str, Any]] | None, grid: Mapping[str, list[Any]] | None,
                    ) -> list[Variant]:
    """The sweep's variants: the listed ones in order, then every combination of the grid."""
    found: list[Variant] = []
    for index, entry in enumerate(variants or []):
        where = f"experiment.variants[{index}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"config key '{where}': expected a mapping of dotted keys to values")
        overrides = {k: v for k, v in entry.items() if k != NAME_KEY}
        _check_keys(overrides, where)
        if not overrides:
            raise ConfigError(f"config key '{where}': a variant needs at least one dotted key to override")
        found.append(Variant(str(entry.get(NAME_KEY) or variant_name(overrides)), overrides))
    grid = dict(grid or {})
    _check_keys(grid, "experiment.grid")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"config key 'experiment.grid.{key}': expected a non-empty list of values")
    for combination in itertools.product(*grid.values()) if grid else ():
        overrides = dict(zip(grid, combination, strict=True))
        found.append(Variant(variant_name(overrides), overrides))
    names = [v.name for v in found]
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
            raise ConfigError(f"config key 'experiment.variants': variant name {echo(name)} may hold only letters, "
                              "digits and _ . + -")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"config key 'experiment.variants': two variants are named {echo(duplicates[0])}: give "
                          "each a distinct name")
    return found


def sweep_name(experiment: Any) -> str:
    """The sweep's name (its W&B group and run folder): the group of a variant, else the experiment's name."""
    return experiment.group or experiment.name


def variant_experiment_name(sweep: str, variant: str) -> str:
    return f"{sweep}-{variant}"


def select_variant(experiment_tree: Mapping[str, Any]) -> Variant | None:
    """The variant ``experiment.variant`` names in a YAML tree's experiment mapping (None: not a variant)."""
    chosen = experiment_tree.get("variant") or ""
    if not chosen:
        return None
    variants = expand_variants(experiment_tree.get("variants"), experiment_tree.get("grid"))
    for variant in variants:
        if variant.name == chosen:
            return variant
    known = ", ".join(v.name for v in variants) or "none declared (experiment.variants / experiment.grid)"
    raise ConfigError(f"config key 'experiment.variant': no variant named {echo(chosen)}; the variants: {known}")


def variant_of(experiment: Any) -> Variant | None:
    """The variant a loaded config's experiment section is (None: a plain experiment or a sweep itself)."""
    if not experiment.variant:
        return None
    for variant in expand_variants(experiment.variants, experiment.grid):
        if variant.name == experiment.variant:
            return variant
    return None


def sweep_variants(experiment: Any) -> list[Variant]:
    """The variants a loaded config declares (empty: no sweep)."""
    return expand_variants(experiment.variants, experiment.grid)
