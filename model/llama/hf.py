"""The Hugging Face adapters of the Llama-shaped families: Llama, Mistral, Qwen2/2.5, Qwen3.

The HF adapter maps our parameters onto Transformers' ``LlamaForCausalLM`` and back. Our decoder
is Llama-shaped (RMSNorm, GQA attention with half-split RoPE, SwiGLU, optional tied embeddings), so
both directions are a renaming and transposition of weights: Flax stores ``x @ W`` kernels as
[in, out], PyTorch ``nn.Linear`` as [out, in]. Only numpy is needed here, not torch.

``llama_shaped_adapter`` makes the adapter (model/hf_tensors.py's ``TableAdapter``) of every family whose
Transformers model is Llama's with a few switches (Mistral, Qwen2, Qwen3: the config.json builders below): one
table (``hf_tensors``) names each of our parameters' HF tensor and layout, and both directions walk it. Importing
reads one tensor at a time from a mapping (model/hf_checkpoint.py passes a lazy one over the safetensors files),
checks its shape, casts it to the parameter dtype and hands it to ``place`` (which may put it straight onto its
devices), so no second full copy of the model is made on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from experiment.errors import ConfigError
from experiment.sections.rope import rope_from_hf, rope_of_config, rope_to_hf
from model.hf_tensors import (
    HFTensor,
    TableAdapter,
    attention_tensors,
    config_reader,
)
from model.llama.config import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config


def hf_tensors(cfg: LlamaConfig) -> list[HFTensor]:
    """Every parameter of a Llama-shaped decoder with ``cfg`` and its Transformers name."""
    table = [HFTensor(("embed",), "model.embed_tokens.weight")]
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}", ("blocks", i)
        attn = (*ours, "attn")
        table += attention_tensors(i)
        if cfg.qkv_bias:
            table += [HFTensor((*attn, f"b{x}"), f"{hf}.self_attn.{x}_proj.bias", flat=True) for x in "qkv"]
        if cfg.qk_norm:
            table += [HFTensor((*attn, f"{x}_norm", "scale"), f"{hf}.self_attn.{x}_norm.weight") for x in "qk"]
        table += [
            HFTensor((*ours, "mlp_norm", "scale"), f"{hf}.post_attention_layernorm.weight"),
            HFTensor((*ours, "mlp", "w_gate"), f"{hf}.mlp.gate_proj.weight", 1),
            HFTensor((*ours, "mlp", "w_up"), f"{hf}.mlp.up_proj.weight", 1),
            HFTensor((*ours, "mlp", "w_down"), f"{hf}.mlp.down_proj.weight", 1),
        ]
    table.append(HFTensor(("final_norm", "scale"), "model.norm.weight"))
    if not cfg.tie_embeddings:
        table.append(HFTensor(("lm_head",), "lm_head.weight", 1))
    return table


def rope_hf(cfg: LlamaConfig) -> dict[str, Any]:
    """Transformers' ``rope_parameters`` for our RoPE settings (experiment/sections/rope.py)."""
    return rope_to_hf(rope_of_config(cfg))


def llama_config(model_cfg: LlamaConfig, vocab_size: int,
                 special_ids: Mapping[str, int] | None = None) -> dict[str, Any]:
    """config.json for ``LlamaForCausalLM`` with our shapes; ``model_cfg`` is a resolved LlamaConfig."""
    special = special_ids or {}
    rope = rope_hf(model_cfg)
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
        "rope_parameters": rope,
        "rope_theta": model_cfg.rope_theta,  # the pre-5.0 keys, for older Transformers
        **({"rope_scaling": rope} if rope["rope_type"] != "default" else {}),
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


def check_full_attention(hf_config: Mapping[str, Any], where: str) -> None:
    """Sliding-window attention is not implemented: a window shorter than the model's context is an error."""
    window, context = hf_config.get("sliding_window"), hf_config.get("max_position_embeddings") or 0
    if window is None or window >= context:
        return
    uses = hf_config.get("use_sliding_window", True)
    sliding = [t for t in hf_config.get("layer_types") or [] if t != "full_attention"]
    if uses and (sliding or "layer_types" not in hf_config):
        raise ConfigError(f"{where}: sliding_window={window} < max_position_embeddings={context} "
                          "(sliding-window attention is not supported)")


def config_from_hf(hf_config: Mapping[str, Any], model_type: str = "llama", config_cls: type[LlamaConfig] = LlamaConfig,
                   family: str = "llama", **switches: Any) -> LlamaConfig:
    """Our model config for a Transformers Llama-shaped config.json; features our decoder lacks are errors.

    ``switches``: the family's fixed features (``qkv_bias``, ``qk_norm``) and defaults (``head_dim``:
    Qwen3's config default when the file has none)."""
    where = f"Hugging Face {model_type} config"
    need = config_reader(hf_config, model_type)
    for key, supported in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False),
                           ("pretraining_tp", 1)):
        if hf_config.get(key, supported) != supported:
            raise ConfigError(f"{where}: {key}={hf_config[key]!r} is not supported (only {supported!r})")
    check_full_attention(hf_config, where)
    default_head_dim = switches.pop("head_dim", None)
    d, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    head_dim = int(hf_config.get("head_dim") or default_head_dim or d // heads)
    cfg = config_cls(
        family=family, d_model=d, n_layers=int(need("num_hidden_layers")), n_heads=heads,
        n_kv_heads=int(hf_config.get("num_key_value_heads") or heads),
        head_dim=0 if head_dim * heads == d else head_dim, d_ff=int(need("intermediate_size")),
        max_seq_len=int(need("max_position_embeddings")), **rope_from_hf(hf_config, where),
        norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
        **switches,
    )
    cfg.validate("model")
    return cfg


def check_plain_llama(cfg: LlamaConfig) -> None:
    """Transformers' Llama has no q/k/v-only biases nor q/k norms (those are the qwen2 and qwen3 families)."""
    for key, family in (("qkv_bias", "qwen2"), ("qk_norm", "qwen3")):
        if getattr(cfg, key):
            raise ConfigError(f"config key 'model.{key}': LlamaForCausalLM has no such weights; "
                              f"export it as model.family={family}")


LlamaHF = TableAdapter("LlamaForCausalLM", "llama", "llama", hf_tensors, llama_config, config_from_hf,
                       check_plain_llama)



def _config(architecture: str, model_type: str, drop: tuple[str, ...] = (), **extra: Any):  # noqa: ANN202
    """A config.json builder: Llama's fields less ``drop``, with the family's names and ``extra`` keys."""
    def to_config(cfg: LlamaConfig, vocab_size: int, special_ids: Mapping[str, int] | None = None) -> dict[str, Any]:
        config = {k: v for k, v in llama_config(cfg, vocab_size, special_ids).items() if k not in drop}
        return {**config, "architectures": [architecture], "model_type": model_type, **extra}
    return to_config


def llama_shaped_adapter(name: str, config_cls: type[LlamaConfig], architecture: str,
                         check_export: Callable[[LlamaConfig], None],
                         to_config: Callable[[LlamaConfig, int, Mapping[str, int] | None], dict[str, Any]],
                         **switches: Any) -> TableAdapter:
    return TableAdapter(architecture, name, name, hf_tensors, to_config,
                        lambda hf: config_from_hf(hf, name, config_cls, name, **switches), check_export=check_export)


def check_switches(family: str, qkv_bias: bool, qk_norm: bool) -> Callable[[LlamaConfig], None]:
    """A family's checks: its HF class has exactly these switches."""
    def validate(cfg: LlamaConfig) -> None:
        cfg.validate("model")
        for key, want in (("qkv_bias", qkv_bias), ("qk_norm", qk_norm)):
            if getattr(cfg, key) != want:
                raise ConfigError(f"config key 'model.{key}': the {family} family has {key}={want} "
                                  f"(its Hugging Face model is built that way), got {getattr(cfg, key)}")
    return validate


def check_mistral(cfg: LlamaConfig) -> None:
    cfg.validate("model")
    check_plain_llama(cfg)


MISTRAL_HF = llama_shaped_adapter(
    "mistral", MistralConfig, "MistralForCausalLM", check_mistral,
    _config("MistralForCausalLM", "mistral", drop=("attention_bias", "mlp_bias"), sliding_window=None))
QWEN2_HF = llama_shaped_adapter(
    "qwen2", Qwen2Config, "Qwen2ForCausalLM", check_switches("qwen2", True, False),
    _config("Qwen2ForCausalLM", "qwen2", drop=("attention_bias", "mlp_bias"), use_sliding_window=False,
            sliding_window=None),
    qkv_bias=True, qk_norm=False)
QWEN3_HF = llama_shaped_adapter(
    "qwen3", Qwen3Config, "Qwen3ForCausalLM", check_switches("qwen3", False, True),
    _config("Qwen3ForCausalLM", "qwen3", drop=("mlp_bias",), use_sliding_window=False, sliding_window=None),
    qkv_bias=False, qk_norm=True, head_dim=128)
