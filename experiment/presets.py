"""Named model sizes, from the CPU demo to Llama-2-70B shapes: config data the loader merges.

``model.preset: 1b`` fills the shape fields the config does not set; a key the YAML or an override
sets always wins, whatever its value (``model.preset=1b model.n_kv_heads=2`` gives 2 KV heads).
The merge happens once, in ``experiment.config.load_config``, so every stage and the recorded
``config.resolved.yaml`` see the same resolved shape.
"""

from __future__ import annotations

from typing import Any

from experiment.errors import ConfigError
from experiment.sections.model import ModelConfig

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


def preset_fields(name: str, key: str = "model.preset") -> dict[str, Any]:
    """The shape fields of preset ``name``; an unknown name is one line listing the known ones."""
    if name not in PRESETS:
        raise ConfigError(f"config key '{key}': unknown preset '{name}' (known: {', '.join(PRESETS)})")
    return dict(PRESETS[name])


def preset_model_config(name: str) -> ModelConfig:
    """The model config of preset ``name`` alone (schema defaults elsewhere), validated."""
    cfg = ModelConfig(preset=name, **preset_fields(name))
    cfg.validate("model")
    return cfg
