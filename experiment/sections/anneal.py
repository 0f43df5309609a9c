"""``experiment.anneal``: an anneal comparison, the cheap test of a data source that OLMo and Marin use.

One checkpoint of a parent run is annealed (its learning rate decayed to the end) on a control mixture and on
each candidate mixture, every one for the same steps with the same decay and each from several seeds (data
orders); held-out bits per byte on each data set then says what a candidate's data did against the control's.
OLMo 2 judges its mid-training data with such short anneals ("microanneals", https://arxiv.org/abs/2501.00656);
Marin's ``default_anneal`` (https://github.com/marin-community/marin: experiments/defaults.py, its AnnealConfig in
experiments/anneal_config.py) decays a checkpoint's learning rate linearly to 0 over the anneal's tokens, as here
with ``train.min_lr_ratio: 0``.

The section is plain data: experiment/sweep.py expands it into the sweep's runs (decay branches with
``train.branch_data: own``), tracking/sweep.py (recipe 08) runs them and cost/anneal.py tabulates them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from experiment.errors import ConfigError, echo
from experiment.storage.urls import check_location

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
