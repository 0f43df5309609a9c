"""A model shape straight from a Hugging Face ``config.json``, for the planner and the fit check.

``cost.plan_model: hf:<folder or config.json>`` (recipe 07) and ``train.fit_model: hf:<...>``
(recipe 04b) price or compile-check continued pretraining of a published model before anything is
rented or downloaded: only its config.json is needed. ``hf:Qwen3-1.7B`` also finds the shapes
shipped in ``cost/hf_configs/`` (README there names their sources).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from experiment.errors import ConfigError, DataError
from experiment.files import read_json_object
from experiment.sections.model import ModelConfig

HF_PREFIX = "hf:"
SHIPPED_CONFIGS = Path(__file__).with_name("hf_configs")
# model_type values whose shape is a Llama decoder for FLOPs and parameters: Qwen2's q/k/v biases and
# Qwen3's q/k norms add under 0.01% of either, Mistral is Llama with its own defaults
LLAMA_SHAPED = ("llama", "mistral", "qwen2", "qwen3")


def is_hf_spec(value: str) -> bool:
    return value.startswith(HF_PREFIX)


def config_json_path(spec: str, key: str) -> Path:
    """The config.json an ``hf:`` value names: a file, a model folder, or a folder of cost/hf_configs/."""
    raw = spec[len(HF_PREFIX):].strip()
    if not raw:
        raise ConfigError(f"config key '{key}': 'hf:' needs a model folder or config.json after it")
    path = Path(raw).expanduser()
    if not path.exists() and (SHIPPED_CONFIGS / raw).is_dir():
        path = SHIPPED_CONFIGS / raw
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        shipped = ", ".join(sorted(p.name for p in SHIPPED_CONFIGS.iterdir() if p.is_dir()))
        raise ConfigError(f"config key '{key}': {path} does not exist (shipped shapes: {shipped})")
    return path


def read_config_json(path: Path, key: str) -> dict[str, Any]:
    try:
        return read_json_object(path)
    except DataError as exc:
        raise ConfigError(f"config key '{key}': {exc}") from exc


def llama_shape_from_hf_config(config_json: dict[str, Any], source: str) -> tuple[ModelConfig, int]:
    """``(Llama-shaped ModelConfig, vocab_size)`` of a llama/mistral/qwen2/qwen3 config.json: the
    minimal mapping the planner needs (shape only; no RoPE scaling, biases or norms). ``source`` names
    the file in errors. The full import mapping is ``model.hf_checkpoint.hf_model_config``."""
    model_type = config_json.get("model_type")
    if model_type not in LLAMA_SHAPED:
        raise ConfigError(f"{source}: model_type {model_type!r} is not supported (known: {', '.join(LLAMA_SHAPED)})")

    def field(name: str, default: Any = None) -> Any:
        value = config_json.get(name, default)
        if value is None:
            raise ConfigError(f"{source}: '{name}' is missing")
        return value

    n_heads = int(field("num_attention_heads"))
    d_model = int(field("hidden_size"))
    shape = ModelConfig(
        family="llama",
        d_model=d_model,
        n_layers=int(field("num_hidden_layers")),
        n_heads=n_heads,
        n_kv_heads=int(field("num_key_value_heads", n_heads)),
        head_dim=int(config_json.get("head_dim") or d_model // n_heads),
        d_ff=int(field("intermediate_size")),
        max_seq_len=int(field("max_position_embeddings")),
        rope_theta=float(config_json.get("rope_theta") or 10_000.0),
        norm_eps=float(config_json.get("rms_norm_eps") or 1e-5),
        tie_embeddings=bool(config_json.get("tie_word_embeddings", False)),
    )
    try:
        shape.validate("")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    return shape, int(field("vocab_size"))


def hf_model_shape(spec: str, key: str, run_settings: Any) -> tuple[str, ModelConfig, int]:
    """``(label, model section, vocab_size)`` of an ``hf:`` value. The shape comes from config.json;
    the sequence length and the run's settings (remat, attention kernel) from ``run_settings``, the
    experiment's model section: config.json's ``max_position_embeddings`` is the context the model
    allows, not the length a continued run trains at."""
    path = config_json_path(spec, key)
    shape, vocab_size = llama_shape_from_hf_config(read_config_json(path, key), str(path))
    shape = dataclasses.replace(shape, max_seq_len=run_settings.max_seq_len, remat=run_settings.remat,
                                attention=run_settings.attention)
    return path.parent.name, shape, vocab_size
