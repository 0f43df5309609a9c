"""Hand-counted FLOPs and parameters of the Qwen3-MoE decoder (model/qwen3_moe/model.py).

FLOPs per trained token count the ACTIVE parameters: each layer's attention projections (as Llama's: 2 FLOPs a
multiply-add), its full T x T attention scores and values (the PaLM MFU convention model/llama/flops.py follows),
the router and the ``top_k`` chosen experts (model/moe.py's ``moe_flops_per_token``: capacity routing's padding and
dropped slots not counted), and the output head; training is 3x the forward pass (model/family.py). The parameter
count is every parameter, every expert included.
"""

from __future__ import annotations

from model.family import remat_recompute_flops
from model.moe import moe_flops_per_token
from model.qwen3_moe.config import Qwen3MoeConfig


def attention_params(cfg: Qwen3MoeConfig) -> int:
    """One layer's q, k, v and output projections."""
    d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
    return d * h * hd + 2 * d * kv * hd + h * hd * d


def param_count(cfg: Qwen3MoeConfig, vocab_size: int) -> int:
    """All parameters, by formula (the tests check the built model against it): per layer the attention
    projections, the q/k norms, two RMSNorms, the router [D, E] and n_experts experts of 3 D d_expert; the
    embedding table, the untied head and the final norm."""
    d, hd = cfg.d_model, cfg.resolved_head_dim
    per_layer = attention_params(cfg) + 2 * hd + 2 * d + d * cfg.n_experts + 3 * cfg.n_experts * d * cfg.d_expert
    return cfg.n_layers * per_layer + vocab_size * d * (1 if cfg.tie_embeddings else 2) + d


def active_param_count(cfg: Qwen3MoeConfig, vocab_size: int) -> int:
    """The parameters one token goes through: ``param_count`` with ``top_k`` experts per layer instead of all."""
    return param_count(cfg, vocab_size) - cfg.n_layers * 3 * (cfg.n_experts - cfg.top_k) * cfg.d_model * cfg.d_expert


def attention_forward_flops_per_token(cfg: Qwen3MoeConfig, seq_len: int) -> float:
    """QK^T and PV of every layer, full T x T."""
    return 2.0 * 2 * seq_len * cfg.n_heads * cfg.resolved_head_dim * cfg.n_layers


def experts_forward_flops_per_token(cfg: Qwen3MoeConfig) -> float:
    """The gate, up and down projections of the ``top_k`` chosen experts, every layer."""
    return 2.0 * 3 * cfg.d_model * cfg.d_expert * cfg.top_k * cfg.n_layers


def forward_flops_per_token(cfg: Qwen3MoeConfig, vocab_size: int, seq_len: int) -> float:
    moe = moe_flops_per_token(cfg.d_model, cfg.d_expert, cfg.top_k, 0, cfg.n_experts)  # router + top_k experts
    blocks = cfg.n_layers * (2.0 * attention_params(cfg) + moe)
    return blocks + attention_forward_flops_per_token(cfg, seq_len) + 2.0 * cfg.d_model * vocab_size


def train_flops_per_token(cfg: Qwen3MoeConfig, vocab_size: int, seq_len: int) -> float:
    return 3.0 * forward_flops_per_token(cfg, vocab_size, seq_len)


def recompute_flops(cfg: Qwen3MoeConfig, vocab_size: int, seq_len: int, attention: str) -> float:
    """Forward work the backward pass does again, per trained token (model.family.remat_recompute_flops), plus,
    under save_dots and offload, the experts' forward: their ragged_dots (dropless) and batched einsums (capacity)
    are not the named projections (model/linear.py's ``PROJECTIONS``) the policy saves. The chunked loss's is
    model.family's."""
    blocks = forward_flops_per_token(cfg, vocab_size, seq_len) - 2.0 * cfg.d_model * vocab_size  # all but the head
    extra = remat_recompute_flops(cfg.remat, attention, blocks, attention_forward_flops_per_token(cfg, seq_len))
    if cfg.remat in ("save_dots", "offload"):
        extra += experts_forward_flops_per_token(cfg)
    return extra


def saved_values_per_token(cfg: Qwen3MoeConfig, remat: str, head_dim: int) -> float:
    """Activation values per trained token kept for the backward pass, all layers (the planner's memory estimate):
    per layer without remat the residual input and its norm, the RoPE'd queries, keys, values and the attention
    output, the second residual and its norm, the router logits, and per chosen expert its input row, gate, up,
    their product and its output row; save_dots/offload keep the layer input and the projections' outputs (q, k, v,
    o, router; not the experts', see ``recompute_flops``); full, the layer input (one layer's set live again)."""
    q, kv, d = cfg.n_heads * head_dim, cfg.n_kv_heads * head_dim, cfg.d_model
    every = 4 * d + 2 * q + 2 * kv + cfg.n_experts + cfg.top_k * (2 * d + 3 * cfg.d_expert)
    per_layer = {"none": every, "save_dots": 2 * d + q + 2 * kv + cfg.n_experts,
                 "offload": 2 * d + q + 2 * kv + cfg.n_experts, "full": d}[remat]
    return float(cfg.n_layers * per_layer + (every if remat == "full" else 0))
