"""Gemma 3 (text)'s registration: its section, decoder, FLOPs, axis rules and Hugging Face adapter.

    gemma3: local sliding-window and global attention layers (5:1 by default), each with its own RoPE;
            q/k norms, four norms per layer with (1 + w) scales, GeGLU, sqrt(d_model)-scaled tied embeddings
            (Gemma Team, "Gemma 3 Technical Report", 2025; Transformers' Gemma3ForCausalLM)
"""

from __future__ import annotations

from model.family import ModelFamily, ParamRoles, register_family
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


# a few-layer shape: 5 layers of 2 local : 1 global (one scanned group and a tail of two, so both kinds of layer
# run in the scan and after it), a window of 5 under longer sequences, head_dim != d_model / n_heads and
# query_pre_attn_scalar != head_dim
TINY = dict(d_model=32, n_layers=5, global_every=3, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=64, sliding_window=5,
            query_pre_attn_scalar=12, max_seq_len=64, rope_theta_global=1000.0)

GEMMA3 = register_family(ModelFamily(
    name="gemma3", config_cls=SECTIONS["gemma3"], build=Decoder, flops=flops.train_flops_per_token,
    param_count=flops.param_count, recompute_flops=flops.recompute_flops, head_dim=lambda cfg: cfg.resolved_head_dim,
    axis_rules=AXIS_RULES, validate=validate, describe=describe, hf_adapter=GEMMA3_HF,
    quantized_modules=QUANTIZED_MODULES, roles=ParamRoles(embedding="embed", output_head=None, layers=("blocks",)),
    tiny=TINY,
))
