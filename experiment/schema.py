"""The experiment config's schema: one section per stage plus cross-cutting ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from experiment.sections.corpus import CorpusConfig, SourceConfig
from experiment.sections.cost import CostConfig
from experiment.sections.eval import EvalConfig
from experiment.sections.experiment import ExperimentSection
from experiment.sections.generate import GenerateConfig
from experiment.sections.model import FamilyConfig, ModelSection, model_section_class
from experiment.sections.shards import ShardsConfig
from experiment.sections.tokenizer import TokenizerConfig
from experiment.sections.tracking import WandbConfig
from experiment.sections.train import MeshConfig, TrainConfig

__all__ = [
    "CorpusConfig", "CostConfig", "EvalConfig", "ExperimentConfig", "ExperimentSection", "FamilyConfig",
    "GenerateConfig", "MeshConfig", "ModelSection", "ShardsConfig", "SourceConfig", "TokenizerConfig", "TrainConfig",
    "WandbConfig",
]


@dataclass
class ExperimentConfig:
    experiment: ExperimentSection
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    shards: ShardsConfig = field(default_factory=ShardsConfig)
    # the section class of ``model.family`` (its folder's config module, a ``ModelSection``, or a plugin's:
    # experiment.sections.model.FamilyConfig); built by experiment.config.build_config; the default is Llama's
    model: FamilyConfig = field(default_factory=lambda: model_section_class("llama")())
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    # the dotted keys the YAML and the overrides set (experiment.config.build_config records them on the
    # instance; not a config key): what model.init_from checks against the base model's config.json
    explicit_keys: ClassVar[frozenset[str]] = frozenset()
