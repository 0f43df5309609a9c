"""Gemma 3's config data: its ``model:`` section, named sizes and axis rules.

Data only (imports nothing above ``experiment``): config load reads it by family name
(experiment/families.py) without importing jax or the model code.

The architecture (Gemma Team, "Gemma 3 Technical Report", 2025; Transformers'
``models/gemma3/modeling_gemma3.py``): local sliding-window attention layers interleaved with global
ones (5 local : 1 global by default), each kind with its own RoPE base (10k local, 1M global; the 4B and
larger models stretch the global one linearly by 8), RMSNorm on each query and key head, four norms per
layer (before and after attention and the MLP), a GeGLU MLP, embeddings scaled by sqrt(d_model) and tied
to the output head, and the attention scores scaled by ``query_pre_attn_scalar ** -0.5``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from experiment.errors import ConfigError
from experiment.sections.model import GroupedHeads, ModelSection

# Named sizes (``model.preset``): the public Gemma 3 text models' shapes, from their config.json files on the
# Hugging Face hub (google/gemma-3-270m, gemma-3-1b-pt: top level; gemma-3-4b-pt, -12b-pt, -27b-pt: the
# ``text_config``) and table 1 of the technical report. The vocabulary is the tokenizer's, not a preset's
# (262,144 entries for Gemma's own). ``max_seq_len`` is the model card's context; a run sets its own.
PRESETS: dict[str, dict[str, Any]] = {
    # ~6M with a 4k vocabulary, one local:global group and a tail layer: trains in minutes on two CPU cores
    "demo-6m": dict(d_model=256, n_layers=7, n_heads=4, n_kv_heads=1, head_dim=64, d_ff=768, sliding_window=64,
                    query_pre_attn_scalar=64, max_seq_len=128),
    "270m": dict(d_model=640, n_layers=18, n_heads=4, n_kv_heads=1, head_dim=256, d_ff=2048, sliding_window=512,
                 query_pre_attn_scalar=256, max_seq_len=32_768),
    "1b": dict(d_model=1152, n_layers=26, n_heads=4, n_kv_heads=1, head_dim=256, d_ff=6912, sliding_window=512,
               query_pre_attn_scalar=256, max_seq_len=32_768),
    # 4B and larger: the global layers' RoPE linearly scaled by 8 (config.json rope_scaling {linear, factor 8})
    "4b": dict(d_model=2560, n_layers=34, n_heads=8, n_kv_heads=4, head_dim=256, d_ff=10_240, sliding_window=1024,
               query_pre_attn_scalar=256, max_seq_len=131_072, rope_scaling="linear", rope_factor=8.0),
    "12b": dict(d_model=3840, n_layers=48, n_heads=16, n_kv_heads=8, head_dim=256, d_ff=15_360, sliding_window=1024,
                query_pre_attn_scalar=256, max_seq_len=131_072, rope_scaling="linear", rope_factor=8.0),
    # 27B: head_dim 128, and the scores scaled by (d_model / n_heads) ** -0.5 = 168 ** -0.5, not head_dim's
    "27b": dict(d_model=5376, n_layers=62, n_heads=32, n_kv_heads=16, head_dim=128, d_ff=21_504, sliding_window=1024,
                query_pre_attn_scalar=168, max_seq_len=131_072, rope_scaling="linear", rope_factor=8.0),
}

# Logical axis -> mesh axes. Every parameter and key activation of model/gemma3/model.py names its dims with
# these (the same names as Llama's, so a run's ``train.mesh.rules`` mean the same for either family).
AXIS_RULES: dict[str, list[str]] = {
    "batch": ["data", "fsdp"],  # activations: the batch is split over every data-parallel axis
    "length": [],
    "act_embed": [],
    "act_heads": ["tensor"],
    "act_mlp": ["tensor"],
    "vocab": ["tensor"],  # the tied embedding table and the logits
    "embed": ["fsdp"],  # FSDP/ZeRO-3: parameters sharded along d_model, gathered per layer
    "heads": ["tensor"],
    "kv_heads": ["tensor"],
    "head_dim": [],  # also the q/k norms' scales
    "mlp": ["tensor"],
    "norm": [],
    # the stacked layer axis of scanned layers (model/stacking.py): never split, a layer's weights are
    # gathered over fsdp inside the scan body
    "layers": [],
}

LOCAL, GLOBAL = "L", "G"  # the letters of ``layer_pattern``


@dataclass
class Gemma3Config(GroupedHeads, ModelSection):
    """Gemma 3's text decoder (model/gemma3/model.py); the section of the gemma3 family."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = PRESETS
    AXIS_RULES: ClassVar[dict[str, list[str]]] = AXIS_RULES

    family: str = "gemma3"
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    n_kv_heads: int = 1
    head_dim: int = 64  # Gemma sets it explicitly (256 for most sizes); 0: d_model // n_heads
    d_ff: int = 768
    norm_eps: float = 1e-6
    # the attention scores are scaled by query_pre_attn_scalar ** -0.5 (0: head_dim, as Gemma 3 1B-12B have it)
    query_pre_attn_scalar: float = 0.0
    # local layers see the token itself and the sliding_window - 1 before it (Transformers' sliding_window)
    sliding_window: int = 512
    # the layer types: every global_every-th layer is global (layers global_every-1, 2*global_every-1, ...), the
    # others local, as Transformers' sliding_window_pattern; 1: every layer global. layer_pattern, when set,
    # spells the repeating group out instead (L local, G global, e.g. "LLG" or "L"): layer i is
    # layer_pattern[i % len]. The scanned decoder scans over this group (model/gemma3/model.py).
    global_every: int = 6
    layer_pattern: str = ""
    rope_theta_local: float = 10_000.0
    rope_theta_global: float = 1_000_000.0
    # the global layers' RoPE: none, or linear (positions divided by rope_factor: Gemma 3 4B, 12B, 27B
    # stretch their 32k pretraining context to 128k this way); local layers never scale
    rope_scaling: Literal["none", "linear"] = "none"
    rope_factor: float = 8.0
    tie_embeddings: bool = True  # Gemma 3 always ties the output head to the embedding table

    def validate(self, key: str) -> None:
        super().validate(key)
        prefix = f"{key}." if key else ""
        self.check_positive(key, ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"))
        self.check_heads(key)
        if self.query_pre_attn_scalar < 0:
            raise ConfigError(f"config key '{prefix}query_pre_attn_scalar': must be > 0 (0: head_dim), "
                              f"got {self.query_pre_attn_scalar}")
        if self.layer_pattern:
            if set(self.layer_pattern) - {LOCAL, GLOBAL}:
                raise ConfigError(f"config key '{prefix}layer_pattern': letters L (local) and G (global) only, "
                                  f"got {self.layer_pattern!r}")
        elif self.global_every <= 0:
            raise ConfigError(f"config key '{prefix}global_every': must be positive (1: every layer global), "
                              f"got {self.global_every}")
        if LOCAL in self.pattern and self.sliding_window <= 0:
            raise ConfigError(f"config key '{prefix}sliding_window': local layers need a positive window, "
                              f"got {self.sliding_window}")
        for name in ("rope_theta_local", "rope_theta_global"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"config key '{prefix}{name}': must be positive, got {getattr(self, name)}")
        if self.rope_scaling == "linear" and self.rope_factor < 1:
            raise ConfigError(f"config key '{prefix}rope_factor': linear RoPE scaling needs a factor >= 1, "
                              f"got {self.rope_factor}")
        if not self.tie_embeddings:
            raise ConfigError(f"config key '{prefix}tie_embeddings': Gemma 3 ties the output head to the "
                              "embeddings (Gemma3ForCausalLM has no separate lm_head); it must be true")

    @property
    def attn_scale(self) -> float:
        """What the attention scores are multiplied by: query_pre_attn_scalar ** -0.5."""
        return float(self.query_pre_attn_scalar or self.resolved_head_dim) ** -0.5

    @property
    def pattern(self) -> str:
        """The repeating group of layer types, e.g. "LLLLLG" for global_every 6."""
        return self.layer_pattern or LOCAL * (self.global_every - 1) + GLOBAL

    def layer_types(self) -> str:
        """Every layer's type, L or G, in order."""
        return "".join(self.pattern[i % len(self.pattern)] for i in range(self.n_layers))


# family name -> its ``model:`` section class (config load builds ``model`` with the class of ``model.family``)
SECTIONS: dict[str, type[Gemma3Config]] = {"gemma3": Gemma3Config}
