"""Families that are Llama's decoder with switches, each with its Hugging Face adapter: Mistral, Qwen2/2.5, Qwen3.

    mistral: Llama-shaped (a sliding window at least the context long, or none, is full attention)
    qwen2:   q/k/v projection biases (``qkv_bias``), rope_theta 1e6 by default (Qwen2 and Qwen2.5)
    qwen3:   an RMSNorm over each query and key head before RoPE (``qk_norm``), no biases, head_dim 128

They share model/decoder.py, model/flops.py and model/llama.py's ``LlamaShapedHF``; each has its own
``model:`` section class (experiment/sections/model.py: ModelConfig with the family's switches as
defaults) and config.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiment.errors import ConfigError
from experiment.sections.model import MistralConfig, ModelConfig, Qwen2Config, Qwen3Config
from experiment.sections.train import DEFAULT_AXIS_RULES
from model import flops
from model.decoder import QUANTIZED_MODULES, Decoder
from model.family import ModelFamily, register_family
from model.llama import LlamaShapedHF, check_plain_llama, config_from_hf, describe, llama_config


def _switches(family: str, qkv_bias: bool, qk_norm: bool):  # noqa: ANN202
    """The family's checks: its HF class has exactly these switches."""
    def validate(cfg: ModelConfig) -> None:
        cfg.validate("model")
        for key, want in (("qkv_bias", qkv_bias), ("qk_norm", qk_norm)):
            if getattr(cfg, key) != want:
                raise ConfigError(f"config key 'model.{key}': the {family} family has {key}={want} "
                                  f"(its Hugging Face model is built that way), got {getattr(cfg, key)}")
    return validate


def _config(architecture: str, model_type: str, drop: tuple[str, ...] = (), **extra: Any):  # noqa: ANN202
    def to_config(cfg: Any, vocab_size: int, special_ids: Mapping[str, int] | None = None) -> dict[str, Any]:
        config = {k: v for k, v in llama_config(cfg, vocab_size, special_ids).items() if k not in drop}
        return {**config, "architectures": [architecture], "model_type": model_type, **extra}
    return to_config


def _family(name: str, config_cls: type, architecture: str, validate: Any, to_config: Any, **switches: Any) -> ModelFamily:
    adapter = LlamaShapedHF(architecture, name, name, to_config,
                            lambda hf: config_from_hf(hf, name, config_cls, name, **switches),
                            check_export=validate)
    return register_family(ModelFamily(
        name=name, config_cls=config_cls, build=Decoder, flops=flops.train_flops_per_token,
        train_costs=flops.train_costs, param_count=flops.param_count, axis_rules=DEFAULT_AXIS_RULES,
        validate=validate, describe=describe, hf_adapter=adapter, quantized_modules=QUANTIZED_MODULES,
    ))


def _mistral_validate(cfg: ModelConfig) -> None:
    cfg.validate("model")
    check_plain_llama(cfg)


MISTRAL = _family("mistral", MistralConfig, "MistralForCausalLM", _mistral_validate,
                  _config("MistralForCausalLM", "mistral", drop=("attention_bias", "mlp_bias"), sliding_window=None))
QWEN2 = _family("qwen2", Qwen2Config, "Qwen2ForCausalLM", _switches("qwen2", True, False),
                _config("Qwen2ForCausalLM", "qwen2", drop=("attention_bias", "mlp_bias"), use_sliding_window=False,
                        sliding_window=None),
                qkv_bias=True, qk_norm=False)
QWEN3 = _family("qwen3", Qwen3Config, "Qwen3ForCausalLM", _switches("qwen3", False, True),
                _config("Qwen3ForCausalLM", "qwen3", drop=("mlp_bias",), use_sliding_window=False, sliding_window=None),
                qkv_bias=False, qk_norm=True, head_dim=128)
