"""The Hugging Face adapter of Qwen3-MoE: Transformers' ``Qwen3MoeForCausalLM``, ``model_type: qwen3_moe``.

Both directions are a renaming and transposition of weights (Flax kernels ``x @ W`` are [in, out], PyTorch's
``nn.Linear`` [out, in]); only numpy is needed, not torch. The experts are the one layout that is not a tensor per
parameter: the published checkpoints (and Transformers 5's ``save_pretrained``, which converts back from its fused
in-memory ``gate_up_proj``) hold one tensor per expert and projection,
``model.layers.<i>.mlp.experts.<e>.{gate,up,down}_proj.weight`` [out, in], while a layer of ours holds each
projection of all its experts as one [E, in, out] parameter (model/moe.py). ``ExpertTensors`` names the E tensors
of one such parameter with a ``*`` for the expert index; export splits the stacked parameter into them, and import
reads them through ``ExpertSource``, a view of the state dict that stacks a layer's E tensors when the parameter is
read (one projection of one layer in memory at a time, as model/hf_tensors.py reads every other tensor). The router
is ``mlp.gate.weight`` [E, D]; q_norm / k_norm and the two layer norms are as Qwen3's.

config.json: Transformers 5 writes ``num_local_experts`` (its ``num_experts`` is an alias) and ``rope_parameters``;
earlier files ``num_experts`` and ``rope_theta``: both are read, the export writes the published files' keys.
Features the decoder does not build are one ConfigError line naming the key: dense MLP layers
(``mlp_only_layers``, ``decoder_sparse_step`` > 1), sliding-window attention, RoPE scaling (YaRN), biases.
``router_aux_loss_coef`` is read into the section (the train step adds the load-balancing loss with it, as
Transformers does when it outputs router logits); the router z-loss weight and the routing are not Transformers'
and keep the section's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiment.errors import ConfigError
from model.hf_tensors import (
    ExpertTensors,
    HFTensor,
    TableAdapter,
    attention_tensors,
    config_reader,
)
from model.qwen3_moe.config import Qwen3MoeConfig
from model.stacking import BLOCKS

ARCHITECTURE, MODEL_TYPE = "Qwen3MoeForCausalLM", "qwen3_moe"
FAMILY = "qwen3_moe"
WHERE = f"Hugging Face {MODEL_TYPE} config"
WEIGHTS = f"Hugging Face {MODEL_TYPE} weights"
EXPERT_PROJECTIONS = (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj"))  # ours, Transformers'


def hf_tensors(cfg: Qwen3MoeConfig) -> list[HFTensor]:
    """Every parameter of the decoder and its ``Qwen3MoeForCausalLM`` name (the experts' with a ``*``)."""
    d, f = cfg.d_model, cfg.d_expert
    expert_shapes = {"w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}
    table = [HFTensor(("embed",), "model.embed_tokens.weight")]
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}", (BLOCKS, i)
        table += attention_tensors(i)
        table += [HFTensor((*ours, "attn", f"{x}_norm", "scale"), f"{hf}.self_attn.{x}_norm.weight") for x in "qk"]
        table += [HFTensor((*ours, "mlp_norm", "scale"), f"{hf}.post_attention_layernorm.weight"),
                  HFTensor((*ours, "mlp", "router"), f"{hf}.mlp.gate.weight", 1)]  # [D, E] <- [E, D]
        table += [ExpertTensors((*ours, "mlp", name), f"{hf}.mlp.experts.*.{theirs}.weight",
                                expert_shape=expert_shapes[name], n_experts=cfg.n_experts)
                  for name, theirs in EXPERT_PROJECTIONS]
    table.append(HFTensor(("final_norm", "scale"), "model.norm.weight"))
    if not cfg.tie_embeddings:
        table.append(HFTensor(("lm_head",), "lm_head.weight", 1))
    return table


def to_hf_config(cfg: Qwen3MoeConfig, vocab_size: int, special_ids: Mapping[str, int] | None = None) -> dict[str, Any]:
    """config.json for ``Qwen3MoeForCausalLM`` with our shapes (``cfg`` resolved)."""
    special = special_ids or {}
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": int(vocab_size),
        "hidden_size": cfg.d_model,
        # the width of dense MLP layers, which this model has none of (mlp_only_layers []): the active experts'
        # width, as the published files have it (768 x 8 = 6144, 1536 x 8 = 12288)
        "intermediate_size": cfg.top_k * cfg.d_expert,
        "moe_intermediate_size": cfg.d_expert,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,  # the pre-5.0 key, for older Transformers
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.top_k,
        "norm_topk_prob": bool(cfg.norm_topk_prob),
        "output_router_logits": False,
        "router_aux_loss_coef": cfg.router_aux_loss_coef,
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "bos_token_id": special.get("bos"),
        "eos_token_id": special.get("eos"),
        "pad_token_id": special.get("pad"),
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def rope_theta_from_hf(hf: Mapping[str, Any]) -> float:
    """RoPE's base from ``rope_parameters`` (Transformers 5) or ``rope_theta`` / ``rope_scaling`` (earlier); a
    scaled RoPE (YaRN, which the Qwen3 model cards suggest for contexts past 32k) is one error line naming it."""
    rope = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ConfigError(f"{WHERE}: rope_type '{kind}' is not supported (only default: an unscaled RoPE)")
    for params, key in ((rope, "rope_parameters.partial_rotary_factor"), (hf, "partial_rotary_factor")):
        if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ConfigError(f"{WHERE}: {key}={params['partial_rotary_factor']} is not supported "
                              "(only RoPE over the whole head)")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0)))


def config_from_hf(hf: Mapping[str, Any]) -> Qwen3MoeConfig:
    """Our model config for a ``qwen3_moe`` config.json; features the decoder lacks are one-line errors."""
    need = config_reader(hf, MODEL_TYPE)
    for key, supported in (("hidden_act", "silu"), ("attention_bias", False)):
        if hf.get(key, supported) != supported:
            raise ConfigError(f"{WHERE}: {key}={hf[key]!r} is not supported (only {supported!r})")
    if int(hf.get("decoder_sparse_step") or 1) != 1:
        raise ConfigError(f"{WHERE}: decoder_sparse_step={hf['decoder_sparse_step']} is not supported (only 1: every "
                          "layer a mixture of experts)")
    if hf.get("mlp_only_layers"):
        raise ConfigError(f"{WHERE}: mlp_only_layers={list(hf['mlp_only_layers'])} is not supported (dense MLP "
                          "layers; only [])")
    window, context = hf.get("sliding_window"), int(need("max_position_embeddings"))
    if hf.get("use_sliding_window") and window is not None and int(window) < context:
        raise ConfigError(f"{WHERE}: use_sliding_window with sliding_window={window} < max_position_embeddings="
                          f"{context} is not supported (sliding-window attention)")
    experts_key = "num_experts" if "num_experts" in hf else "num_local_experts"
    d, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    cfg = Qwen3MoeConfig(
        d_model=d, n_layers=int(need("num_hidden_layers")), n_heads=heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or d // heads),  # Transformers' fallback when the file has none
        n_experts=int(need(experts_key)), top_k=int(need("num_experts_per_tok")),
        d_expert=int(need("moe_intermediate_size")), norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        rope_theta=rope_theta_from_hf(hf), norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)), max_seq_len=context,
    )
    cfg.validate("model")
    return cfg


# Transformers' Qwen3MoeForCausalLM (see the module docstring)
QWEN3_MOE_HF = TableAdapter(ARCHITECTURE, MODEL_TYPE, FAMILY, hf_tensors, to_hf_config, config_from_hf)
