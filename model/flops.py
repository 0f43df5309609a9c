"""Hand-counted FLOPs of the decoder, for MFU.

XLA's ``cost_analysis`` counts a scanned layer once and counts rematerialised work, so we count
the model's matmuls by hand (a multiply-add is 2 FLOPs). Training costs 3x the forward pass
(forward, and backward for activations and for weights); recomputation under remat is not
counted, so this is model FLOPs utilisation, not hardware FLOPs utilisation. Attention counts
the full T x T score matrix, as in the PaLM paper's MFU formula.
"""

from __future__ import annotations

from experiment.sections.model import ModelConfig


def matmul_params(cfg: ModelConfig, vocab_size: int) -> int:
    """Parameters that take part in a matmul per token (norm scales excluded, embedding gather excluded)."""
    d, h, kv, hd, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim, cfg.d_ff
    per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    return cfg.n_layers * per_layer + d * vocab_size  # + the output projection (tied or not)


def param_count(cfg: ModelConfig, vocab_size: int) -> int:
    """All parameters, by formula (tests check the model against it)."""
    d = cfg.d_model
    norms = (2 * cfg.n_layers + 1) * d
    embeddings = vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return matmul_params(cfg, vocab_size) - d * vocab_size + embeddings + norms


def forward_flops_per_token(cfg: ModelConfig, vocab_size: int, seq_len: int) -> float:
    attention = 2 * 2 * seq_len * cfg.n_heads * cfg.resolved_head_dim * cfg.n_layers  # QK^T and PV
    return 2.0 * matmul_params(cfg, vocab_size) + attention


def train_flops_per_token(cfg: ModelConfig, vocab_size: int, seq_len: int) -> float:
    return 3.0 * forward_flops_per_token(cfg, vocab_size, seq_len)
