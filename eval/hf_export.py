"""Export a trained decoder as a Hugging Face Transformers Llama model: safetensors, config.json, tokenizer.

Our decoder is Llama-shaped (RMSNorm, GQA attention with half-split RoPE, SwiGLU, optional tied
embeddings), so the export is a renaming and transposition of weights: Flax stores ``x @ W`` kernels
as [in, out], PyTorch ``nn.Linear`` as [out, in]. The folder loads with
``LlamaForCausalLM.from_pretrained`` and its fp32 logits match ours within 1e-4
(tests/test_eval_hf_export.py). Only numpy and safetensors are needed here, not torch.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from experiment.errors import DataError
from experiment.files import atomic_dir, atomic_write_text

log = logging.getLogger("eval.hf_export")

WEIGHTS_FILE = "model.safetensors"


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


def llama_config(model_cfg: Any, vocab_size: int, special_ids: dict[str, int] | None = None) -> dict[str, Any]:
    """config.json for ``LlamaForCausalLM`` with our shapes; ``model_cfg`` is a resolved ModelConfig."""
    special = special_ids or {}
    head_dim = model_cfg.head_dim or model_cfg.d_model // model_cfg.n_heads
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab_size),
        "hidden_size": model_cfg.d_model,
        "intermediate_size": model_cfg.d_ff,
        "num_hidden_layers": model_cfg.n_layers,
        "num_attention_heads": model_cfg.n_heads,
        "num_key_value_heads": model_cfg.n_kv_heads,
        "head_dim": head_dim,
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


def write_export(model: Any, model_cfg: Any, vocab_size: int, out_dir: Path, *, sp: Any = None,
                 special_ids: dict[str, int] | None = None, metadata: dict[str, str] | None = None) -> Path:
    """Write the export into a staging folder and move it over ``out_dir`` only when complete."""
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as staging:
        if sp is not None:  # the tokenizer stage's exporter writes its files into the staging folder
            from tokenizer.hf_export import export_hf

            export_hf(sp, staging, special_ids or {}, model_max_length=model_cfg.max_seq_len)
        tensors = llama_state_dict(model)
        save_file(tensors, str(staging / WEIGHTS_FILE), metadata={"format": "pt", **(metadata or {})})
        config = llama_config(model_cfg, vocab_size, special_ids)
        atomic_write_text(staging / "config.json", json.dumps(config, indent=2) + "\n")
        atomic_write_text(staging / "generation_config.json", json.dumps(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
             "pad_token_id": config["pad_token_id"]}, indent=2) + "\n")
    n_params = sum(t.size for t in tensors.values())
    log.info("Hugging Face Llama export (%d tensors, %.2fM parameters) in %s", len(tensors), n_params / 1e6, out_dir)
    return out_dir


def export_checkpoint(model: Any, step: int, meta: dict[str, Any], run_folder: Any, cfg: Any) -> Path:
    """Export a loaded checkpoint with the run's tokenizer into ``eval/hf/step_NNNNNNN``."""
    from tokenizer.spm import load_tokenizer
    from trainer.checkpoint import model_config_from_meta

    sp, manifest = load_tokenizer(run_folder.tokenizer)
    if meta.get("tokenizer_sha256") and meta["tokenizer_sha256"] != manifest.get("sha256"):
        raise DataError(f"the checkpoint was trained with tokenizer {meta['tokenizer_sha256'][:12]}..., not the one "
                        f"in {run_folder.tokenizer}: cannot export a matching tokenizer")
    out_dir = Path(run_folder.eval) / "hf" / f"step_{step:07d}"
    return write_export(model, model_config_from_meta(meta), meta["vocab_size"], out_dir,
                        sp=sp, special_ids=manifest.get("special_ids"),
                        metadata={"experiment": cfg.experiment.name, "tokenizer_sha256": manifest.get("sha256", "")})
