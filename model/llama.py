"""The Llama family: model/decoder.py's decoder, model/flops.py's counts, and its Hugging Face adapter.

The HF adapter maps our parameters onto Transformers' ``LlamaForCausalLM`` and back. Our decoder
is Llama-shaped (RMSNorm, GQA attention with half-split RoPE, SwiGLU, optional tied embeddings), so
both directions are a renaming and transposition of weights: Flax stores ``x @ W`` kernels as
[in, out], PyTorch ``nn.Linear`` as [out, in]. Only numpy is needed here, not torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import nnx

from experiment.errors import ConfigError, DataError
from experiment.sections.model import ModelConfig
from experiment.sections.train import DEFAULT_AXIS_RULES
from model import flops
from model.decoder import Decoder
from model.family import ModelFamily, register_family


def _array(param: Any) -> np.ndarray:
    return np.asarray(param[...], dtype=np.float32)


def llama_state_dict(model: Any) -> dict[str, np.ndarray]:
    """Our NNX decoder's parameters under Transformers' Llama names, in PyTorch's [out, in] layout."""
    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": _array(model.embed)}
    for i, block in enumerate(model.blocks):
        prefix = f"model.layers.{i}"
        attn, mlp = block.attn, block.mlp
        wq, wk, wv, wo = (_array(attn.wq), _array(attn.wk), _array(attn.wv), _array(attn.wo))
        d = wq.shape[0]
        tensors.update({
            f"{prefix}.input_layernorm.weight": _array(block.attn_norm.scale),
            f"{prefix}.self_attn.q_proj.weight": wq.reshape(d, -1).T,  # [d, heads, head_dim] -> [heads*head_dim, d]
            f"{prefix}.self_attn.k_proj.weight": wk.reshape(d, -1).T,
            f"{prefix}.self_attn.v_proj.weight": wv.reshape(d, -1).T,
            f"{prefix}.self_attn.o_proj.weight": wo.reshape(-1, d).T,  # [heads, head_dim, d] -> [d, heads*head_dim]
            f"{prefix}.post_attention_layernorm.weight": _array(block.mlp_norm.scale),
            f"{prefix}.mlp.gate_proj.weight": _array(mlp.w_gate).T,
            f"{prefix}.mlp.up_proj.weight": _array(mlp.w_up).T,
            f"{prefix}.mlp.down_proj.weight": _array(mlp.w_down).T,
        })
    tensors["model.norm.weight"] = _array(model.final_norm.scale)
    if model.lm_head is not None:
        tensors["lm_head.weight"] = _array(model.lm_head).T
    return {name: np.ascontiguousarray(t) for name, t in tensors.items()}


def llama_config(model_cfg: Any, vocab_size: int, special_ids: Mapping[str, int] | None = None) -> dict[str, Any]:
    """config.json for ``LlamaForCausalLM`` with our shapes; ``model_cfg`` is a resolved ModelConfig."""
    special = special_ids or {}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab_size),
        "hidden_size": model_cfg.d_model,
        "intermediate_size": model_cfg.d_ff,
        "num_hidden_layers": model_cfg.n_layers,
        "num_attention_heads": model_cfg.n_heads,
        "num_key_value_heads": model_cfg.n_kv_heads,
        "head_dim": model_cfg.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": model_cfg.max_seq_len,
        "rms_norm_eps": model_cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": model_cfg.rope_theta},
        "rope_theta": model_cfg.rope_theta,  # the pre-5.0 key, for older Transformers
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": bool(model_cfg.tie_embeddings),
        "bos_token_id": special.get("bos"),
        "eos_token_id": special.get("eos"),
        "pad_token_id": special.get("pad"),
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def config_from_hf(hf_config: Mapping[str, Any]) -> ModelConfig:
    """Our ModelConfig for a Transformers Llama config.json; features our decoder lacks are errors."""
    def need(key: str) -> Any:
        if key not in hf_config:
            raise ConfigError(f"Hugging Face Llama config: key '{key}' is missing")
        return hf_config[key]

    if need("model_type") != "llama":
        raise ConfigError(f"Hugging Face config: model_type '{hf_config['model_type']}' is not llama")
    rope = hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"Hugging Face Llama config: rope type '{rope.get('rope_type', rope.get('type'))}' is not "
                          "supported (only the default RoPE)")
    for key, supported in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if hf_config.get(key, supported) != supported:
            raise ConfigError(f"Hugging Face Llama config: {key}={hf_config[key]!r} is not supported (only {supported!r})")
    d, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    head_dim = int(hf_config.get("head_dim") or d // heads)
    cfg = ModelConfig(
        d_model=d, n_layers=int(need("num_hidden_layers")), n_heads=heads,
        n_kv_heads=int(hf_config.get("num_key_value_heads") or heads),
        head_dim=0 if head_dim * heads == d else head_dim, d_ff=int(need("intermediate_size")),
        max_seq_len=int(need("max_position_embeddings")), rope_theta=float(rope.get("rope_theta", hf_config.get("rope_theta", 10_000.0))),
        norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
    )
    cfg.validate("model")
    return cfg


class LlamaHF:
    """Export to and import from Transformers' ``LlamaForCausalLM`` (see the module docstring)."""

    architecture = "LlamaForCausalLM"

    def export(self, model: Any, model_cfg: Any, vocab_size: int,
               special_ids: Mapping[str, int] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return llama_state_dict(model), llama_config(model_cfg, vocab_size, special_ids)

    def import_(self, hf_config: Mapping[str, Any], state_dict: Mapping[str, Any]) -> tuple[ModelConfig, nnx.State]:
        """The inverse of ``export``: every tensor is checked against the shape the config implies."""
        cfg = config_from_hf(hf_config)
        vocab_size = int(hf_config.get("vocab_size") or 0)
        state = nnx.state(LLAMA.abstract(cfg, vocab_size), nnx.Param)
        used: set[str] = set()

        def tensor(name: str, shape: tuple[int, ...], transpose: bool = True) -> np.ndarray:
            if name not in state_dict:
                raise DataError(f"Hugging Face Llama weights: tensor '{name}' is missing")
            used.add(name)
            value = np.asarray(state_dict[name], dtype=np.float32)
            value = value.T if transpose else value
            if value.size != int(np.prod(shape)):
                raise DataError(f"Hugging Face Llama weights: tensor '{name}' has shape {tuple(state_dict[name].shape)}, "
                                f"which does not fit {shape} of the config")
            return value.reshape(shape)

        pure = nnx.to_pure_dict(state)
        pure["embed"] = tensor("model.embed_tokens.weight", pure["embed"].shape, transpose=False)
        for i, block in pure["blocks"].items():
            prefix = f"model.layers.{i}"
            attn, mlp = block["attn"], block["mlp"]
            attn["wq"] = tensor(f"{prefix}.self_attn.q_proj.weight", attn["wq"].shape)
            attn["wk"] = tensor(f"{prefix}.self_attn.k_proj.weight", attn["wk"].shape)
            attn["wv"] = tensor(f"{prefix}.self_attn.v_proj.weight", attn["wv"].shape)
            attn["wo"] = tensor(f"{prefix}.self_attn.o_proj.weight", attn["wo"].shape)
            block["attn_norm"]["scale"] = tensor(f"{prefix}.input_layernorm.weight", (cfg.d_model,), transpose=False)
            block["mlp_norm"]["scale"] = tensor(f"{prefix}.post_attention_layernorm.weight", (cfg.d_model,),
                                                transpose=False)
            mlp["w_gate"] = tensor(f"{prefix}.mlp.gate_proj.weight", mlp["w_gate"].shape)
            mlp["w_up"] = tensor(f"{prefix}.mlp.up_proj.weight", mlp["w_up"].shape)
            mlp["w_down"] = tensor(f"{prefix}.mlp.down_proj.weight", mlp["w_down"].shape)
        pure["final_norm"]["scale"] = tensor("model.norm.weight", (cfg.d_model,), transpose=False)
        if not cfg.tie_embeddings:
            pure["lm_head"] = tensor("lm_head.weight", pure["lm_head"].shape)
        # rotary inverse frequencies are recomputed from rope_theta; anything else would be silently lost
        unused = sorted(k for k in state_dict if k not in used and not k.endswith("rotary_emb.inv_freq")
                        and not (cfg.tie_embeddings and k == "lm_head.weight"))
        if unused:
            raise DataError(f"Hugging Face Llama weights: {len(unused)} tensors have no place in the model, e.g. '{unused[0]}'")
        nnx.replace_by_pure_dict(state, pure)
        return cfg, state


def describe(cfg: ModelConfig) -> str:
    return f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads / {cfg.n_kv_heads} KV heads"


LLAMA = register_family(ModelFamily(
    name="llama",
    config_cls=ModelConfig,
    build=Decoder,
    flops=flops.train_flops_per_token,
    train_costs=flops.train_costs,
    param_count=flops.param_count,
    axis_rules=DEFAULT_AXIS_RULES,
    validate=lambda cfg: cfg.validate("model"),
    describe=describe,
    hf_adapter=LlamaHF(),
))
