"""The Hugging Face adapters of the Llama-shaped families: Llama, Mistral, Qwen2/2.5, Qwen3.

The HF adapter maps our parameters onto Transformers' ``LlamaForCausalLM`` and back. Our decoder
is Llama-shaped (RMSNorm, GQA attention with half-split RoPE, SwiGLU, optional tied embeddings), so
both directions are a renaming and transposition of weights: Flax stores ``x @ W`` kernels as
[in, out], PyTorch ``nn.Linear`` as [out, in]. Only numpy is needed here, not torch.

``LlamaShapedHF`` is the adapter of every family whose Transformers model is Llama's with a few
switches (Mistral, Qwen2, Qwen3: the config.json builders below): one table (``hf_tensors``) names each of our
parameters' HF tensor and layout, and both directions walk it. Importing reads one tensor at a
time from a mapping (model/hf_checkpoint.py passes a lazy one over the safetensors files), checks its
shape, casts it to the parameter dtype and hands it to ``place`` (which may put it straight onto its
devices), so no second full copy of the model is made on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flax import nnx

from experiment.errors import ConfigError, DataError
from model.family import get_family
from model.llama.config import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config
from model.stacking import BLOCKS, n_stacked, unrolled_pure


@dataclass(frozen=True)
class HFTensor:
    """One parameter's place in a Transformers state dict.

    ``path``: keys into ``nnx.to_pure_dict`` of our parameters; ``name``: the HF tensor name; ``n_in``:
    for a kernel ``x @ W`` the number of our leading (input) dims, stored by PyTorch transposed as a
    2-D [out, in] matrix; 0: the same values in the same order, flattened to 1-D where ``flat`` (biases).
    """

    path: tuple[Any, ...]
    name: str
    n_in: int = 0
    flat: bool = False

    def layer(self) -> int | None:
        """The decoder layer this tensor belongs to (None: embedding, final norm, head)."""
        return self.path[1] if self.path[0] == BLOCKS else None

    def param_path(self, scanned: bool) -> tuple[Any, ...]:
        """Where it lives in our parameters: ``blocks/<i>/...``, or in a scanned model the stacked
        ``blocks/...`` whose axis 0 is the layer (model/stacking.py)."""
        return (BLOCKS, *self.path[2:]) if scanned and self.layer() is not None else self.path

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.n_in:
            return (int(np.prod(shape[self.n_in:])), int(np.prod(shape[:self.n_in])))
        return (int(np.prod(shape)),) if self.flat else tuple(shape)

    def to_ours(self, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return (value.T if self.n_in else value).reshape(shape)

    def to_hf(self, value: np.ndarray) -> np.ndarray:
        if self.n_in:
            return np.ascontiguousarray(value.reshape(int(np.prod(value.shape[:self.n_in])), -1).T)
        return np.ascontiguousarray(value.reshape(self.hf_shape(value.shape)))


def hf_tensors(cfg: LlamaConfig) -> list[HFTensor]:
    """Every parameter of a Llama-shaped decoder with ``cfg`` and its Transformers name."""
    table = [HFTensor(("embed",), "model.embed_tokens.weight")]
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}", ("blocks", i)
        attn = (*ours, "attn")
        table += [
            HFTensor((*ours, "attn_norm", "scale"), f"{hf}.input_layernorm.weight"),
            HFTensor((*attn, "wq"), f"{hf}.self_attn.q_proj.weight", 1),  # [d, heads, head_dim] <- [heads*head_dim, d]
            HFTensor((*attn, "wk"), f"{hf}.self_attn.k_proj.weight", 1),
            HFTensor((*attn, "wv"), f"{hf}.self_attn.v_proj.weight", 1),
            HFTensor((*attn, "wo"), f"{hf}.self_attn.o_proj.weight", 2),  # [heads, head_dim, d] <- [d, heads*head_dim]
        ]
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


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: Any, path: tuple[Any, ...], value: Any) -> None:
    _get(tree, path[:-1])[path[-1]] = value


def llama_state_dict(model: Any, cfg: LlamaConfig | None = None) -> dict[str, np.ndarray]:
    """Our NNX decoder's parameters under Transformers' Llama names, in PyTorch's [out, in] layout (fp32),
    one tensor per layer whichever layout (scanned or unrolled) the model has."""
    pure = unrolled_pure(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    if cfg is None:  # the switches the module was built with
        scanned = isinstance(model.blocks, nnx.Module)
        attn = model.blocks.attn if scanned else model.blocks[0].attn
        cfg = LlamaConfig(n_layers=n_stacked(model.blocks) if scanned else len(model.blocks),
                          tie_embeddings=model.lm_head is None, qkv_bias=attn.bq is not None,
                          qk_norm=attn.q_norm is not None)
    return {t.name: t.to_hf(np.asarray(_get(pure, t.path), dtype=np.float32)) for t in hf_tensors(cfg)}


def rope_hf(cfg: LlamaConfig) -> dict[str, Any]:
    """Transformers' ``rope_parameters`` for our RoPE settings."""
    if cfg.rope_scaling == "llama3":
        return {"rope_type": "llama3", "rope_theta": cfg.rope_theta, "factor": cfg.rope_factor,
                "low_freq_factor": cfg.rope_low_freq_factor, "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_max_len}
    return {"rope_type": "default", "rope_theta": cfg.rope_theta}


def llama_config(model_cfg: Any, vocab_size: int, special_ids: Mapping[str, int] | None = None) -> dict[str, Any]:
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


# rope_scaling / rope_parameters keys that are not settings of the scaling itself
_ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
              "original_max_position_embeddings", "partial_rotary_factor"}


def rope_from_hf(hf_config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Our rope_* fields for a config.json's ``rope_parameters`` (Transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (earlier); a scaling other than llama3 is an error naming it."""
    rope = dict(hf_config.get("rope_parameters") or {})
    legacy = hf_config.get("rope_scaling") or {}
    rope = {**legacy, **rope}
    theta = float(rope.get("rope_theta", hf_config.get("rope_theta", 10_000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if rope.get("partial_rotary_factor", 1.0) != 1.0 or hf_config.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(f"{where}: partial_rotary_factor is not supported (only RoPE over the whole head)")
    if kind == "default":
        return {"rope_theta": theta}
    if kind != "llama3":
        raise ConfigError(f"{where}: rope_scaling type '{kind}' is not supported (only default and llama3)")
    missing = [k for k in ("factor", "original_max_position_embeddings") if k not in rope]
    if missing:
        raise ConfigError(f"{where}: rope_scaling of type llama3 lacks '{missing[0]}'")
    return {"rope_theta": theta, "rope_scaling": "llama3", "rope_factor": float(rope["factor"]),
            "rope_low_freq_factor": float(rope.get("low_freq_factor", 1.0)),
            "rope_high_freq_factor": float(rope.get("high_freq_factor", 4.0)),
            "rope_original_max_len": int(rope["original_max_position_embeddings"])}


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


def config_from_hf(hf_config: Mapping[str, Any], model_type: str = "llama", config_cls: type = LlamaConfig,
                   family: str = "llama", **switches: Any) -> LlamaConfig:
    """Our model config for a Transformers Llama-shaped config.json; features our decoder lacks are errors.

    ``switches``: the family's fixed features (``qkv_bias``, ``qk_norm``) and defaults (``head_dim``:
    Qwen3's config default when the file has none)."""
    where = f"Hugging Face {model_type} config"

    def need(key: str) -> Any:
        if key not in hf_config:
            raise ConfigError(f"{where}: key '{key}' is missing")
        return hf_config[key]

    if need("model_type") != model_type:
        raise ConfigError(f"{where}: model_type '{hf_config['model_type']}' is not {model_type}")
    if hf_config.get("quantization_config"):
        raise ConfigError(f"{where}: quantization_config is not supported (a quantized checkpoint)")
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
        norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
        **switches,
    )
    cfg.validate("model")
    return cfg


Place = Callable[[tuple[Any, ...], np.ndarray], Any]  # (our parameter path, value) -> the array the state holds
# (path, stacked shape, dtype, the layers' values as (layer, value), read one by one) -> the stacked array:
# a scanned parameter built on its devices a layer at a time, never whole on the host
PlaceLayers = Callable[[tuple[Any, ...], tuple[int, ...], Any, Iterator[tuple[int, np.ndarray]]], Any]


def _source(state_dict: Any, name: str | None = None) -> str:
    """Where a tensor comes from, for error lines: the mapping's file (``file_of``) if it knows one."""
    file_of = getattr(state_dict, "file_of", None)
    found = file_of(name) if file_of is not None and name is not None else None
    return str(found or getattr(state_dict, "origin", None) or "state dict")


class LlamaShapedHF:
    """Export to and import from a Transformers model that is Llama's with switches (see the module docstring).

    ``architecture``/``model_type``: what config.json names; ``hf_config``: our config -> the family's
    config.json fields; ``from_hf``: config.json -> our config; ``family``: the registered family name
    (set by the family's registration)."""

    def __init__(self, architecture: str, model_type: str, family: str,
                 to_config: Callable[[Any, int, Mapping[str, int] | None], dict[str, Any]],
                 from_config: Callable[[Mapping[str, Any]], Any], check_export: Callable[[Any], None] = lambda cfg: None):
        self.architecture, self.model_type, self.family = architecture, model_type, family
        self.to_config, self.from_config, self.check_export = to_config, from_config, check_export

    def export(self, model: Any, model_cfg: Any, vocab_size: int,
               special_ids: Mapping[str, int] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        self.check_export(model_cfg)
        return llama_state_dict(model, model_cfg), self.to_config(model_cfg, vocab_size, special_ids)

    def config(self, hf_config: Mapping[str, Any]) -> tuple[Any, int]:
        """(our model config, vocabulary size) of a config.json."""
        vocab_size = int(hf_config.get("vocab_size") or 0)
        if vocab_size <= 0:
            raise ConfigError(f"Hugging Face {self.model_type} config: vocab_size is missing or not positive")
        return self.from_config(hf_config), vocab_size

    def import_(self, hf_config: Mapping[str, Any], state_dict: Mapping[str, Any], *,
                dtype: Any = np.float32, place: Place | None = None,
                scan_layers: bool | None = None, place_layers: PlaceLayers | None = None) -> tuple[Any, nnx.State]:
        """The inverse of ``export``: each tensor is read once, checked against the shape the config implies,
        cast to ``dtype`` and handed to ``place`` (default: kept as a numpy array).

        A missing tensor, a tensor of another shape, and a tensor with no place in the model are errors
        naming the tensor and (where ``state_dict`` knows, by its ``file_of``) the file it is in.
        ``scan_layers``: the layer layout of the parameters made (None: the config section's default);
        ``place_layers`` builds a scanned parameter from its layers as they are read (default: a host buffer
        filled layer by layer, then handed to ``place``)."""
        cfg, vocab_size = self.config(hf_config)
        if scan_layers is not None:
            cfg = dataclasses.replace(cfg, scan_layers=scan_layers)
        state = nnx.state(get_family(self.family).abstract(cfg, vocab_size), nnx.Param)
        pure = nnx.to_pure_dict(state)
        what = f"Hugging Face {self.model_type} weights"
        table = hf_tensors(cfg)
        for t in table:
            if t.name not in state_dict:
                raise DataError(f"{_source(state_dict)}: tensor '{t.name}' is missing ({what})")
        known = {t.name for t in table}
        # rotary inverse frequencies are recomputed from the config; anything else would be silently lost
        unused = sorted(k for k in state_dict if k not in known and not k.endswith("rotary_emb.inv_freq")
                        and not (cfg.tie_embeddings and k == "lm_head.weight"))
        if unused:
            raise DataError(f"{_source(state_dict, unused[0])}: tensor '{unused[0]}' has no place in the {self.model_type} "
                            f"model ({len(unused)} such tensors; {what})")
        scanned = bool(getattr(cfg, "scan_layers", False))
        # one parameter at a time: a scanned parameter's layers are read one tensor after another into
        # its stacked buffer, which is placed (and freed here) before the next parameter is read
        groups: dict[tuple[Any, ...], list[HFTensor]] = {}
        for t in table:
            groups.setdefault(t.param_path(scanned), []).append(t)
        def read(t: HFTensor, shape: tuple[int, ...]) -> np.ndarray:
            value = state_dict[t.name]
            if tuple(value.shape) != t.hf_shape(shape):
                raise DataError(f"{_source(state_dict, t.name)}: tensor '{t.name}' has shape {tuple(value.shape)}, "
                                f"the config implies {t.hf_shape(shape)} ({what})")
            return t.to_ours(np.asarray(value), shape).astype(dtype, copy=False)

        for path, tensors in groups.items():
            full = tuple(_get(pure, path).shape)
            if not (scanned and tensors[0].layer() is not None):
                _set(pure, path, read(tensors[0], full) if place is None else place(path, read(tensors[0], full)))
                continue
            layers = ((t.layer(), read(t, full[1:])) for t in tensors)  # one tensor in memory at a time
            if place_layers is not None:
                _set(pure, path, place_layers(path, full, dtype, layers))
                continue
            buffer = np.empty(full, dtype)
            for layer, value in layers:
                buffer[layer] = value
            _set(pure, path, buffer if place is None else place(path, buffer))
            del buffer
        nnx.replace_by_pure_dict(state, pure)
        return cfg, state


def check_plain_llama(cfg: Any) -> None:
    """Transformers' Llama has no q/k/v-only biases nor q/k norms (those are the qwen2 and qwen3 families)."""
    for key, family in (("qkv_bias", "qwen2"), ("qk_norm", "qwen3")):
        if getattr(cfg, key, False):
            raise ConfigError(f"config key 'model.{key}': LlamaForCausalLM has no such weights; "
                              f"export it as model.family={family}")


LlamaHF = LlamaShapedHF("LlamaForCausalLM", "llama", "llama", llama_config, config_from_hf, check_plain_llama)



def _config(architecture: str, model_type: str, drop: tuple[str, ...] = (), **extra: Any):  # noqa: ANN202
    """A config.json builder: Llama's fields less ``drop``, with the family's names and ``extra`` keys."""
    def to_config(cfg: Any, vocab_size: int, special_ids: Mapping[str, int] | None = None) -> dict[str, Any]:
        config = {k: v for k, v in llama_config(cfg, vocab_size, special_ids).items() if k not in drop}
        return {**config, "architectures": [architecture], "model_type": model_type, **extra}
    return to_config


def llama_shaped_adapter(name: str, config_cls: type, architecture: str, check_export: Callable[[Any], None],
                         to_config: Callable[[Any, int, Mapping[str, int] | None], dict[str, Any]],
                         **switches: Any) -> LlamaShapedHF:
    return LlamaShapedHF(architecture, name, name, to_config,
                         lambda hf: config_from_hf(hf, name, config_cls, name, **switches), check_export=check_export)


def check_switches(family: str, qkv_bias: bool, qk_norm: bool) -> Callable[[Any], None]:
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
