from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from experiment.errors import ConfigError, echo
from experiment.storage.urls import check_location
from experiment.sweep import AnnealConfig, expand_variants


@dataclass
class ExperimentSection:
    name: str  # a plain name (no slash or backslash, not . or ..): the run folder is <run_root>/<name>
    run_root: str = "runs"
    seed: int = 0
    description: str = ""
    # a sweep (recipes/08_sweep.py): variants of this experiment, each a run under one W&B group
    # (a list of overrides, e.g. [{model.d_model: 128}, {name: wide, model.d_model: 256}])
    variants: list[dict[str, Any]] = field(default_factory=list)
    grid: dict[str, list[Any]] = field(default_factory=dict)  # dotted key -> values: every combination a variant
    # an anneal comparison (recipe 08): one checkpoint annealed on a control and candidate mixtures, from several
    # seeds each, compared by bits per byte per data set (experiment/sweep.py's AnnealConfig)
    anneal: AnnealConfig = field(default_factory=AnnealConfig)
    variant: str = ""  # the variant this run is (set by recipe 08; its overrides are applied at load)
    group: str = ""  # W&B group; empty: the experiment's name (a variant: its sweep's name, set at load)
    # the experiment (a plain name under the same run_root) whose corpus/tokenizer/shards this run reads:
    # recipes 04/04b/04c/05 link them into its folder, read-only (experiment/links.py); a sweep's variants all
    # read them. Empty: the run's own (a sweep's: the sweep's folder)
    data_from: str = ""

    def validate(self, key: str) -> None:
        check_location(self.run_root, f"{key}.run_root")
        for name in ("name", "data_from", "group"):
            _check_plain_name(f"{key}.{name}", getattr(self, name), allow_empty=name != "name")
        # names and keys checked at load, not when the sweep starts
        expand_variants(self.variants, self.grid, self.anneal, self.run_root)
        if self.variant and not (self.variants or self.grid or self.anneal.declared()):
            raise ConfigError(f"config key '{key}.variant': {self.variant!r} names a variant, but the config "
                              "declares no experiment.variants, experiment.grid or experiment.anneal")


# the entries of a run folder (experiment/runfolder.py's RunFolder, experiment/stages.py's folders, the XLA cache):
# a run named like one would be that entry of another run whose folder is the run root (run_root: runs/demo)
RUN_FOLDER_ENTRIES = ("corpus", "tokenizer", "shards", "checkpoints", "ledger", "eval", "export", "generate", "mera",
                      "reports", "configs", "wandb", "xla_cache", "config.resolved.yaml")


NAME_MAX_BYTES = 128  # a Cyrillic letter is 2 bytes: 64 of them


def _check_plain_name(key: str, value: str, allow_empty: bool) -> None:
    """A name that is one folder under the run root: never a path out of it, an absolute path or the root itself,
    nor a hidden entry (the run root's ``.cache``, a run folder's ``.locks``) or a run folder's own entry."""
    if not value and allow_empty:
        return
    if len(value.encode("utf-8")) > NAME_MAX_BYTES:
        raise ConfigError(f"config key '{key}': {echo(value)} is {len(value.encode('utf-8'))} bytes in UTF-8: a "
                          f"name is at most {NAME_MAX_BYTES} (a folder name, with the suffixes the stages add, must "
                          "stay under the filesystems' 255)")
    if not value or value in (".", "..") or re.search(r"[/\\\x00]", value):
        raise ConfigError(f"config key '{key}': {value!r} is not a plain name (no '/', '\\', '..' or empty name): "
                          "it names a folder under experiment.run_root")
    if value.startswith("."):
        raise ConfigError(f"config key '{key}': {value!r} starts with '.': names beginning with a dot are the "
                          "project's own entries (the run root's .cache, a run folder's .locks); pick another name")
    if value in RUN_FOLDER_ENTRIES:
        raise ConfigError(f"config key '{key}': {value!r} is the name of a run folder's own entry "
                          f"({', '.join(RUN_FOLDER_ENTRIES)}); pick another name")
