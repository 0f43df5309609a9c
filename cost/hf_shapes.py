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
from experiment.sections.model import FamilyConfig

HF_PREFIX = "hf:"
SHIPPED_CONFIGS = Path(__file__).with_name("hf_configs")


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


def hf_model_shape(spec: str, key: str, run_settings: FamilyConfig) -> tuple[str, FamilyConfig, int]:
    """``(label, model section, vocab_size)`` of an ``hf:`` value. The family and shape come from
    config.json (``model.hf_checkpoint.hf_model_config``: llama, mistral, qwen2, qwen3); the sequence
    length and the run's settings (remat, attention kernel) from ``run_settings``, the experiment's
    model section: config.json's ``max_position_embeddings`` is the context the model allows, not the
    length a continued run trains at."""
    from model.hf_checkpoint import hf_model_config

    path = config_json_path(spec, key)
    _, shape, vocab_size = hf_model_config(read_config_json(path, key), str(path))
    shape = dataclasses.replace(shape, max_seq_len=run_settings.max_seq_len, remat=run_settings.remat,
                                attention=run_settings.attention)
    return path.parent.name, shape, vocab_size
