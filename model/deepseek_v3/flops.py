"""Hand-counted FLOPs and parameters of the DeepSeek-V3 decoder (model/deepseek_v3/model.py).

FLOPs per trained token count the ACTIVE parameters (2 FLOPs a multiply-add): every layer's latent attention
projections (the query bottleneck, the latent and rope key, the latent's expansion to keys and values, the
output), its full T x T attention scores (queries and keys nope + rope wide) and values (v wide: the zero padding
the kernels run is not model work), the dense layers' SwiGLU, the MoE layers' router, top_k routed experts and
shared experts, and the output head; training is 3x the forward pass (model/family.py). The multi-token prediction
modules a step runs (``mtp_depth``) add per depth their input projection [2D, D], one MoE layer with its attention,
and one more pass through the output head. The parameter count is every parameter, every expert, the routers'
selection biases and the prediction modules included (their embedding and head are the main model's: DeepSeek-V3's
checkpoints hold copies, 2 x vocab x D more, which the 685B of its model card counts).
"""

from __future__ import annotations

from model.deepseek_v3.config import DeepseekV3Config
from model.family import remat_recompute_flops
from model.moe import moe_flops_per_token


def attention_params(cfg: DeepseekV3Config) -> int:
    """One layer's latent attention matrices (its two RMSNorm scales not included)."""
    d, h, qk = cfg.d_model, cfg.n_heads, cfg.qk_head_dim
    q = d * cfg.q_lora_rank + cfg.q_lora_rank * h * qk if cfg.q_lora_rank else d * h * qk
    kv = d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    return q + kv + h * cfg.v_head_dim * d


def layer_norm_params(cfg: DeepseekV3Config) -> int:
    """One layer's RMSNorm scales: the two around its blocks, the query bottleneck's and the latent's."""
    return 2 * cfg.d_model + cfg.q_lora_rank + cfg.kv_lora_rank


def moe_params(cfg: DeepseekV3Config, experts: int) -> int:
    """One MoE layer's router, selection bias, ``experts`` routed experts and the shared ones."""
    d, f = cfg.d_model, cfg.d_expert
    return d * cfg.n_experts + cfg.n_experts + 3 * experts * d * f + 3 * d * cfg.n_shared_experts * f


def mtp_module_params(cfg: DeepseekV3Config, experts: int) -> int:
    """One multi-token prediction module with ``experts`` routed experts: its three norms, input projection and
    MoE layer (not the embedding and head it shares)."""
    d = cfg.d_model
    return 3 * d + 2 * d * d + attention_params(cfg) + layer_norm_params(cfg) + moe_params(cfg, experts)


def param_count(cfg: DeepseekV3Config, vocab_size: int) -> int:
    per_layer = attention_params(cfg) + layer_norm_params(cfg)
    dense = cfg.first_k_dense * (per_layer + 3 * cfg.d_model * cfg.d_ff)
    moe = cfg.n_moe_layers * (per_layer + moe_params(cfg, cfg.n_experts))
    mtp = cfg.mtp_layers * mtp_module_params(cfg, cfg.n_experts)
    return dense + moe + mtp + vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2) + cfg.d_model


def active_param_count(cfg: DeepseekV3Config, vocab_size: int) -> int:
    """``param_count`` with ``top_k`` routed experts per MoE layer instead of all, and the multi-token prediction
    modules only as the step runs them."""
    idle = 3 * (cfg.n_experts - cfg.top_k) * cfg.d_model * cfg.d_expert
    idle_mtp = (cfg.mtp_layers - cfg.mtp_depth) * mtp_module_params(cfg, cfg.n_experts) + cfg.mtp_depth * (
        mtp_module_params(cfg, cfg.n_experts) - mtp_module_params(cfg, cfg.top_k))
    return param_count(cfg, vocab_size) - cfg.n_moe_layers * idle - idle_mtp


def attention_forward_flops_per_token(cfg: DeepseekV3Config, seq_len: int) -> float:
    """QK^T (nope + rope wide) and PV (v wide) of every layer and multi-token prediction layer run, full T x T."""
    return 2.0 * seq_len * cfg.n_heads * (cfg.qk_head_dim + cfg.v_head_dim) * (cfg.n_layers + cfg.mtp_depth)


def experts_forward_flops_per_token(cfg: DeepseekV3Config) -> float:
    """The routed and shared experts' gate, up and down projections, every MoE layer (the prediction modules' too)."""
    return (2.0 * 3 * cfg.d_model * cfg.d_expert * (cfg.top_k + cfg.n_shared_experts)
            * (cfg.n_moe_layers + cfg.mtp_depth))


def forward_flops_per_token(cfg: DeepseekV3Config, vocab_size: int, seq_len: int) -> float:
    moe = moe_flops_per_token(cfg.d_model, cfg.d_expert, cfg.top_k, cfg.n_shared_experts, cfg.n_experts)
    blocks = (cfg.n_layers * 2.0 * attention_params(cfg) + cfg.first_k_dense * 2.0 * 3 * cfg.d_model * cfg.d_ff
              + cfg.n_moe_layers * moe)
    # each prediction module run: its input projection, its MoE layer, one more pass through the head
    mtp = cfg.mtp_depth * (2.0 * 2 * cfg.d_model ** 2 + 2.0 * attention_params(cfg) + moe
                           + 2.0 * cfg.d_model * vocab_size)
    return blocks + mtp + attention_forward_flops_per_token(cfg, seq_len) + 2.0 * cfg.d_model * vocab_size


def train_flops_per_token(cfg: DeepseekV3Config, vocab_size: int, seq_len: int) -> float:
    return 3.0 * forward_flops_per_token(cfg, vocab_size, seq_len)


def recompute_flops(cfg: DeepseekV3Config, vocab_size: int, seq_len: int, attention: str) -> float:
    """Forward work the backward pass does again (model.family.remat_recompute_flops); under save_dots and offload
    also the experts' forward (ragged_dots and batched einsums, which the policy does not save)."""
    blocks = forward_flops_per_token(cfg, vocab_size, seq_len) - (1 + cfg.mtp_depth) * 2.0 * cfg.d_model * vocab_size
    extra = remat_recompute_flops(cfg.remat, attention, blocks, attention_forward_flops_per_token(cfg, seq_len))
    if cfg.remat in ("save_dots", "offload"):
        extra += experts_forward_flops_per_token(cfg)
    return extra


def saved_values_per_token(cfg: DeepseekV3Config, remat: str, head_dim: int) -> float:
    """Activation values per trained token kept for the backward pass, all layers (the planner's estimate where no
    fit check ran): without remat each layer's residuals and norms, the query bottleneck and latent, the queries,
    keys, padded values and attention output, and its MLP's (the dense SwiGLU's gate, up and product, or the
    router logits and each chosen and shared expert's rows); save_dots/offload the projections' outputs (named in
    model/linear.py: the routed experts' are recomputed); full, the
    layer input (one layer's set live again)."""
    d, h, qk = cfg.d_model, cfg.n_heads, cfg.qk_head_dim
    attention = 4 * d + cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim + 4 * h * qk
    dense = attention + 3 * cfg.d_ff
    moe = attention + cfg.n_experts + cfg.top_k * (2 * d + 3 * cfg.d_expert) + 3 * cfg.n_shared_experts * cfg.d_expert
    dots = (2 * d + cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim + h * qk
            + h * (cfg.qk_nope_head_dim + cfg.v_head_dim) + d)
    mtp = 3 * d  # a prediction module's normed inputs and projection, besides its MoE layer's
    if remat == "none":
        return float(cfg.first_k_dense * dense + (cfg.n_moe_layers + cfg.mtp_depth) * moe + cfg.mtp_depth * mtp)
    if remat in ("save_dots", "offload"):
        return float(cfg.first_k_dense * (dots + 2 * cfg.d_ff) + (cfg.n_moe_layers + cfg.mtp_depth)
                     * (dots + cfg.n_experts) + cfg.mtp_depth * mtp)
    return float((cfg.n_layers + cfg.mtp_depth) * d + max(dense, moe) + cfg.mtp_depth * mtp)
