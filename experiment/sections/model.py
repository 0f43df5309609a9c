from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    preset: str = ""  # a named size from model.presets; explicit fields below override it
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 688
    max_seq_len: int = 1024
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    z_loss: float = 0.0
