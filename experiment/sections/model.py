"""The ``model:`` section: the fields every family has (``ModelSection``) and the lookup of a family's own.

Each family's section is a dataclass subclassing ``ModelSection`` with its shape fields, defined in its
folder (``model/<family>/config.py``, found by name through ``experiment.families``). Stages other than
the model read only the fields here (and ``d_model``, the width its output head reads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from experiment.errors import ConfigError
from experiment.families import FAMILY_PACKAGES, family_config_module, shipped_families
from experiment.storage.urls import check_location


class FamilyConfig(Protocol):
    """Any family's ``model:`` section, as code other than the family's own reads it: the type of
    ``ExperimentConfig.model`` and of every ``model_cfg`` a stage hands to the family registry.

    Every family's section subclasses ``ModelSection`` (a plugin's too: ``register_model_section`` refuses
    another class) and adds ``d_model`` and its shape fields; the ``ModelSection`` fields below are what
    other stages read, as attributes.
    """

    @property
    def family(self) -> str: ...  # the registered family name

    @property
    def preset(self) -> str: ...  # a named size of the family, "" for none

    @property
    def d_model(self) -> int: ...  # the width of the hidden states the output projection reads

    @property
    def max_seq_len(self) -> int: ...  # the longest sequence the model is built for

    @property
    def z_loss(self) -> float: ...  # weight of log(Z)^2 in the train loss

    @property
    def attention(self) -> str: ...  # the attention kernel setting (model/attention.py)

    @property
    def remat(self) -> str: ...  # the activation checkpointing setting

    @property
    def init_std(self) -> float: ...  # the initialisers' standard deviation

    @property
    def scan_layers(self) -> bool: ...  # the layers stacked and scanned (model/stacking.py), else a loop

    @property
    def scan_unroll(self) -> int: ...  # lax.scan's unroll (0: by platform)

    @property
    def init_from(self) -> str: ...  # a Hugging Face folder the first session starts from ("": none)

    @property
    def vocab_adaptation(self) -> str: ...  # none, mean or random (model/vocab_adaptation.py)

    @property
    def extend_context(self) -> bool: ...  # init_from may train past the base's context (trainer/init_from.py)

    def validate(self, key: str) -> None: ...  # the section's checks: one ConfigError line naming the key


@dataclass
class ModelSection:
    # a family's named sizes (``model.preset``: name -> shape fields) and its logical axis names with their
    # default mesh axes (``train.mesh.rules`` may change them), given by its section class
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    AXIS_RULES: ClassVar[dict[str, list[str]]] = {}
    # whether the family's decoder splits a sequence over the context mesh axis (model/context.py)
    CONTEXT_PARALLEL: ClassVar[bool] = False

    # the model family (experiment/families.py); its folder's section class adds the shape fields
    family: str = "llama"
    preset: str = ""  # a named size of the family (its config module's PRESETS); keys the config sets override it
    max_seq_len: int = 1024  # the longest sequence the model is built for (trainer and eval check against it)
    z_loss: float = 0.0  # weight of log(Z)^2 in the loss (PaLM), keeps logits from drifting
    init_std: float = 0.02
    # auto: by the platform compiled for (model/attention.py): splash on TPU, cudnn on NVIDIA GPUs,
    # dot_product elsewhere. splash: Pallas splash attention (TPU; flash-style, no T x T scores in HBM);
    # cudnn: jax.nn.dot_product_attention's cuDNN flash attention (GPUs, bf16); dot_product: XLA's
    # (materialises the scores); einsum: the hand-written reference
    attention: Literal["auto", "dot_product", "einsum", "cudnn", "splash"] = "auto"
    # activation checkpointing per decoder block: none, full (recompute everything), save_dots (keep
    # the projections' outputs, recompute attention and elementwise work), offload (save_dots with the
    # saved outputs in host memory; TPU). The recompute each costs: the family's recompute_flops
    remat: Literal["none", "full", "save_dots", "offload"] = "none"
    # the decoder's layers stacked along a leading "layers" axis and run by one lax.scan (model/stacking.py):
    # compile time and compiler-planned memory stop growing with depth. false: a Python loop over per-layer
    # modules (checkpoints of either layout resume in the other: the restore restacks)
    scan_layers: bool = True
    # lax.scan's unroll, layers per loop iteration (a tuning knob); 0: by platform, all layers in one iteration
    # on a CPU (XLA:CPU fuses across layers: 1.10x the rolled scan's tokens/s at the demo shape, bench/README.md),
    # 1 elsewhere (one layer's program, compile time flat in depth)
    scan_unroll: int = 0
    # continued pretraining: a Hugging Face model folder (config.json, *.safetensors, tokenizer.json) the
    # first session of recipe 04 starts from (trainer/init_from.py). Its config.json gives the family and
    # shape: a shape key set here that disagrees is an error. Ignored once the run has a checkpoint.
    init_from: str = ""
    # when the run's tokenizer is not the base model's: none keeps the ids (the vocabulary sizes must
    # match); mean starts each token's input and output embedding as the mean of the base embeddings of
    # the pieces the base tokenizer splits its text into (a token the base has whole is copied); random
    # starts them afresh (the control). model/vocab_adaptation.py
    vocab_adaptation: Literal["none", "mean", "random"] = "none"
    # continued pretraining at a model.max_seq_len above the base model's max_position_embeddings: false refuses
    # it (positions the base never saw, and RoPE frequencies not rescaled for them); true trains them as they are,
    # and the export then declares the trained length
    extend_context: bool = False

    def validate(self, key: str) -> None:
        """The common fields' checks; a family's section extends this with its own."""
        prefix = f"{key}." if key else ""
        check_location(self.init_from, f"{prefix}init_from")
        if self.max_seq_len <= 0:
            raise ConfigError(f"config key '{prefix}max_seq_len': must be positive, got {self.max_seq_len}")
        if self.scan_unroll < 0:
            raise ConfigError(f"config key '{prefix}scan_unroll': must be >= 0 (0: by platform), "
                              f"got {self.scan_unroll}")
        if self.z_loss < 0:
            raise ConfigError(f"config key '{prefix}z_loss': must be >= 0, got {self.z_loss}")

    def check_positive(self, key: str, names: tuple[str, ...]) -> None:
        """One ConfigError line for the first of ``names`` (integer or float fields) that is not above 0."""
        prefix = f"{key}." if key else ""
        for name in names:
            if getattr(self, name) <= 0:
                raise ConfigError(f"config key '{prefix}{name}': must be positive, got {getattr(self, name)}")


class GroupedHeads:
    """What a section with grouped-query attention shares (``n_heads``, ``n_kv_heads``, ``head_dim`` with 0 meaning
    d_model // n_heads, ``d_model``): the resolved head width and the checks that the heads group and rotate."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    def check_heads(self, key: str) -> None:
        """n_kv_heads divides n_heads, the head width is given or divides d_model, and RoPE's is even."""
        prefix = f"{key}." if key else ""
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"config key '{prefix}n_kv_heads': {self.n_kv_heads} does not divide n_heads={self.n_heads} "
                "(grouped-query attention shares each KV head among n_heads / n_kv_heads query heads)")
        if self.head_dim < 0 or (self.head_dim == 0 and self.d_model % self.n_heads):
            raise ConfigError(f"config key '{prefix}head_dim': d_model={self.d_model} is not divisible by "
                              f"n_heads={self.n_heads}; set head_dim explicitly")
        if self.resolved_head_dim % 2:
            raise ConfigError(f"config key '{prefix}head_dim': RoPE needs an even head dimension, "
                              f"got {self.resolved_head_dim}")


# sections of families registered from outside the package (plugins); a shipped family's is in its folder
_PLUGIN_SECTIONS: dict[str, type[FamilyConfig]] = {}
_PLUGIN_AXIS_RULES: dict[str, dict[str, list[str]]] = {}


def register_model_section(family: str, cls: type[FamilyConfig], axis_rules: Mapping[str, Sequence[str]]) -> None:
    """Make ``model.family: <family>`` build its model section as ``cls`` (a dataclass subclassing
    ``ModelSection``: the trainer, eval and the cost code read its fields as attributes) and check
    ``train.mesh.rules`` against the family's logical axis names (``axis_rules``, with defaults). Another class is
    one ConfigError line."""
    if not (isinstance(cls, type) and issubclass(cls, ModelSection) and dataclasses.is_dataclass(cls)):
        raise ConfigError(f"model family '{family}': its model section {cls!r} must be a dataclass subclassing "
                          "experiment.sections.model.ModelSection (the fields every stage reads)")
    _PLUGIN_SECTIONS[family] = cls
    _PLUGIN_AXIS_RULES[family] = {k: list(v) for k, v in axis_rules.items()}


def model_section_class(family: str) -> type[FamilyConfig]:
    """The model section class registered for ``family``; an unknown family is one line listing the known."""
    if family in _PLUGIN_SECTIONS:
        return _PLUGIN_SECTIONS[family]
    if family not in FAMILY_PACKAGES:
        known = sorted({*shipped_families(), *_PLUGIN_SECTIONS})
        raise ConfigError(f"config key 'model.family': unknown model family '{family}' (known: {', '.join(known)})")
    return family_config_module(family).SECTIONS[family]


def family_presets(family: str) -> dict[str, dict[str, Any]]:
    """A family's named sizes (its section class's ``PRESETS``)."""
    return dict(getattr(model_section_class(family), "PRESETS", {}))


def family_axis_rules(family: str) -> dict[str, list[str]]:
    """A family's logical axis names with their default mesh axes: a plugin's as it registered them, a
    shipped family's from its section class (``AXIS_RULES``)."""
    rules = _PLUGIN_AXIS_RULES[family] if family in _PLUGIN_AXIS_RULES else model_section_class(family).AXIS_RULES
    return {k: list(v) for k, v in rules.items()}
