"""Hand-counted FLOPs and parameters of Gemma 3's decoder (model/gemma3/model.py), for MFU and the planner.

As for Llama (model/llama/flops.py): a multiply-add is 2 FLOPs, training costs 3x the forward pass, XLA's
``cost_analysis`` is not used (it counts a scanned layer once). Attention is counted the way Llama's is,
each query against every key it may see without halving for causality: T keys for a global layer, and
min(sliding_window, T) for a local one. The local count is the window's and not T's because the window is
the model's work: a flash kernel with a local mask (splash's ``LocalMask``) skips the blocks outside it, so
counting T x T there would credit work nobody does and overstate MFU 5:1-interleaved models by up to ~5x on
attention at long sequences. (XLA's dot_product and the einsum reference do compute the whole masked
T x T scores; that is wasted hardware work, not model work, and is not counted either.) MaxText's Gemma 3
count (``calculate_gemma3_tflops_training_per_device``) likewise charges a local layer min(window, T) keys
per query (and then halves all attention for causality, which Llama's count here does not, so neither
does this one).
"""

from __future__ import annotations

from model.family import remat_recompute_flops
from model.gemma3.config import GLOBAL, Gemma3Config


def matmul_params(cfg: Gemma3Config, vocab_size: int) -> int:
    """Parameters that take part in a matmul per token (norm scales and the embedding gather excluded)."""
    d, h, kv, hd, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim, cfg.d_ff
    per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    return cfg.n_layers * per_layer + d * vocab_size  # + the tied output projection


def param_count(cfg: Gemma3Config, vocab_size: int) -> int:
    """All parameters, by formula: the matmuls', the tied embedding counted once, and per layer four d_model
    norms plus the query and key norms over head_dim; the final norm. The norms are elementwise work: no
    FLOPs of their own here."""
    d, hd = cfg.d_model, cfg.resolved_head_dim
    norms = cfg.n_layers * (4 * d + 2 * hd) + d
    return matmul_params(cfg, vocab_size) + norms  # the embedding table is the output projection


def keys_per_query(cfg: Gemma3Config, seq_len: int) -> int:
    """Keys each query is counted against, summed over the layers (see the module docstring)."""
    local = min(cfg.sliding_window, seq_len)
    return sum(seq_len if kind == GLOBAL else local for kind in cfg.layer_types())


def attention_forward_flops_per_token(cfg: Gemma3Config, seq_len: int) -> float:
    """QK^T and PV of every layer, local layers over their window."""
    return 2.0 * 2 * cfg.n_heads * cfg.resolved_head_dim * keys_per_query(cfg, seq_len)


def forward_flops_per_token(cfg: Gemma3Config, vocab_size: int, seq_len: int) -> float:
    return 2.0 * matmul_params(cfg, vocab_size) + attention_forward_flops_per_token(cfg, seq_len)


def train_flops_per_token(cfg: Gemma3Config, vocab_size: int, seq_len: int) -> float:
    return 3.0 * forward_flops_per_token(cfg, vocab_size, seq_len)


def recompute_flops(cfg: Gemma3Config, vocab_size: int, seq_len: int, attention: str) -> float:
    """Forward work the backward pass does again, per trained token (hardware FLOPs - model FLOPs), for the
    attention kernel ``attention`` the config resolved to (model.family.remat_recompute_flops); the chunked
    loss's is model.family's to add."""
    blocks = forward_flops_per_token(cfg, vocab_size, seq_len) - 2.0 * cfg.d_model * vocab_size  # all but the head
    return remat_recompute_flops(cfg.remat, attention, blocks, attention_forward_flops_per_token(cfg, seq_len))
