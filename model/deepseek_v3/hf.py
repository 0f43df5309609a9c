"""The Hugging Face adapter of DeepSeek-V3: Transformers' ``DeepseekV3ForCausalLM``, ``model_type: deepseek_v3``
(GigaChat 3's checkpoints are of this type).

A renaming and transposition of weights (PyTorch's ``nn.Linear`` is [out, in], our kernels [in, out]), numpy only.
Layer i of Transformers' ``model.layers`` is ``dense_blocks/<i>`` for i < first_k_dense_replace, else
``blocks/<i - first_k_dense_replace>`` (the mixture-of-experts stack). The latent attention's tensors keep
Transformers' names: ``q_a_proj`` -> ``wq_a`` [D, q_lora], ``q_a_layernorm`` -> ``q_norm``, ``q_b_proj`` -> ``wq_b``
[q_lora, H, nope + rope] (or ``q_proj`` -> ``wq``), ``kv_a_proj_with_mqa`` -> ``wkv_a`` [D, kv_lora + rope],
``kv_a_layernorm`` -> ``kv_norm``, ``kv_b_proj`` -> ``wkv_b`` [kv_lora, H, nope + v], ``o_proj`` -> ``wo``. A MoE
layer's router is ``mlp.gate.weight`` [E, D] and its selection bias ``mlp.gate.e_score_correction_bias`` [E]; its
experts a tensor per expert and projection (as the published checkpoints, model/hf_tensors.py's
``ExpertTensors``), its shared experts ``mlp.shared_experts.{gate,up,down}_proj``.

RoPE: default or YaRN (DeepSeek-V3's own: experiment/sections/rope.py's Rope, and the softmax scale's mscale).
Not built, each one ConfigError line naming the key: another RoPE scaling, attention biases, an activation other
than SiLU, a routing other than sigmoid with ``noaux_tc``. Multi-token prediction: the published checkpoints carry
``num_nextn_predict_layers`` extra layers (``model.layers.<num_hidden_layers + j>.*``: ``enorm``, ``hnorm``,
``eh_proj``, a MoE decoder layer, ``shared_head.norm``, and copies of the embedding and head), which Transformers
itself does not load (vLLM and SGLang do, for speculative decoding); they are the ``mtp`` modules here, imported and
exported with the copies, which must equal the main model's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import nnx

from experiment.errors import ConfigError, DataError
from experiment.sections.rope import rope_from_hf as shared_rope_from_hf
from experiment.sections.rope import rope_of_config
from experiment.sections.rope import rope_to_hf as shared_rope_to_hf
from model.deepseek_v3.config import DeepseekV3Config
from model.hf_tensors import (
    ExpertTensors,
    HFTensor,
    TableAdapter,
    config_reader,
    source_of,
)
from model.stacking import BLOCKS

log = logging.getLogger(__name__)

ARCHITECTURE, MODEL_TYPE = "DeepseekV3ForCausalLM", "deepseek_v3"
FAMILY = "deepseek_v3"
WHERE = f"Hugging Face {MODEL_TYPE} config"
WEIGHTS = f"Hugging Face {MODEL_TYPE} weights"
PROJECTIONS = (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj"))  # ours, Transformers'
DENSE_BLOCKS, MTP = "dense_blocks", "mtp"


def layer_path(cfg: DeepseekV3Config, i: int) -> tuple[Any, ...]:
    """Where Transformers' layer ``i`` lives in our parameters."""
    return (DENSE_BLOCKS, i) if i < cfg.first_k_dense else (BLOCKS, i - cfg.first_k_dense)


def hf_tensors(cfg: DeepseekV3Config) -> list[HFTensor]:
    """Every parameter of the decoder and its ``DeepseekV3ForCausalLM`` name (the experts' with a ``*``); the
    multi-token prediction modules' as layers ``num_hidden_layers + j`` (their embedding and head copies are not
    in the table: ``DeepseekV3HF`` writes and checks them)."""
    table = [HFTensor(("embed",), "model.embed_tokens.weight")]
    for i in range(cfg.n_layers):
        table += layer_tensors(cfg, f"model.layers.{i}", layer_path(cfg, i), moe=i >= cfg.first_k_dense)
    for j in range(cfg.mtp_layers):
        hf, ours = f"model.layers.{cfg.n_layers + j}", (MTP, j)
        table += [HFTensor((*ours, "enorm", "scale"), f"{hf}.enorm.weight"),
                  HFTensor((*ours, "hnorm", "scale"), f"{hf}.hnorm.weight"),
                  HFTensor((*ours, "eh_proj"), f"{hf}.eh_proj.weight", 1),  # [2D, D] <- [D, 2D]
                  HFTensor((*ours, "head_norm", "scale"), f"{hf}.shared_head.norm.weight")]
        table += layer_tensors(cfg, hf, (*ours, "block"), moe=True)
    table.append(HFTensor(("final_norm", "scale"), "model.norm.weight"))
    if not cfg.tie_embeddings:
        table.append(HFTensor(("lm_head",), "lm_head.weight", 1))
    return table


def layer_tensors(cfg: DeepseekV3Config, hf: str, ours: tuple[Any, ...], moe: bool) -> list[HFTensor]:
    """One decoder layer's tensors: Transformers' ``hf`` prefix, our parameter path ``ours``."""
    d, f = cfg.d_model, cfg.d_expert
    attn, theirs = (*ours, "attn"), f"{hf}.self_attn"
    table = [HFTensor((*ours, "attn_norm", "scale"), f"{hf}.input_layernorm.weight"),
             HFTensor((*ours, "mlp_norm", "scale"), f"{hf}.post_attention_layernorm.weight")]
    if cfg.q_lora_rank:
        table += [HFTensor((*attn, "wq_a"), f"{theirs}.q_a_proj.weight", 1),
                  HFTensor((*attn, "q_norm", "scale"), f"{theirs}.q_a_layernorm.weight"),
                  HFTensor((*attn, "wq_b"), f"{theirs}.q_b_proj.weight", 1)]
    else:
        table.append(HFTensor((*attn, "wq"), f"{theirs}.q_proj.weight", 1))
    table += [HFTensor((*attn, "wkv_a"), f"{theirs}.kv_a_proj_with_mqa.weight", 1),
              HFTensor((*attn, "kv_norm", "scale"), f"{theirs}.kv_a_layernorm.weight"),
              HFTensor((*attn, "wkv_b"), f"{theirs}.kv_b_proj.weight", 1),
              HFTensor((*attn, "wo"), f"{theirs}.o_proj.weight", 2)]
    mlp = (*ours, "mlp")
    if not moe:
        return table + [HFTensor((*mlp, name), f"{hf}.mlp.{hf_name}.weight", 1) for name, hf_name in PROJECTIONS]
    expert_shapes = {"w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}
    table += [HFTensor((*mlp, "router"), f"{hf}.mlp.gate.weight", 1),  # [D, E] <- [E, D]
              HFTensor((*mlp, "router_bias"), f"{hf}.mlp.gate.e_score_correction_bias")]
    table += [ExpertTensors((*mlp, name), f"{hf}.mlp.experts.*.{hf_name}.weight", expert_shape=expert_shapes[name],
                            n_experts=cfg.n_experts) for name, hf_name in PROJECTIONS]
    if cfg.n_shared_experts:
        table += [HFTensor((*mlp, "shared", name), f"{hf}.mlp.shared_experts.{hf_name}.weight", 1)
                  for name, hf_name in PROJECTIONS]
    return table


def shared_copies(cfg: DeepseekV3Config) -> dict[str, str]:
    """The multi-token prediction layers' copies of the embedding and output head -> the main model's tensor."""
    head = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
    return {name: main for j in range(cfg.mtp_layers)
            for name, main in ((f"model.layers.{cfg.n_layers + j}.embed_tokens.weight", "model.embed_tokens.weight"),
                               (f"model.layers.{cfg.n_layers + j}.shared_head.head.weight", head))}


def to_hf_config(cfg: DeepseekV3Config, vocab_size: int, special_ids: Mapping[str, int] | None = None
                 ) -> dict[str, Any]:
    """config.json for ``DeepseekV3ForCausalLM`` with our shapes."""
    special = special_ids or {}
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": int(vocab_size),
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "moe_intermediate_size": cfg.d_expert,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_heads,
        "q_lora_rank": cfg.q_lora_rank or None,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "n_routed_experts": cfg.n_experts,
        "n_shared_experts": cfg.n_shared_experts,
        "num_experts_per_tok": cfg.top_k,
        "n_group": cfg.n_group,
        "topk_group": cfg.topk_group,
        "first_k_dense_replace": cfg.first_k_dense,
        "routed_scaling_factor": cfg.routed_scaling_factor,
        "norm_topk_prob": bool(cfg.norm_topk_prob),
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": cfg.mtp_layers,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope_to_hf(cfg),
        "rope_theta": cfg.rope_theta,
        "rope_interleave": bool(cfg.rope_interleave),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "bos_token_id": special.get("bos"),
        "eos_token_id": special.get("eos"),
        "pad_token_id": special.get("pad"),
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def rope_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The section's RoPE fields of ``rope_parameters`` (Transformers 5) or ``rope_theta`` / ``rope_scaling``
    (earlier files, DeepSeek-V3's own): default or YaRN (experiment/sections/rope.py); another kind is one error
    line."""
    fields = shared_rope_from_hf(hf, WHERE, supported=("none", "yarn"))
    if "rope_attention_factor" in fields or not fields.pop("rope_truncate", True):
        raise ConfigError(f"{WHERE}: yarn with attention_factor or truncate false is not supported")
    return fields


def rope_to_hf(cfg: DeepseekV3Config) -> dict[str, Any]:
    """``rope_parameters`` of the section (the inverse of ``rope_from_hf``)."""
    return shared_rope_to_hf(rope_of_config(cfg))


def config_from_hf(hf: Mapping[str, Any]) -> DeepseekV3Config:
    """Our model config for a ``deepseek_v3`` config.json; features the decoder lacks are one-line errors."""
    need = config_reader(hf, MODEL_TYPE)
    for key, supported in (("hidden_act", "silu"), ("attention_bias", False), ("scoring_func", "sigmoid"),
                           ("topk_method", "noaux_tc")):
        if hf.get(key, supported) != supported:
            raise ConfigError(f"{WHERE}: {key}={hf[key]!r} is not supported (only {supported!r})")
    heads = int(need("num_attention_heads"))
    if int(hf.get("num_key_value_heads") or heads) != heads:
        raise ConfigError(f"{WHERE}: num_key_value_heads={hf['num_key_value_heads']} is not supported (latent "
                          f"attention expands its keys and values for each of the {heads} heads)")
    experts_key = "n_routed_experts" if "n_routed_experts" in hf else "num_local_experts"
    cfg = DeepseekV3Config(
        d_model=int(need("hidden_size")), n_layers=int(need("num_hidden_layers")), n_heads=heads,
        q_lora_rank=int(hf.get("q_lora_rank") or 0), kv_lora_rank=int(need("kv_lora_rank")),
        qk_nope_head_dim=int(need("qk_nope_head_dim")), qk_rope_head_dim=int(need("qk_rope_head_dim")),
        v_head_dim=int(need("v_head_dim")), d_ff=int(need("intermediate_size")),
        first_k_dense=int(hf.get("first_k_dense_replace") or 0), n_experts=int(need(experts_key)),
        top_k=int(need("num_experts_per_tok")), d_expert=int(need("moe_intermediate_size")),
        n_shared_experts=int(hf.get("n_shared_experts") or 0), n_group=int(hf.get("n_group") or 1),
        topk_group=int(hf.get("topk_group") or 1), routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)), **rope_from_hf(hf),
        rope_interleave=bool(hf.get("rope_interleave", True)), norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), max_seq_len=int(need("max_position_embeddings")),
        mtp_layers=mtp_layers(hf),
    )
    cfg.validate("model")
    return cfg


class DeepseekV3HF(TableAdapter):
    """Export to and import from Transformers' ``DeepseekV3ForCausalLM`` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(ARCHITECTURE, MODEL_TYPE, FAMILY, hf_tensors, to_hf_config, config_from_hf)

    def ignored(self, name: str, model_cfg: DeepseekV3Config, hf_config: Mapping[str, Any]) -> bool:
        """Besides the common ones, the multi-token prediction layers' copies of the embedding and head (checked
        equal to the main model's by ``import_``)."""
        return super().ignored(name, model_cfg, hf_config) or name in shared_copies(model_cfg)

    def export(self, model: Any, model_cfg: Any, vocab_size: int,
               special_ids: Mapping[str, int] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``TableAdapter.export``, plus each multi-token prediction layer's copies of the embedding and head (the
        checkpoints' layout: vLLM and SGLang read them there)."""
        tensors, config = super().export(model, model_cfg, vocab_size, special_ids)
        for name, main in shared_copies(model_cfg).items():
            tensors[name] = tensors[main].copy()
        return tensors, config

    def import_(self, hf_config: Mapping[str, Any], state_dict: Mapping[str, Any], **kwargs: Any
                ) -> tuple[DeepseekV3Config, nnx.State]:
        """``TableAdapter.import_``; a multi-token prediction layer's embedding or head that is not the main
        model's (they are shared here, as in the DeepSeek-V3 report) is one DataError line naming it, and weights
        without any tensor of the layers config.json declares (a Transformers save) import without the module,
        with a warning (the config returned has ``mtp_layers`` 0)."""
        cfg, _ = self.config(hf_config)
        prefix = f"model.layers.{cfg.n_layers}."
        if cfg.mtp_layers and not any(name.startswith(prefix) for name in state_dict):
            # Transformers' save_pretrained drops the layer (its DeepseekV3 model does not build it) but keeps
            # config.json's count: such a folder imports as the model it holds, without the module
            log.warning("%s: config.json declares num_nextn_predict_layers %d, but the weights have no %s* tensor "
                        "(a Transformers save drops the layer): imported without the multi-token prediction module",
                        source_of(state_dict), cfg.mtp_layers, prefix)
            hf_config = {**hf_config, "num_nextn_predict_layers": 0}
            cfg, _ = self.config(hf_config)
        for name, main in shared_copies(cfg).items():
            for needed in (name, main):
                if needed not in state_dict:
                    raise DataError(f"{source_of(state_dict)}: tensor '{needed}' is missing ({WEIGHTS})")
            if not np.array_equal(np.asarray(state_dict[name]), np.asarray(state_dict[main])):
                raise DataError(f"{source_of(state_dict, name)}: tensor '{name}' differs from '{main}' (the "
                                f"multi-token prediction module shares the main model's; {WEIGHTS})")
        return super().import_(hf_config, state_dict, **kwargs)


def mtp_layers(hf: Mapping[str, Any]) -> int:
    return int(hf.get("num_nextn_predict_layers", hf.get("num_mtp_layers", 0)) or 0)


DEEPSEEK_V3_HF = DeepseekV3HF()
