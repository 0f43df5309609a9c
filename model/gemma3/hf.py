"""The Hugging Face adapter of Gemma 3 (text): Transformers' ``Gemma3ForCausalLM``, ``model_type: gemma3_text``.

Both directions are a renaming and transposition of weights (Flax kernels ``x @ W`` are [in, out], PyTorch's
``nn.Linear`` [out, in]); the norm weights are the same numbers on both sides, since our ``GemmaRMSNorm``
stores ``w`` and scales by ``1 + w`` as Transformers' ``Gemma3RMSNorm`` does. Only numpy is needed, not torch.

config.json: Transformers 5 writes ``rope_parameters`` per layer type (``sliding_attention``,
``full_attention``) and ``layer_types``; files written before it have ``rope_theta`` (global),
``rope_local_base_freq``, ``rope_scaling`` (global) and ``sliding_window_pattern``. Both are read; the
export writes both. Features our decoder does not have (logit soft-capping, bidirectional attention, RoPE
types other than default and linear, biases) are one ConfigError line naming the key.

Import reads one tensor at a time from a mapping (model/hf_checkpoint.py passes a lazy one over the
safetensors files), checks its shape, casts it and hands it to ``place``; a scanned parameter is built from
its layers as they are read (``place_layers``), so no second full copy of the model is made on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiment.errors import ConfigError
from model.gemma3.config import GLOBAL, LOCAL, Gemma3Config
from model.hf_tensors import (
    HFTensor,
    TableAdapter,
    attention_tensors,
    config_reader,
)
from model.stacking import BLOCKS

ARCHITECTURE, MODEL_TYPE = "Gemma3ForCausalLM", "gemma3_text"
WHERE = f"Hugging Face {MODEL_TYPE} config"
HF_TYPES = {LOCAL: "sliding_attention", GLOBAL: "full_attention"}  # our layer letter -> Transformers' layer type
HF_DEFAULTS = {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096, "rms_norm_eps": 1e-6,
               "sliding_window_pattern": 6}  # Gemma3TextConfig's defaults, for keys a file leaves out
DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}  # Gemma3TextConfig.default_theta


def hf_tensors(cfg: Gemma3Config) -> list[HFTensor]:
    """Every parameter of the decoder and its ``Gemma3ForCausalLM`` name (the head is the tied embedding)."""
    table = [HFTensor(("embed",), "model.embed_tokens.weight")]
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}", (BLOCKS, i)
        attn = (*ours, "attn")
        table += attention_tensors(i) + [
            HFTensor((*attn, "q_norm", "scale"), f"{hf}.self_attn.q_norm.weight"),
            HFTensor((*attn, "k_norm", "scale"), f"{hf}.self_attn.k_norm.weight"),
            HFTensor((*ours, "post_attn_norm", "scale"), f"{hf}.post_attention_layernorm.weight"),
            HFTensor((*ours, "mlp_norm", "scale"), f"{hf}.pre_feedforward_layernorm.weight"),
            HFTensor((*ours, "mlp", "w_gate"), f"{hf}.mlp.gate_proj.weight", 1),
            HFTensor((*ours, "mlp", "w_up"), f"{hf}.mlp.up_proj.weight", 1),
            HFTensor((*ours, "mlp", "w_down"), f"{hf}.mlp.down_proj.weight", 1),
            HFTensor((*ours, "post_mlp_norm", "scale"), f"{hf}.post_feedforward_layernorm.weight"),
        ]
    table.append(HFTensor(("final_norm", "scale"), "model.norm.weight"))
    return table


def _number(value: float) -> int | float:
    """An integral float as an int: Gemma3TextConfig types ``query_pre_attn_scalar`` as int (strictly checked)."""
    return int(value) if float(value).is_integer() else float(value)


def to_hf_config(cfg: Gemma3Config, vocab_size: int, special_ids: Mapping[str, int] | None = None) -> dict[str, Any]:
    """config.json for ``Gemma3ForCausalLM`` with our shapes (``cfg`` resolved)."""
    special = special_ids or {}
    full = {"rope_type": "default", "rope_theta": cfg.rope_theta_global}
    if cfg.rope_scaling == "linear":
        full = {"rope_type": "linear", "factor": cfg.rope_factor, "rope_theta": cfg.rope_theta_global}
    types = cfg.layer_types()
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": int(vocab_size),
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.resolved_head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "query_pre_attn_scalar": _number(cfg.query_pre_attn_scalar or cfg.resolved_head_dim),
        "sliding_window": cfg.sliding_window,
        "layer_types": [HF_TYPES[kind] for kind in types],
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta_local},
                            "full_attention": full},
        # the keys of files written before Transformers 5, for older readers
        "rope_theta": cfg.rope_theta_global,
        "rope_local_base_freq": cfg.rope_theta_local,
        **({"rope_scaling": {"rope_type": "linear", "factor": cfg.rope_factor}}
           if cfg.rope_scaling == "linear" else {}),
        **({"sliding_window_pattern": cfg.global_every} if not cfg.layer_pattern else {}),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "use_bidirectional_attention": False,
        "tie_word_embeddings": True,
        "bos_token_id": special.get("bos"),
        "eos_token_id": special.get("eos"),
        "pad_token_id": special.get("pad"),
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def _rope_of(params: Mapping[str, Any], key: str, kind: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """Our RoPE fields of one layer type's Transformers RoPE parameters (``key`` names them in errors)."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in allowed:
        raise ConfigError(f"{WHERE}: {key}.rope_type '{rope_type}' is not supported (only {' and '.join(allowed)} "
                          f"for the {kind} layers)")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConfigError(f"{WHERE}: {key}.partial_rotary_factor={params['partial_rotary_factor']} is not supported "
                          "(only RoPE over the whole head)")
    if rope_type == "linear" and "factor" not in params:
        raise ConfigError(f"{WHERE}: {key} of rope_type linear lacks 'factor'")
    return dict(params)


def rope_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Our rope_* fields from ``rope_parameters`` per layer type (Transformers 5) or the earlier ``rope_theta``,
    ``rope_local_base_freq`` and ``rope_scaling`` (the global layers')."""
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping) and ({"full_attention", "sliding_attention"} & set(params)):
        full_key, local_key = "rope_parameters.full_attention", "rope_parameters.sliding_attention"
        full, local = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    else:  # before Transformers 5 (a flat rope_parameters is the global layers', as rope_scaling was)
        full_key, local_key = ("rope_parameters" if params else "rope_scaling"), "rope_local_base_freq"
        full = {**(hf.get("rope_scaling") or {}), **(params or {})}
        full.setdefault("rope_theta", hf.get("rope_theta", DEFAULT_THETA["full_attention"]))
        local = {"rope_theta": hf.get("rope_local_base_freq", DEFAULT_THETA["sliding_attention"])}
    if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConfigError(f"{WHERE}: partial_rotary_factor={hf['partial_rotary_factor']} is not supported "
                          "(only RoPE over the whole head)")
    full = _rope_of(full, full_key, "global", ("default", "linear"))
    local = _rope_of(local, local_key, "local", ("default",))
    linear = full.get("rope_type", full.get("type")) == "linear"
    return {"rope_theta_global": float(full.get("rope_theta", DEFAULT_THETA["full_attention"])),
            "rope_theta_local": float(local.get("rope_theta", DEFAULT_THETA["sliding_attention"])),
            "rope_scaling": "linear" if linear else "none",
            **({"rope_factor": float(full["factor"])} if linear else {})}


def _default_types(n_layers: int, every: int) -> str:
    """Transformers' layer types for ``sliding_window_pattern`` = ``every``, as our letters."""
    return "".join(GLOBAL if (i + 1) % every == 0 else LOCAL for i in range(n_layers))


def pattern_from_hf(hf: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
    """``global_every`` (or ``layer_pattern``, the shortest repeating group) of ``layer_types``, or of the
    earlier ``sliding_window_pattern`` where there are none."""
    declared = int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern")
                   or HF_DEFAULTS["sliding_window_pattern"])
    types = hf.get("layer_types")
    if types is None:
        letters = _default_types(n_layers, declared)
    else:
        to_letter = {v: k for k, v in HF_TYPES.items()}
        unknown = [t for t in types if t not in to_letter]
        if unknown:
            raise ConfigError(f"{WHERE}: layer_types entry '{unknown[0]}' is not supported "
                              "(only sliding_attention and full_attention)")
        if len(types) != n_layers:
            raise ConfigError(f"{WHERE}: layer_types has {len(types)} entries for num_hidden_layers={n_layers}")
        letters = "".join(to_letter[t] for t in types)
    for every in dict.fromkeys([declared, *range(1, n_layers + 2)]):
        if letters == _default_types(n_layers, every):
            return {"global_every": every, "layer_pattern": ""}
    period = next(p for p in range(1, n_layers + 1) if all(letters[i] == letters[i % p] for i in range(n_layers)))
    return {"layer_pattern": letters[:period]}


def config_from_hf(hf: Mapping[str, Any]) -> Gemma3Config:
    """Our model config for a ``gemma3_text`` config.json; features our decoder lacks are one-line errors."""
    need = config_reader(hf, MODEL_TYPE)
    activation = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise ConfigError(f"{WHERE}: hidden_activation={activation!r} is not supported (only 'gelu_pytorch_tanh')")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if hf.get(key) is not None:
            raise ConfigError(f"{WHERE}: {key}={hf[key]!r} is not supported (Gemma 3 has none; only null)")
    for key, supported in (("use_bidirectional_attention", False), ("attention_bias", False),
                           ("tie_word_embeddings", True)):
        if bool(hf.get(key, supported)) != supported:
            raise ConfigError(f"{WHERE}: {key}={hf[key]!r} is not supported (only {str(supported).lower()})")
    n_layers = int(need("num_hidden_layers"))
    layout = pattern_from_hf(hf, n_layers)
    window = hf.get("sliding_window", HF_DEFAULTS["sliding_window"])
    cfg = Gemma3Config(
        d_model=int(need("hidden_size")), n_layers=n_layers, n_heads=int(need("num_attention_heads")),
        n_kv_heads=int(hf.get("num_key_value_heads") or need("num_attention_heads")),
        head_dim=int(hf.get("head_dim") or HF_DEFAULTS["head_dim"]), d_ff=int(need("intermediate_size")),
        max_seq_len=int(need("max_position_embeddings")),
        norm_eps=float(hf.get("rms_norm_eps", HF_DEFAULTS["rms_norm_eps"])),
        query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar") or HF_DEFAULTS["query_pre_attn_scalar"]),
        sliding_window=int(window or 0), **layout, **rope_from_hf(hf),
    )
    if window is None and LOCAL in cfg.pattern:
        raise ConfigError(f"{WHERE}: sliding_window is null but layer_types has sliding_attention layers")
    cfg.validate("model")
    return cfg


class Gemma3HF(TableAdapter):
    """Export to and import from Transformers' ``Gemma3ForCausalLM`` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(ARCHITECTURE, MODEL_TYPE, "gemma3", hf_tensors, to_hf_config, config_from_hf)

    def ignored(self, name: str, model_cfg: Gemma3Config, hf_config: Mapping[str, Any]) -> bool:
        """The head is the embedding (tied: Transformers ties them on load whatever lm_head.weight holds) and the
        rotary inverse frequencies are recomputed."""
        return name == "lm_head.weight" or "inv_freq" in name


GEMMA3_HF = Gemma3HF()
