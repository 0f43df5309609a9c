"""Hand-counted FLOPs of the Llama-shaped decoder (model/llama/model.py), for MFU.

XLA's ``cost_analysis`` counts a scanned layer once and counts rematerialised work, so we count
the model's matmuls by hand (a multiply-add is 2 FLOPs). Training costs 3x the forward pass
(forward, and backward for activations and for weights); recomputation under remat is not
counted, so this is model FLOPs utilisation, not hardware FLOPs utilisation. Attention counts
the full T x T score matrix, as in the PaLM paper's MFU formula and in MaxText's
``calculate_tflops_training_per_device`` until mid-2025 (it now halves causal attention); the MFUs MaxText
published for Llama-3.1-8B and -70B on v6e use the full count (tests/test_cost_planner.py re-derives them).
"""

from __future__ import annotations

from model.family import remat_recompute_flops
from model.llama.config import LlamaConfig


def matmul_params(cfg: LlamaConfig, vocab_size: int) -> int:
    """Parameters that take part in a matmul per token (norm scales excluded, embedding gather excluded)."""
    d, h, kv, hd, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim, cfg.d_ff
    per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    return cfg.n_layers * per_layer + d * vocab_size  # + the output projection (tied or not)


def param_count(cfg: LlamaConfig, vocab_size: int) -> int:
    """All parameters, by formula (tests check the model against it). The q/k/v biases (``qkv_bias``) and
    the per-head q/k norms (``qk_norm``) are parameters, but elementwise work: no FLOPs of their own here."""
    d, hd = cfg.d_model, cfg.resolved_head_dim
    norms = (2 * cfg.n_layers + 1) * d + (cfg.n_layers * 2 * hd if cfg.qk_norm else 0)
    biases = cfg.n_layers * (cfg.n_heads + 2 * cfg.n_kv_heads) * hd if cfg.qkv_bias else 0
    embeddings = vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return matmul_params(cfg, vocab_size) - d * vocab_size + embeddings + norms + biases


def forward_flops_per_token(cfg: LlamaConfig, vocab_size: int, seq_len: int) -> float:
    attention = 2 * 2 * seq_len * cfg.n_heads * cfg.resolved_head_dim * cfg.n_layers  # QK^T and PV
    return 2.0 * matmul_params(cfg, vocab_size) + attention


def train_flops_per_token(cfg: LlamaConfig, vocab_size: int, seq_len: int) -> float:
    return 3.0 * forward_flops_per_token(cfg, vocab_size, seq_len)


def attention_forward_flops_per_token(cfg: LlamaConfig, seq_len: int) -> float:
    """QK^T and PV of every layer, full T x T (as in ``forward_flops_per_token``)."""
    return 2.0 * 2 * seq_len * cfg.n_heads * cfg.resolved_head_dim * cfg.n_layers


def recompute_flops(cfg: LlamaConfig, vocab_size: int, seq_len: int, attention: str) -> float:
    """Forward work the backward pass does again, per trained token (hardware FLOPs - model FLOPs), for the
    attention kernel ``attention`` the config resolved to (model.family.remat_recompute_flops); the chunked
    loss's is model.family's to add."""
    blocks = forward_flops_per_token(cfg, vocab_size, seq_len) - 2.0 * cfg.d_model * vocab_size  # all but the head
    return remat_recompute_flops(cfg.remat, attention, blocks, attention_forward_flops_per_token(cfg, seq_len))
