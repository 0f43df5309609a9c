"""DeepSeek-V3's registration: its section, decoder, FLOPs, axis rules, auxiliary loss and Hugging Face adapter.

    deepseek_v3: multi-head latent attention (a compressed KV latent, decoupled RoPE), dense first layers, then
                 mixtures of experts (sigmoid scores with a selection bias, group-limited top-k, routed scaling,
                 shared experts), untied embeddings (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv
                 2412.19437; Transformers' DeepseekV3ForCausalLM); GigaChat 3's architecture by its model cards

FLOPs count the active parameters (the routers, top_k routed and the shared experts per token; the multi-token
prediction modules when they train); the parameter count, all of them (the prediction modules' too).
"""

from __future__ import annotations

from model.deepseek_v3 import flops
from model.deepseek_v3.config import AXIS_RULES, PRESETS, SECTIONS, DeepseekV3Config
from model.deepseek_v3.hf import DEEPSEEK_V3_HF
from model.deepseek_v3.model import AUX_LOSSES, Decoder, aux_metrics
from model.family import ModelFamily, ParamRoles, params_label, register_family


def describe(cfg: DeepseekV3Config) -> str:
    total, active = flops.param_count(cfg, 0), flops.active_param_count(cfg, 0)
    return (f"{cfg.n_layers} layers ({cfg.first_k_dense} dense), d_model {cfg.d_model}, {cfg.n_heads} latent-attention "
            f"heads (kv latent {cfg.kv_lora_rank}), {cfg.n_experts} experts of {cfg.d_expert} (top {cfg.top_k}, "
            f"{cfg.n_shared_experts} shared), {cfg.mtp_layers} multi-token prediction module(s)"
            f"{'' if cfg.mtp_depth else ' (not trained)' if cfg.mtp_layers else ''}; {params_label(total)} "
            f"parameters besides the embeddings, {params_label(active)} active")


def validate(cfg: DeepseekV3Config) -> None:
    cfg.validate("model")


# the run's choices, not the checkpoint's shape: under model.init_from the YAML's values are kept
RUN_KEYS = ("routing", "capacity_factor", "router_aux_loss_coef", "router_bias_update_rate", "mtp_loss_weight",
            "mla_decode")
# the input embedding, the untied head, and the MoE layer stack (the dense first layers are a short list)
ROLES = ParamRoles(embedding="embed", output_head="lm_head", layers=("blocks",))
TINY = PRESETS["tiny"]

DEEPSEEK_V3 = register_family(ModelFamily(
    name="deepseek_v3", config_cls=SECTIONS["deepseek_v3"], build=Decoder, flops=flops.train_flops_per_token,
    param_count=flops.param_count, active_param_count=flops.active_param_count,
    recompute_flops=flops.recompute_flops, head_dim=lambda cfg: cfg.qk_head_dim,
    axis_rules=AXIS_RULES, validate=validate, describe=describe, hf_adapter=DEEPSEEK_V3_HF,
    # no int8/fp8 training (trainer/quantization.py refuses a family with auxiliary losses)
    saved_values_per_token=flops.saved_values_per_token, aux_losses=AUX_LOSSES, aux_metrics=aux_metrics,
    run_keys=RUN_KEYS, roles=ROLES, tiny=TINY, router_bias_rate=lambda cfg: cfg.router_bias_update_rate,
    predicts_ahead=lambda cfg: cfg.mtp_depth,
    idle_params=lambda cfg: ("mtp",) if cfg.mtp_layers and not cfg.mtp_depth else (),
))
