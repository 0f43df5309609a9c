"""Variants of one experiment: the runs of a sweep, each named by what differs.

An experiment's YAML may declare ``experiment.variants`` (a list of overrides, each a mapping of
dotted config keys to values, optionally with a ``name``) and/or ``experiment.grid`` (dotted keys
to lists of values: every combination is one variant). ``experiment.variant: <name>`` selects one:
the config is then the YAML with that variant's overrides applied, its ``experiment.name``
``<sweep name>-<variant name>`` (its own run folder) and its W&B group the sweep's name, so every
variant's runs share one group. Plain data here (no config import): ``experiment.config`` applies
the overrides while it loads.

``experiment.anneal`` (experiment/sections/anneal.py) is a third form: an anneal comparison, whose runs
(the control mixture and each candidate, each seed) are expanded here as variants named ``<mixture>-seed<N>``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from experiment.errors import ConfigError, echo

if TYPE_CHECKING:
    from experiment.sections.anneal import AnnealConfig

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


def anneal_run_name(mixture: str, seed: int) -> str:
    """An anneal comparison's run of ``mixture`` (control or a candidate) from ``seed``."""
    return f"{mixture}-seed{seed}"


def parent_shards(parent: str, run_root: str) -> str:
    """The shards folder of the anneal's parent: an experiment name is a folder under the run root."""
    plain = "/" not in parent and "\\" not in parent and "://" not in parent
    return f"{run_root.rstrip('/')}/{parent}/shards" if plain else f"{parent.rstrip('/')}/shards"


def anneal_variants(anneal: AnnealConfig, run_root: str) -> list[Variant]:
    """The runs of an anneal comparison: for each mixture (control first) and each seed, a decay branch of the
    parent's checkpoint reading that mixture from the start of its own stream (``train.branch_data: own``), all
    with the same steps and the same decay, and evaluated on every set the comparison names."""
    shards = {name: folder or parent_shards(anneal.parent, run_root) for name, folder in anneal.sets.items()}
    used = [name for name in anneal.sets if any(name in mixture for mixture in anneal.mixtures().values())]
    common = {"train.branch_from": anneal.parent, "train.branch_step": anneal.step, "train.branch_data": "own",
              "train.steps": anneal.step + anneal.steps, "train.schedule": "wsd", "train.decay": anneal.decay,
              # the decay spans every anneal step: the learning rate falls from the stable rate at the parent's
              # checkpoint to train.min_lr_ratio of it at the last step, as Marin's default_anneal does
              "train.decay_steps": anneal.steps, "train.mixture_schedule": [],
              "eval.validation_sets": {name: shards[name] for name in used}}
    # each mixture's sets in ``sets`` order: the loader shuffles a set by the seed and its place in the mixture, so
    # a set at the same place in two mixtures is read in the same order by their runs of one seed (paired runs)
    return [Variant(anneal_run_name(name, seed),
                    {**common, "train.mixture": [{"name": set_name, "shards": shards[set_name],
                                                  "weight": mixture[set_name]}
                                                 for set_name in anneal.sets if set_name in mixture],
                     "experiment.seed": seed})
            for name, mixture in anneal.mixtures().items() for seed in anneal.seeds]


def typed_anneal(anneal: Any) -> AnnealConfig | None:
    """``experiment.anneal`` as its section (a YAML mapping is built and checked as the config's loader does);
    None where the config declares no anneal comparison."""
    from experiment.sections.anneal import AnnealConfig

    if anneal is None:
        return None
    if not isinstance(anneal, AnnealConfig):
        if not isinstance(anneal, Mapping):
            raise ConfigError(f"config key 'experiment.anneal': expected a mapping, got {echo(anneal)}")
        from experiment.config import build_dataclass  # the loader imports this module: imported when used

        anneal = build_dataclass(AnnealConfig, dict(anneal), "experiment.anneal")
    return anneal if anneal.declared() else None


def expand_variants(variants: list[Mapping[str, Any]] | None, grid: Mapping[str, list[Any]] | None,
                    anneal: Any = None, run_root: str = "runs") -> list[Variant]:
    """The sweep's variants: the listed ones in order, then every combination of the grid; or the runs of
    ``anneal`` (``experiment.anneal``: a mapping or its section), whose run folders are under ``run_root``."""
    comparison = typed_anneal(anneal)
    if comparison is not None:
        if variants or grid:
            raise ConfigError("config key 'experiment.anneal': an anneal comparison makes its own runs; leave "
                              "experiment.variants and experiment.grid empty")
        return anneal_variants(comparison, run_root)
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
    variants = expand_variants(experiment_tree.get("variants"), experiment_tree.get("grid"),
                               experiment_tree.get("anneal"), str(experiment_tree.get("run_root") or "runs"))
    for variant in variants:
        if variant.name == chosen:
            return variant
    known = ", ".join(v.name for v in variants) or ("none declared (experiment.variants / experiment.grid / "
                                                    "experiment.anneal)")
    raise ConfigError(f"config key 'experiment.variant': no variant named {echo(chosen)}; the variants: {known}")


def variant_of(experiment: Any) -> Variant | None:
    """The variant a loaded config's experiment section is (None: a plain experiment or a sweep itself)."""
    if not experiment.variant:
        return None
    for variant in sweep_variants(experiment):
        if variant.name == experiment.variant:
            return variant
    return None


def sweep_variants(experiment: Any) -> list[Variant]:
    """The variants a loaded config declares (empty: no sweep)."""
    return expand_variants(experiment.variants, experiment.grid, experiment.anneal, experiment.run_root)
