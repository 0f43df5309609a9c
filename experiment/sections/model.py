from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from experiment.errors import ConfigError


@dataclass
class ModelConfig:
    # the model family (model/ registry); a family may register a subclass of this section with its own fields
    family: str = "llama"
    preset: str = ""  # a named size from experiment/presets.py; keys the config sets override it
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 0  # 0: d_model // n_heads
    d_ff: int = 688
    max_seq_len: int = 1024
    rope_theta: float = 10_000.0
    # RoPE frequency scaling for a longer context: none, or llama3 (Llama 3.1+: wavelengths longer than
    # rope_original_max_len / rope_low_freq_factor are divided by rope_factor, shorter than
    # rope_original_max_len / rope_high_freq_factor kept, a smooth ramp between)
    rope_scaling: Literal["none", "llama3"] = "none"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    qkv_bias: bool = False  # biases on the query, key and value projections (Qwen2/2.5)
    qk_norm: bool = False  # RMSNorm over each query and key head before RoPE (Qwen3)
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    z_loss: float = 0.0  # weight of log(Z)^2 in the loss (PaLM), keeps logits from drifting
    init_std: float = 0.02
    # auto: by the platform compiled for (model/attention.py): splash on TPU, cudnn on NVIDIA GPUs,
    # dot_product elsewhere. splash: Pallas splash attention (TPU; flash-style, no T x T scores in HBM);
    # cudnn: jax.nn.dot_product_attention's cuDNN flash attention (GPUs, bf16); dot_product: XLA's
    # (materialises the scores); einsum: the hand-written reference
    attention: Literal["auto", "dot_product", "einsum", "cudnn", "splash"] = "auto"
    # activation checkpointing per decoder block: none, full (recompute everything), save_dots (keep
    # the projections' outputs, recompute attention and elementwise work), offload (save_dots with the
    # saved outputs in host memory; TPU). The recompute each costs: model.flops.recompute_flops_per_token
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

    def validate(self, key: str) -> None:
        prefix = f"{key}." if key else ""
        for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"config key '{prefix}{name}': must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"config key '{prefix}n_kv_heads': {self.n_kv_heads} does not divide n_heads={self.n_heads} "
                "(grouped-query attention shares each KV head among n_heads / n_kv_heads query heads)"
            )
        if self.head_dim < 0 or (self.head_dim == 0 and self.d_model % self.n_heads):
            raise ConfigError(
                f"config key '{prefix}head_dim': d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "set head_dim explicitly"
            )
        if self.resolved_head_dim % 2:
            raise ConfigError(f"config key '{prefix}head_dim': RoPE needs an even head dimension, got {self.resolved_head_dim}")
        if self.rope_scaling == "llama3" and not (self.rope_factor >= 1 and self.rope_original_max_len > 0
                                                  and self.rope_high_freq_factor > self.rope_low_freq_factor > 0):
            raise ConfigError(
                f"config key '{prefix}rope_scaling': llama3 needs rope_factor >= 1, rope_original_max_len > 0 and "
                f"rope_high_freq_factor > rope_low_freq_factor > 0 (got {self.rope_factor}, {self.rope_original_max_len}, "
                f"{self.rope_high_freq_factor}, {self.rope_low_freq_factor})"
            )
        if self.scan_unroll < 0:
            raise ConfigError(f"config key '{prefix}scan_unroll': must be >= 0 (0: by platform), got {self.scan_unroll}")
        if self.z_loss < 0:
            raise ConfigError(f"config key '{prefix}z_loss': must be >= 0, got {self.z_loss}")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads


@dataclass
class MistralConfig(ModelConfig):
    """Mistral (model/hf_families.py): Llama's decoder, untied embeddings."""

    family: str = "mistral"
    tie_embeddings: bool = False


@dataclass
class Qwen2Config(ModelConfig):
    """Qwen2 and Qwen2.5 (model/hf_families.py): biases on the query, key and value projections."""

    family: str = "qwen2"
    qkv_bias: bool = True
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6


@dataclass
class Qwen3Config(ModelConfig):
    """Qwen3 (model/hf_families.py): an RMSNorm over each query and key head, no biases."""

    family: str = "qwen3"
    qk_norm: bool = True
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6


# family name -> the class of its model section; load_config builds `model` with the class of `model.family`.
# A family's section is ModelConfig, a subclass with its own fields, or its own dataclass with at least
# the fields model.family.FamilyConfig names (family, max_seq_len, ...)
# the families that ship are known here too, so that stages which never import model/ (recipes 01-03) read them
_MODEL_SECTIONS: dict[str, type[Any]] = {"llama": ModelConfig, "mistral": MistralConfig, "qwen2": Qwen2Config,
                                         "qwen3": Qwen3Config}


def register_model_section(family: str, cls: type[Any]) -> None:
    """Make ``model.family: <family>`` build its model section as ``cls`` (a dataclass with a ``family`` field)."""
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type) and "family" in {f.name for f in dataclasses.fields(cls)}):
        raise TypeError(f"model section of family '{family}' must be a dataclass with a 'family' field, got {cls!r}")
    _MODEL_SECTIONS[family] = cls


def model_section_class(family: str) -> type[Any]:
    """The model section class registered for ``family``; an unknown family is one line listing the known."""
    if family not in _MODEL_SECTIONS:
        raise ConfigError(f"config key 'model.family': unknown model family '{family}' "
                          f"(known: {', '.join(sorted(_MODEL_SECTIONS))})")
    return _MODEL_SECTIONS[family]
