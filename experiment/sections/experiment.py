from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from experiment.errors import ConfigError
from experiment.sweep import expand_variants


@dataclass
class ExperimentSection:
    name: str
    run_root: str = "runs"  # the run folder is <run_root>/<name>
    seed: int = 0
    description: str = ""
    # a sweep (recipes/08_sweep.py): variants of this experiment, each a run under one W&B group
    # (a list of overrides, e.g. [{model.d_model: 128}, {name: wide, model.d_model: 256}])
    variants: list[dict[str, Any]] = field(default_factory=list)
    grid: dict[str, list[Any]] = field(default_factory=dict)  # dotted key -> values: every combination a variant
    variant: str = ""  # the variant this run is (set by recipe 08; its overrides are applied at load)
    group: str = ""  # W&B group; empty: the experiment's name (a variant: its sweep's name, set at load)
    data_from: str = ""  # the experiment whose corpus/tokenizer/shards a sweep's variants use; empty: the sweep's

    def validate(self, key: str) -> None:
        expand_variants(self.variants, self.grid)  # names and keys checked at load, not when the sweep starts
        if self.variant and not (self.variants or self.grid):
            raise ConfigError(f"config key '{key}.variant': {self.variant!r} names a variant, but the config "
                              "declares no experiment.variants or experiment.grid")
