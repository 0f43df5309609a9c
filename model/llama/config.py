"""The Llama-shaped families' config data: their ``model:`` sections, named sizes and axis rules.

Data only (imports nothing above ``experiment``): config load reads it by family name
(experiment/families.py) without importing jax or the model code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from experiment.sections.model import GroupedHeads, ModelSection
from experiment.sections.rope import RopeScaling, check_rope, rope_of_config

# Named model sizes (the section's PRESETS), from the CPU demo to Llama-2-70B shapes: ``model.preset: 1b`` fills the
# shape fields the config does not set (experiment.config.resolve_model_tree); a key the YAML or an override sets
# always wins.
PRESETS: dict[str, dict[str, Any]] = {
    # ~5M with a 4k vocabulary: trains in minutes on two CPU cores
    "demo-5m": dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=704, max_seq_len=128),
    "125m": dict(d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, d_ff=2048, max_seq_len=2048),
    "350m": dict(d_model=1024, n_layers=24, n_heads=16, n_kv_heads=4, d_ff=2816, max_seq_len=2048),
    "1b": dict(d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=5632, max_seq_len=2048),
    "3b": dict(d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8, d_ff=8192, max_seq_len=4096),
    "7b": dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=11008, max_seq_len=4096,
               tie_embeddings=False),
    # Llama-3.1-8B's shape (vocabulary aside: it is the tokenizer's), RoPE scaled as Llama 3.1's
    "8b": dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, max_seq_len=8192,
               tie_embeddings=False, rope_theta=500_000.0, rope_scaling="llama3", rope_factor=8.0,
               rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192),
    "13b": dict(d_model=5120, n_layers=40, n_heads=40, n_kv_heads=8, d_ff=13824, max_seq_len=4096,
                tie_embeddings=False),
    "70b": dict(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672, max_seq_len=4096,
                tie_embeddings=False),
}



# Logical axis -> mesh axes. Every parameter and key activation names its dims with these logical
# names (model/llama/model.py); this table decides how they are laid out on the device mesh.
AXIS_RULES: dict[str, list[str]] = {
    "batch": ["data", "fsdp"],  # activations: the batch is split over every data-parallel axis
    "length": [],
    "act_embed": [],
    "act_heads": ["tensor"],
    "act_mlp": ["tensor"],
    "vocab": ["tensor"],
    "embed": ["fsdp"],  # FSDP/ZeRO-3: parameters sharded along d_model, gathered per layer
    "heads": ["tensor"],
    "kv_heads": ["tensor"],
    "head_dim": [],
    "mlp": ["tensor"],
    "norm": [],
    # the stacked layer axis of scanned layers (model/stacking.py): each device keeps every layer's shard,
    # and a layer's weights are gathered over fsdp inside the scan body, one layer at a time
    "layers": [],
}


@dataclass
class LlamaConfig(GroupedHeads, ModelSection):
    """Llama's decoder (model/llama/model.py) and its switches; the section of the llama family."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = PRESETS
    AXIS_RULES: ClassVar[dict[str, list[str]]] = AXIS_RULES
    CONTEXT_PARALLEL: ClassVar[bool] = True  # load-balanced, over the gathered keys and values (model/context.py)

    family: str = "llama"
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 0  # 0: d_model // n_heads
    d_ff: int = 688
    rope_theta: float = 10_000.0
    # RoPE frequency scaling for a longer context (experiment/sections/rope.py; docs/guide.md): none; linear
    # (every frequency divided by rope_factor); llama3 (Llama 3.1+: wavelengths longer than rope_original_max_len /
    # rope_low_freq_factor divided by rope_factor, shorter than rope_original_max_len / rope_high_freq_factor kept,
    # a smooth ramp between); yarn (dimensions turning fewer than rope_beta_slow times over rope_original_max_len
    # slowed by rope_factor, more than rope_beta_fast times kept, sin and cos scaled by the attention factor)
    rope_scaling: RopeScaling = "none"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_mscale: float = 0.0  # yarn: attention factor mscale(f, rope_mscale) / mscale(f, rope_mscale_all_dim)
    rope_mscale_all_dim: float = 0.0  # when both are set, else 0.1 ln(rope_factor) + 1
    rope_attention_factor: float = 0.0  # yarn: the attention factor given outright (0: derived as above)
    rope_truncate: bool = True  # yarn: the ramp's ends rounded to whole dimensions
    qkv_bias: bool = False  # biases on the query, key and value projections (Qwen2/2.5)
    qk_norm: bool = False  # RMSNorm over each query and key head before RoPE (Qwen3)
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    # with the sequence split over train.mesh.axes.context (model/context.py): all_gather gathers the whole
    # sequence's keys and values per layer (MaxText's default); ring passes them device to device in N steps,
    # holding one device's share at a time
    context_attention: Literal["all_gather", "ring"] = "all_gather"

    def validate(self, key: str) -> None:
        super().validate(key)
        prefix = f"{key}." if key else ""
        self.check_positive(key, ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"))
        self.check_heads(key)
        check_rope(rope_of_config(self), prefix)


@dataclass
class MistralConfig(LlamaConfig):
    """Mistral (model/llama/family.py): Llama's decoder, untied embeddings."""

    family: str = "mistral"
    tie_embeddings: bool = False


@dataclass
class Qwen2Config(LlamaConfig):
    """Qwen2 and Qwen2.5 (model/llama/family.py): biases on the query, key and value projections."""

    family: str = "qwen2"
    qkv_bias: bool = True
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6


@dataclass
class Qwen3Config(LlamaConfig):
    """Qwen3 (model/llama/family.py): an RMSNorm over each query and key head, no biases."""

    family: str = "qwen3"
    qk_norm: bool = True
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6


# family name -> its ``model:`` section class (config load builds ``model`` with the class of ``model.family``)
SECTIONS: dict[str, type[LlamaConfig]] = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config,
                                          "qwen3": Qwen3Config}
