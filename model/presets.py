"""Named model sizes, from the CPU demo to Llama-2-70B shapes.

``model.preset: 1b`` in a config fills the shape fields; any field the YAML sets to something
other than its schema default overrides the preset (e.g. ``model.preset=1b model.n_layers=8``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from experiment.errors import ConfigError
from experiment.sections.model import ModelConfig

SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len", "tie_embeddings")

PRESETS: dict[str, dict[str, Any]] = {
    # ~5M with a 4k vocabulary: trains in minutes on two CPU cores
    "demo-5m": dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=704, max_seq_len=128),
    "125m": dict(d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, d_ff=2048, max_seq_len=2048),
    "350m": dict(d_model=1024, n_layers=24, n_heads=16, n_kv_heads=4, d_ff=2816, max_seq_len=2048),
    "1b": dict(d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=5632, max_seq_len=2048),
    "3b": dict(d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8, d_ff=8192, max_seq_len=4096),
    "7b": dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=11008, max_seq_len=4096,
               tie_embeddings=False),
    "13b": dict(d_model=5120, n_layers=40, n_heads=40, n_kv_heads=8, d_ff=13824, max_seq_len=4096,
                tie_embeddings=False),
    "70b": dict(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672, max_seq_len=4096,
                tie_embeddings=False),
}


def resolve(model_cfg: ModelConfig) -> ModelConfig:
    """The config with its preset's shape filled in (explicit non-default fields win)."""
    if not getattr(model_cfg, "preset", ""):  # a family without presets
        return model_cfg
    if model_cfg.preset not in PRESETS:
        raise ConfigError(f"config key 'model.preset': unknown preset '{model_cfg.preset}' (known: {', '.join(PRESETS)})")
    defaults = ModelConfig()
    fields = dict(PRESETS[model_cfg.preset])
    for name in SHAPE_FIELDS:
        if getattr(model_cfg, name) != getattr(defaults, name):
            fields[name] = getattr(model_cfg, name)
    resolved = dataclasses.replace(model_cfg, **fields)
    resolved.validate("model")
    return resolved
