"""The Llama-shaped families' registrations: Llama, and Llama's decoder with switches.

    llama:   Llama 2/3 (RMSNorm, grouped-query attention with RoPE, SwiGLU; tied or untied embeddings)
    mistral: Llama-shaped (a sliding window at least the context long, or none, is full attention)
    qwen2:   q/k/v projection biases (``qkv_bias``), rope_theta 1e6 by default (Qwen2 and Qwen2.5)
    qwen3:   an RMSNorm over each query and key head before RoPE (``qk_norm``), no biases, head_dim 128

They share model/llama/model.py's decoder, model/llama/flops.py's counts and model/llama/hf.py's
adapter class; each has its own ``model:`` section class and config.json (model/llama/config.py, hf.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from model.family import ModelFamily, ParamRoles, register_family
from model.hf_tensors import TableAdapter
from model.llama import flops
from model.llama.config import AXIS_RULES, SECTIONS, LlamaConfig
from model.llama.hf import MISTRAL_HF, QWEN2_HF, QWEN3_HF, LlamaHF
from model.llama.model import QUANTIZED_MODULES, Decoder


def describe(cfg: LlamaConfig) -> str:
    return f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads / {cfg.n_kv_heads} KV heads"


# the decoder's input embedding, its untied head (absent when tied: ``tie_embeddings``) and its layer stack
ROLES = ParamRoles(embedding="embed", output_head="lm_head", layers=("blocks",))
TINY = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64)  # a few-layer shape
TINY_SHAPES: dict[str, dict[str, Any]] = {
    # three layers, the untied head, and Llama 3's RoPE scaling with every band present at head_dim 8: wavelengths
    # 6.3 (< 32 / 4: kept), 63 (between: the ramp), 628 and 6283 (> 32 / 0.5: divided by the factor)
    "llama": {**TINY, "n_layers": 3, "tie_embeddings": False, "rope_scaling": "llama3", "rope_factor": 4.0,
              "rope_low_freq_factor": 0.5, "rope_high_freq_factor": 4.0, "rope_original_max_len": 32},
    "mistral": TINY,  # untied, as the section's default
    "qwen2": TINY,  # tied, with q/k/v biases
    "qwen3": {**TINY, "head_dim": 16},  # tied, q/k norms, head_dim != d_model / n_heads
}


def _family(name: str, adapter: TableAdapter, validate: Callable[[LlamaConfig], None]) -> ModelFamily:
    return register_family(ModelFamily(
        name=name, config_cls=SECTIONS[name], build=Decoder, flops=flops.train_flops_per_token,
        param_count=flops.param_count, recompute_flops=flops.recompute_flops, axis_rules=AXIS_RULES,
        validate=validate, describe=describe, hf_adapter=adapter, quantized_modules=QUANTIZED_MODULES,
        roles=ROLES, tiny=TINY_SHAPES[name], run_keys=("context_attention",),
    ))


def _check_llama(cfg: LlamaConfig) -> None:
    cfg.validate("model")


LLAMA = _family("llama", LlamaHF, _check_llama)
MISTRAL = _family("mistral", MISTRAL_HF, MISTRAL_HF.check_export)
QWEN2 = _family("qwen2", QWEN2_HF, QWEN2_HF.check_export)
QWEN3 = _family("qwen3", QWEN3_HF, QWEN3_HF.check_export)
