"""Variants of one experiment: the runs of a sweep, each named by what differs.

An experiment's YAML may declare ``experiment.variants`` (a list of overrides, each a mapping of
dotted config keys to values, optionally with a ``name``) and/or ``experiment.grid`` (dotted keys
to lists of values: every combination is one variant). ``experiment.variant: <name>`` selects one:
the config is then the YAML with that variant's overrides applied, its ``experiment.name``
``<sweep name>-<variant name>`` (its own run folder) and its W&B group the sweep's name, so every
variant's runs share one group. Plain data here (no config import): ``experiment.config`` applies
the overrides while it loads.

``experiment.anneal`` (``AnnealConfig``) is a third form: an anneal comparison, whose runs (the control
mixture and each candidate, each seed) are expanded here as variants named ``<mixture>-seed<N>``. One
checkpoint of a parent run is annealed (its learning rate decayed to the end) on a control mixture and on
each candidate mixture, every one for the same steps with the same decay and each from several seeds (data
orders); held-out bits per byte on each data set then says what a candidate's data did against the
control's. OLMo 2 judges its mid-training data with such short anneals ("microanneals",
https://arxiv.org/abs/2501.00656); Marin's ``default_anneal`` (https://github.com/marin-community/marin:
experiments/defaults.py, its AnnealConfig in experiments/anneal_config.py) decays a checkpoint's learning
rate linearly to 0 over the anneal's tokens, as here with ``train.min_lr_ratio: 0``. Recipe 08
(tracking/sweep.py) runs them and recipe 06 tabulates them (cost/anneal.py).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from experiment.errors import ConfigError, echo
from experiment.storage.urls import check_location

NAME_KEY = "name"  # a variant's own name among its overrides


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]  # dotted config key -> value


CONTROL = "control"  # the control mixture's name among the runs; no candidate may take it
NAME_PATTERN = r"[A-Za-z0-9_.+-]+"  # a set's or candidate's name: a part of a run folder's name


@dataclass
class AnnealConfig:
    # the run whose checkpoint every anneal starts from: an experiment name under experiment.run_root, or a
    # path (train.branch_from of every run); empty: no anneal comparison
    parent: str = ""
    step: int = 0  # the parent's checkpoint step (train.branch_step)
    steps: int = 0  # anneal steps: every run trains steps step+1 .. step+steps (same tokens for all)
    decay: Literal["linear", "cosine", "1-sqrt"] = "linear"  # the shape of the decay over all the anneal steps
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # experiment.seed of each run: its data order
    # data set name -> its shards folder (recipe 03's output with the parent's tokenizer); "": the parent's shards
    sets: dict[str, str] = field(default_factory=dict)
    control: dict[str, float] = field(default_factory=dict)  # set name -> weight (relative) of the control mixture
    candidates: dict[str, dict[str, float]] = field(default_factory=dict)  # candidate name -> its mixture

    def declared(self) -> bool:
        """Whether the config asks for an anneal comparison (any key but the defaults set)."""
        return bool(self.parent or self.step or self.steps or self.sets or self.control or self.candidates)

    def mixtures(self) -> dict[str, dict[str, float]]:
        """The control mixture first, then the candidates in their order."""
        return {CONTROL: self.control, **self.candidates}

    def validate(self, key: str) -> None:
        if not self.declared():
            return
        check_location(self.parent, f"{key}.parent")
        if not self.parent:
            raise ConfigError(f"config key '{key}.parent': an anneal comparison starts from a parent run's "
                              "checkpoint: give its experiment name or folder")
        for name in ("step", "steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key '{key}.{name}': must be >= 1, got {getattr(self, name)}")
        if len(self.seeds) < 2:
            raise ConfigError(f"config key '{key}.seeds': give at least two seeds (an interval over seeds needs two), "
                              f"got {self.seeds}")
        if len(set(self.seeds)) != len(self.seeds) or any(seed < 0 for seed in self.seeds):
            raise ConfigError(f"config key '{key}.seeds': distinct seeds >= 0, got {self.seeds}")
        if not self.sets:
            raise ConfigError(f"config key '{key}.sets': name the data sets the mixtures draw from "
                              "({name: shards folder}, '' for the parent's shards)")
        for name, shards in self.sets.items():
            if not re.fullmatch(NAME_PATTERN, name):
                raise ConfigError(f"config key '{key}.sets.{name}': a set's name may hold only letters, digits and "
                                  "_ . + -")
            check_location(shards, f"{key}.sets.{name}")
        if not self.control:
            raise ConfigError(f"config key '{key}.control': the control mixture ({{set: weight}}) is missing")
        if not self.candidates:
            raise ConfigError(f"config key '{key}.candidates': name at least one candidate mixture "
                              "({name: {set: weight}})")
        for name, mixture in self.candidates.items():
            if name == CONTROL or not re.fullmatch(NAME_PATTERN, name):
                raise ConfigError(f"config key '{key}.candidates.{name}': a candidate's name may hold only letters, "
                                  f"digits and _ . + -, and is not {CONTROL!r}")
            if mixture == self.control:
                raise ConfigError(f"config key '{key}.candidates.{name}': the same mixture as the control")
        for name, mixture in self.mixtures().items():
            where = f"{key}.control" if name == CONTROL else f"{key}.candidates.{name}"
            if not mixture:
                raise ConfigError(f"config key '{where}': an empty mixture: give {{set: weight}}")
            for set_name, weight in mixture.items():
                if set_name not in self.sets:
                    raise ConfigError(f"config key '{where}.{set_name}': not a set of {key}.sets "
                                      f"({', '.join(self.sets)})")
                if not weight > 0:
                    raise ConfigError(f"config key '{where}.{set_name}': a weight must be positive, got {echo(weight)}")


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
              "eval.validation_sets": {name: shards[name] for name in used},
              # the run's shards/ link to the parent's (recipe 04 reads their manifest): a set "" is that folder,
              # which recipe 05 would otherwise measure twice, once as if it were the run's own validation
              "eval.validate_run_shards": False}
    # each mixture's sets in ``sets`` order: the loader shuffles a set by the seed and its place in the mixture, so
    # a set at the same place in two mixtures is read in the same order by their runs of one seed (paired runs)
    return [Variant(anneal_run_name(name, seed),
                    {**common, "train.mixture": [{"name": set_name, "shards": shards[set_name],
                                                  "weight": mixture[set_name]}
                                                 for set_name in anneal.sets if set_name in mixture],
                     "experiment.seed": seed})
            for name, mixture in anneal.mixtures().items() for seed in anneal.seeds]


def declared_anneal(anneal: AnnealConfig | None) -> AnnealConfig | None:
    """``anneal`` where it asks for an anneal comparison, else None."""
    return anneal if anneal is not None and anneal.declared() else None


def expand_variants(variants: list[Mapping[str, Any]] | None, grid: Mapping[str, list[Any]] | None,
                    anneal: AnnealConfig | None = None, run_root: str = "runs") -> list[Variant]:
    """The sweep's variants: the listed ones in order, then every combination of the grid; or the runs of
    ``anneal`` (``experiment.anneal``), whose run folders are under ``run_root``."""
    comparison = declared_anneal(anneal)
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


def select_variant(experiment_tree: Mapping[str, Any], anneal: AnnealConfig | None = None) -> Variant | None:
    """The variant ``experiment.variant`` names in a YAML tree's experiment mapping (None: not a variant);
    ``anneal``: its ``experiment.anneal`` as the section (experiment.config builds it from the tree)."""
    chosen = experiment_tree.get("variant") or ""
    if not chosen:
        return None
    variants = expand_variants(experiment_tree.get("variants"), experiment_tree.get("grid"), anneal,
                               str(experiment_tree.get("run_root") or "runs"))
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
