"""Read a Hugging Face model folder (or a PyTorch state dict) into our model's parameters.

    folder/config.json                    -> the family (by ``model_type``) and our model config
    folder/model.safetensors              -> the weights, or
    folder/model.safetensors.index.json   -> a sharded safetensors checkpoint, or
    folder/pytorch_model.bin[.index.json] or *.pt / *.bin -> a PyTorch state dict (needs torch)
    folder/tokenizer.json, tokenizer.model, ... -> listed in ``tokenizer_files`` for the tokenizer stage

Tensors are read one at a time (safetensors' ``safe_open``, numpy): each is checked against the shape
the config implies, cast from its stored dtype (bf16 stays bf16 until then) to the parameter dtype and,
with a mesh, put straight onto its devices with the sharding its logical axes' rule gives
(model/sharding.py), so the host never holds a second full copy of the model. The family's HF adapter
(``ModelFamily.hf_adapter``, a model/hf_tensors.py ``TableAdapter``) owns the names and layouts.

Bad input is one line naming the file and the tensor (DataError) or the config field (ConfigError).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx

from experiment.errors import ConfigError, DataError
from experiment.files import format_bytes, read_json_object, sha256_file
from experiment.jsontext import parse_json
from experiment.sections.model import FamilyConfig
from model.family import ModelFamily
from model.registry import families, get_family

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json")
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_BIN, TORCH_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


@dataclass
class ImportedCheckpoint:
    """What ``load_hf_checkpoint`` read: merge ``state`` with the family's graphdef to get the model."""

    family: str  # the registered family name (llama, qwen2, qwen3, mistral)
    model_cfg: FamilyConfig  # the family's model section, from config.json
    state: nnx.State  # the parameters (nnx.Param), in ``param_dtype``
    vocab_size: int
    source_files: dict[str, str] = field(default_factory=dict)  # file name in the folder -> sha256 (config + weights)
    tokenizer_files: list[Path] = field(default_factory=list)  # the tokenizer files the folder has
    hf_config: dict[str, Any] = field(default_factory=dict)  # config.json as read (bos/eos ids, torch_dtype, ...)

    def model(self) -> nnx.Module:
        """The module (on the devices the state is on)."""
        abstract = get_family(self.family).abstract(self.model_cfg, self.vocab_size)
        return nnx.merge(nnx.graphdef(abstract), self.state)


def family_for_model_type(model_type: str, where: str = "config.json") -> ModelFamily:
    """The registered family whose HF adapter reads ``model_type``; an unknown one is one line listing the known."""
    known = {}
    for name in families():
        adapter = get_family(name).hf_adapter
        if adapter is not None and getattr(adapter, "model_type", None):
            known[adapter.model_type] = get_family(name)
    if model_type not in known:
        raise ConfigError(f"{where}: model_type '{model_type}' is not supported "
                          f"(supported: {', '.join(sorted(known))})")
    return known[model_type]


def hf_model_config(config_json: Mapping[str, Any], where: str = "config.json") -> tuple[str, FamilyConfig, int]:
    """(family name, our model config, vocabulary size) of a Hugging Face config.json (for the planner and
    the fit check: no weights are read)."""
    family = family_for_model_type(str(config_json.get("model_type", "")), where)
    try:
        model_cfg, vocab_size = family.hf_adapter.config(config_json)  # type: ignore[union-attr]
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return family.name, model_cfg, vocab_size


def read_config(folder: Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise DataError(f"{path}: not found (a Hugging Face model folder has a config.json)")
    return read_json_object(path)


class SafetensorsSource(Mapping[str, Any]):
    """A lazy, read-only state dict over one or more safetensors files: a tensor is read when asked for.

    Entries are ``LazyTensor``s: ``shape`` from the header, the data read on ``np.asarray`` by opening
    the file for that one tensor (the memory map is dropped again, so pages already read do not stay
    in this process's resident memory). ``file_of`` names a tensor's file for error lines."""

    def __init__(self, files: Mapping[str, Path], origin: Path):
        self.origin = origin
        self._file: dict[str, Path] = dict(files)
        self._shape: dict[str, tuple[int, ...]] = {}
        by_file: dict[Path, list[str]] = {}
        for name, path in files.items():
            by_file.setdefault(path, []).append(name)
        for path, names in sorted(by_file.items()):
            shapes = header_shapes(path)
            for name in names:
                if name not in shapes:
                    raise DataError(f"{path}: tensor '{name}' is missing (the index {origin.name} lists it there)")
                self._shape[name] = shapes[name]

    @classmethod
    def single(cls, path: Path) -> SafetensorsSource:
        return cls({name: path for name in header_shapes(path)}, path)

    def file_of(self, name: str) -> str | None:
        return str(self._file[name]) if name in self._file else None

    def __contains__(self, name: object) -> bool:
        return name in self._file

    def __getitem__(self, name: str) -> LazyTensor:
        if name not in self._file:
            raise KeyError(name)
        return LazyTensor(self._file[name], name, self._shape[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)


def header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a safetensors file, from its header (no tensor data is read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors raises its own error types
        raise DataError(f"{path}: not a readable safetensors file ({exc})") from None


class LazyTensor:
    """One tensor of a safetensors file: ``shape`` known, the data read (in its stored dtype) on ``np.asarray``."""

    def __init__(self, path: Path, name: str, shape: tuple[int, ...]):
        self.path, self.name, self.shape = path, name, shape

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        from safetensors import safe_open

        with safe_open(str(self.path), framework="numpy") as f:
            value = f.get_tensor(self.name)
        return value if dtype is None else value.astype(dtype)


class TorchSource(Mapping[str, Any]):
    """A state dict saved with ``torch.save`` (one file or a ``pytorch_model.bin.index.json``), memory-mapped;
    each tensor becomes numpy when asked for (bf16 as ml_dtypes' bfloat16, without an fp32 copy)."""

    def __init__(self, files: Mapping[str, Path] | None, origin: Path):
        self.origin = origin
        self._tensors: dict[str, Any] = {}
        self._file: dict[str, Path] = {}
        paths = sorted(set(files.values())) if files else [origin]
        for path in paths:
            state = load_torch_file(path)
            for name, tensor in state.items():
                self._tensors[name], self._file[name] = tensor, path
        if files:
            for name, path in files.items():
                if name not in self._tensors:
                    raise DataError(f"{path}: tensor '{name}' is missing (the index {origin.name} lists it there)")

    def file_of(self, name: str) -> str | None:
        return str(self._file[name]) if name in self._file else None

    def __getitem__(self, name: str) -> np.ndarray:
        return torch_to_numpy(self._tensors[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def load_torch_file(path: Path) -> dict[str, Any]:
    """A ``torch.save``d state dict (tensors only, memory-mapped where the file format allows)."""
    try:
        import torch
    except ImportError:
        raise ConfigError(f"{path}: reading a PyTorch state dict needs torch (pip install -e '.[hf]'), "
                          "or convert it to safetensors") from None
    try:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's refusal is a page of advice ending in weights_only=False, i.e. running code from the file:
        # one line instead, naming the object it refused
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        what = f" (it pickles {found.group(1)})" if found else ""
        raise DataError(f"{path}: holds pickled Python objects besides tensors{what}, which are not loaded since "
                        "that would run code from the file; convert it to safetensors (model.safetensors) where "
                        "you trust its source") from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: not a readable PyTorch state dict ({first})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # a training checkpoint's {"state_dict": ..., ...}
    if not isinstance(state, dict):
        raise DataError(f"{path}: not a state dict (a dict of tensor name -> tensor), but {type(state).__name__}")
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    others = [k for k in state if k not in tensors]
    if others:
        raise DataError(f"{path}: entry '{others[0]}' is not a tensor ({len(others)} such entries)")
    return tensors


def torch_to_numpy(tensor: Any) -> np.ndarray:
    import torch

    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def read_index(path: Path) -> dict[str, Path]:
    """A sharded checkpoint's index: tensor name -> the shard file in the same folder."""
    try:
        weight_map = parse_json(path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: not a readable checkpoint index with a 'weight_map' ({exc})") from None
    files = {name: path.parent / shard for name, shard in weight_map.items()}
    for shard in sorted(set(files.values())):
        if not shard.is_file():
            raise DataError(f"{path}: shard '{shard.name}' is missing from the folder")
    return files


def weight_source(folder: Path) -> tuple[Mapping[str, Any], list[Path]]:
    """The folder's weights as a lazy state dict, and the files they are in (safetensors preferred)."""
    if (folder / SAFETENSORS_INDEX).is_file():
        files = read_index(folder / SAFETENSORS_INDEX)
        return (SafetensorsSource(files, folder / SAFETENSORS_INDEX),
                [folder / SAFETENSORS_INDEX, *sorted(set(files.values()))])
    if (folder / SAFETENSORS).is_file():
        return SafetensorsSource.single(folder / SAFETENSORS), [folder / SAFETENSORS]
    if (folder / TORCH_INDEX).is_file():
        files = read_index(folder / TORCH_INDEX)
        return TorchSource(files, folder / TORCH_INDEX), [folder / TORCH_INDEX, *sorted(set(files.values()))]
    candidates = [folder / TORCH_BIN] if (folder / TORCH_BIN).is_file() else sorted(
        [*folder.glob("*.pt"), *folder.glob("*.pth"), *folder.glob("*.bin")])
    if len(candidates) == 1:
        return TorchSource(None, candidates[0]), candidates
    if len(candidates) > 1:
        raise DataError(f"{folder}: several PyTorch files ({', '.join(p.name for p in candidates)}) and no "
                        f"{TORCH_INDEX}: which one holds the weights?")
    raise DataError(f"{folder}: no weights ({SAFETENSORS}, {SAFETENSORS_INDEX}, {TORCH_BIN} or a *.pt state dict)")


def available_memory(devices: list[Any]) -> int | None:
    """Bytes the parameters can take on ``devices``: the host's available memory for CPU devices (they share it),
    otherwise the sum of the devices' memory limits (a device of another process counted as one of this
    process's); None where the runtime does not say. No devices: this host's available memory (before JAX starts)."""
    if all(d.platform == "cpu" for d in devices):
        with contextlib.suppress(OSError, ValueError):
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        with contextlib.suppress(OSError, ValueError, AttributeError):
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return None
    import jax

    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices if d.process_index == jax.process_index()]
    if not limits or None in limits:
        return None
    return int(sum(limits) * len(devices) / len(limits))


def check_fits_memory(folder: Path, parameters: int, dtype: np.dtype, devices: list[Any]) -> None:
    """Refuse, before a tensor is read, a model whose parameters at ``dtype`` exceed what ``devices`` hold: a
    consistent folder of a model too large (config.json and the headers agree; the files can be sparse) was read
    tensor by tensor until a MemoryError."""
    where = f"{len(devices)} {devices[0].platform} device{'s' if len(devices) > 1 else ''}"
    check_fits(folder, parameters, dtype.itemsize, dtype.name, available_memory(devices), where)


def check_fits(folder: Any, parameters: int, itemsize: int, dtype_name: str, available: int | None,
               where: str) -> None:
    """``check_fits_memory``'s refusal for ``available`` bytes on ``where`` (None: unknown, nothing refused); recipe
    04's checks call it with the planned slice's memory before anything is written (trainer.init_from)."""
    needed = parameters * itemsize
    if available is not None and needed > available:
        raise DataError(f"{folder}: the model its config.json and weights declare has {parameters:,} parameters, "
                        f"{format_bytes(needed)} as {dtype_name}, more than the {format_bytes(available)} available "
                        f"on {where}: nothing was read; import it on a larger slice (a mesh over more devices)")


def load_hf_checkpoint(folder: Path, param_dtype: str | None = None, *, mesh: Any = None,
                       rules: Mapping[str, Any] | None = None, scan_layers: bool | None = None) -> ImportedCheckpoint:
    """Read a Hugging Face model folder (see the module docstring) into our parameters.

    ``param_dtype``: the dtype the parameters are cast to (default float32, our master weights).
    ``mesh``: put each parameter onto it with the sharding its logical axes get from ``rules`` (default:
    the family's axis rules) as it is read; without a mesh, parameters go to the default device.
    ``scan_layers``: the layer layout to import into (None: the family's default); the per-layer HF
    tensors are stacked as they stream in, one parameter at a time.
    """
    import jax

    from model.sharding import check_divisible, logical_to_spec

    folder = Path(folder)
    config = read_config(folder)
    family_name, model_cfg, vocab_size = hf_model_config(config, str(folder / "config.json"))
    if scan_layers is not None:
        model_cfg = dataclasses.replace(model_cfg, scan_layers=scan_layers)
    family = get_family(family_name)
    source, files = weight_source(folder)
    dtype = np.dtype(jax.numpy.dtype(param_dtype or "float32"))

    abstract_state = nnx.state(family.abstract(model_cfg, vocab_size), nnx.Param)
    flat_state = nnx.to_flat_state(abstract_state)
    check_fits_memory(folder, sum(int(np.prod(leaf.shape)) for _, leaf in flat_state), dtype,
                      list(mesh.devices.flat) if mesh is not None else [jax.devices()[0]])
    axes = {path: leaf.get_metadata().get("out_sharding") for path, leaf in flat_state}
    layout = family.mesh_rules(rules or {}) if mesh is not None else None

    def place(path: tuple[Any, ...], value: np.ndarray) -> Any:
        if mesh is None:
            return jax.device_put(value)
        spec = logical_to_spec(axes[path], layout)
        check_divisible(f"parameter {'/'.join(map(str, path))} {tuple(axes[path])}", value.shape, spec, mesh)
        # each process builds only the shards its own devices hold (a mesh may span hosts)
        return jax.make_array_from_callback(value.shape, jax.sharding.NamedSharding(mesh, spec),
                                            lambda index: value[index])

    def place_layers(path: tuple[Any, ...], shape: tuple[int, ...], dtype: Any, layers: Any) -> Any:
        """A stacked parameter made on its devices and filled in place (a donated update per layer): the host
        holds one layer's tensor at a time, as for an unrolled import."""
        if mesh is None:
            sharding: Any = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        else:
            spec = logical_to_spec(axes[path], layout)
            check_divisible(f"parameter {'/'.join(map(str, path))} {tuple(axes[path])}", shape, spec, mesh)
            sharding = jax.sharding.NamedSharding(mesh, spec)
        stacked = jax.jit(lambda: jax.numpy.zeros(shape, dtype), out_shardings=sharding)()
        put = jax.jit(lambda buffer, value, i: jax.lax.dynamic_update_index_in_dim(buffer, value, i, 0),
                      out_shardings=sharding, donate_argnums=0)
        for layer, value in layers:
            # waited for: queued asynchronously, every layer's host tensor would stay alive until its update ran
            stacked = put(stacked, value, np.int32(layer)).block_until_ready()
            del value
        return stacked

    model_cfg, state = family.hf_adapter.import_(config, source, dtype=dtype, place=place,  # type: ignore[union-attr]
                                                 scan_layers=model_cfg.scan_layers,
                                                 place_layers=place_layers)
    hashes = {"config.json": sha256_file(folder / "config.json")}
    hashes.update({p.name: sha256_file(p) for p in files})
    return ImportedCheckpoint(
        family=family_name, model_cfg=model_cfg, state=state, vocab_size=vocab_size, source_files=hashes,
        tokenizer_files=[folder / name for name in TOKENIZER_FILES if (folder / name).is_file()], hf_config=config,
    )
