"""Gemma 3 (text)'s registration: its section, decoder, FLOPs, axis rules and Hugging Face adapter.

    gemma3: local sliding-window and global attention layers (5:1 by default), each with its own RoPE;
            q/k norms, four norms per layer with (1 + w) scales, GeGLU, sqrt(d_model)-scaled tied embeddings
            (Gemma Team, "Gemma 3 Technical Report", 2025; Transformers' Gemma3ForCausalLM)
"""

from __future__ import annotations

from model.family import ModelFamily, register_family
from model.gemma3 import flops
from model.gemma3.config import AXIS_RULES, GLOBAL, SECTIONS, Gemma3Config
from model.gemma3.hf import GEMMA3_HF
from model.gemma3.model import QUANTIZED_MODULES, Decoder


def describe(cfg: Gemma3Config) -> str:
    types = cfg.layer_types()
    n_global = types.count(GLOBAL)
    return (f"{cfg.n_layers} layers ({cfg.n_layers - n_global} local, "
            f"window {cfg.sliding_window} : {n_global} global), "
            f"d_model {cfg.d_model}, {cfg.n_heads} heads / {cfg.n_kv_heads} KV heads of {cfg.resolved_head_dim}")


def validate(cfg: Gemma3Config) -> None:
    cfg.validate("model")


GEMMA3 = register_family(ModelFamily(
    name="gemma3", config_cls=SECTIONS["gemma3"], build=Decoder, flops=flops.train_flops_per_token,
    param_count=flops.param_count, recompute_flops=flops.recompute_flops, head_dim=lambda cfg: cfg.resolved_head_dim,
    axis_rules=AXIS_RULES, validate=validate, describe=describe, hf_adapter=GEMMA3_HF,
    quantized_modules=QUANTIZED_MODULES,
))
