"""Load a local Hugging Face model folder into our model family's parameters.

A minimal Llama-only reader (config.json + model.safetensors or a sharded index) with the signature
the continued-pretraining path relies on; the full importer (more families, PyTorch state dicts,
streaming into the target sharding) replaces its body, not its signature.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx

from experiment.errors import ConfigError, DataError
from model.registry import get_family

# Transformers' model_type -> our family name
MODEL_TYPES = {"llama": "llama"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


@dataclasses.dataclass(frozen=True)
class ImportedCheckpoint:
    family: str
    model_cfg: Any  # the family's model section, its shape from config.json
    state: nnx.State  # the parameters, as nnx.state(model, nnx.Param) of the family's module
    vocab_size: int
    source_files: dict[str, str]  # file name in the folder -> sha256 of config.json and the weight files
    tokenizer_files: tuple[str, ...]  # tokenizer files present in the folder


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(4 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise DataError(f"{path} is missing: model.init_from must name a Hugging Face model folder")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not readable JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise DataError(f"{path} does not hold a JSON object")
    return config


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise DataError(f"{index} is not a readable safetensors index ({exc})") from exc
        return [folder / name for name in names]
    single = folder / "model.safetensors"
    if not single.is_file():
        raise DataError(f"{folder} has neither model.safetensors nor model.safetensors.index.json")
    return [single]


def load_hf_checkpoint(folder: str | Path, param_dtype: Any = None) -> ImportedCheckpoint:
    """The model of a Hugging Face folder: family, model config, parameters (``param_dtype`` or fp32)."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    config = read_hf_config(folder)
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"{folder / 'config.json'}: model_type {model_type!r} is not supported "
                          f"(supported: {', '.join(sorted(MODEL_TYPES))})")
    family = get_family(MODEL_TYPES[model_type])
    tensors: dict[str, np.ndarray] = {}
    files = weight_files(folder)
    for path in files:
        if not path.is_file():
            raise DataError(f"{path} is missing (named in the safetensors index)")
        try:
            tensors.update(load_file(str(path)))
        except Exception as exc:  # safetensors raises its own error types for a damaged file
            raise DataError(f"{path} is not a readable safetensors file ({exc})") from exc
    try:
        model_cfg, state = family.hf_adapter.import_(config, tensors)
    except (ConfigError, DataError) as exc:
        raise type(exc)(f"{folder}: {exc}") from None
    if param_dtype is not None:
        pure = nnx.to_pure_dict(state)
        nnx.replace_by_pure_dict(state, _cast(pure, param_dtype))
    sources = {p.name: sha256_of(p) for p in [folder / "config.json", *files]}
    return ImportedCheckpoint(family=family.name, model_cfg=model_cfg, state=state,
                              vocab_size=int(config.get("vocab_size") or 0), source_files=sources,
                              tokenizer_files=tuple(n for n in TOKENIZER_FILES if (folder / n).is_file()))


def _cast(tree: Any, dtype: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _cast(v, dtype) for k, v in tree.items()}
    return np.asarray(tree).astype(dtype)
