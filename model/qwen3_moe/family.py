"""Qwen3-MoE's registration: its section, decoder, FLOPs, axis rules, auxiliary losses and Hugging Face adapter.

    qwen3_moe: Qwen3's attention (GQA, q/k norms, RoPE, no biases) and a mixture of experts in every layer
               (softmax router, top-k of n_experts SwiGLU experts, norm_topk_prob, no shared expert), untied
               embeddings; a load-balancing loss (Transformers' definition) and an optional router z-loss, added
               to the train loss and logged as train/aux/load_balance and train/aux/router_z
               (Qwen Team, "Qwen3 Technical Report", 2025; Transformers' Qwen3MoeForCausalLM)

FLOPs count the active parameters (the router and top_k experts per token); the parameter count, all of them.
"""

from __future__ import annotations

from model.family import ModelFamily, ParamRoles, params_label, register_family
from model.qwen3_moe import flops
from model.qwen3_moe.config import AXIS_RULES, PRESETS, SECTIONS, Qwen3MoeConfig
from model.qwen3_moe.hf import QWEN3_MOE_HF
from model.qwen3_moe.model import AUX_LOSSES, Decoder, aux_metrics


def describe(cfg: Qwen3MoeConfig) -> str:
    total, active = flops.param_count(cfg, 0), flops.active_param_count(cfg, 0)  # the vocabulary is the run's
    return (f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads / {cfg.n_kv_heads} KV heads of "
            f"{cfg.resolved_head_dim}, {cfg.n_experts} experts of {cfg.d_expert} (top {cfg.top_k}, {cfg.routing}); "
            f"{params_label(total)} parameters besides the embeddings, {params_label(active)} active")


def validate(cfg: Qwen3MoeConfig) -> None:
    cfg.validate("model")


# the run's choices, not the checkpoint's shape: under model.init_from the YAML's values are kept
RUN_KEYS = ("routing", "capacity_factor", "router_aux_loss_coef", "router_z_loss_coef")
# the decoder's input embedding, its untied head (absent when tied) and its layer stack
ROLES = ParamRoles(embedding="embed", output_head="lm_head", layers=("blocks",))
TINY = PRESETS["tiny"]  # 2 layers, d_model 64, 4 experts (top 2), untied: the head's role is checked too

QWEN3_MOE = register_family(ModelFamily(
    name="qwen3_moe", config_cls=SECTIONS["qwen3_moe"], build=Decoder, flops=flops.train_flops_per_token,
    param_count=flops.param_count, active_param_count=flops.active_param_count,
    recompute_flops=flops.recompute_flops, head_dim=lambda cfg: cfg.resolved_head_dim,
    axis_rules=AXIS_RULES, validate=validate, describe=describe, hf_adapter=QWEN3_MOE_HF,
    # no int8/fp8 training yet (trainer/quantization.py refuses a family with auxiliary losses)
    saved_values_per_token=flops.saved_values_per_token, aux_losses=AUX_LOSSES, aux_metrics=aux_metrics,
    run_keys=RUN_KEYS, roles=ROLES, tiny=TINY,
))
