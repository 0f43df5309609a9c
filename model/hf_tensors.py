"""Parameters <-> a Transformers state dict, by a family's table of tensors: the part every HF adapter shares.

A family's adapter (e.g. model/llama/hf.py, model/gemma3/hf.py) lists each of our parameters with its
Transformers name and layout (``HFTensor``); ``export_tensors`` and ``import_tensors`` walk that table.
Flax stores ``x @ W`` kernels as [in, out], PyTorch ``nn.Linear`` as [out, in]: a kernel is transposed
(and its multi-dim in/out views flattened), everything else keeps its values. Only numpy is needed.

Importing reads one tensor at a time from a mapping (model/hf_checkpoint.py passes a lazy one over the
safetensors files), checks its shape, casts it to the parameter dtype and hands it to ``place`` (which may
put it straight onto its devices); a scanned parameter is built from its layers as they are read
(``place_layers``), so no second full copy of the model is made on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flax import nnx

from experiment.errors import ConfigError, DataError
from model.stacking import BLOCKS, unrolled_pure

Place = Callable[[tuple[Any, ...], np.ndarray], Any]  # (our parameter path, value) -> the array the state holds
# (path, stacked shape, dtype, the layers' values as (layer, value), read one by one) -> the stacked array:
# a scanned parameter built on its devices a layer at a time, never whole on the host
PlaceLayers = Callable[[tuple[Any, ...], tuple[int, ...], Any, Iterator[tuple[int, np.ndarray]]], Any]


@dataclass(frozen=True)
class HFTensor:
    """One parameter's place in a Transformers state dict.

    ``path``: keys into ``nnx.to_pure_dict`` of our parameters (per-layer ``blocks/<i>/...``); ``name``: the HF
    tensor name; ``n_in``: for a kernel ``x @ W`` the number of our leading (input) dims, stored by PyTorch
    transposed as a 2-D [out, in] matrix; 0: the same values in the same order, flattened to 1-D where
    ``flat`` (biases).
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


def attention_tensors(layer: int) -> list[HFTensor]:
    """Layer ``layer``'s input norm and q/k/v/o projections under the names Transformers' decoders share
    (``model.layers.<i>.input_layernorm``, ``.self_attn.<x>_proj``): ours are ``blocks/<i>/attn_norm`` and
    ``blocks/<i>/attn/w<x>``."""
    hf, ours = f"model.layers.{layer}", (BLOCKS, layer)
    attn = (*ours, "attn")
    return [
        HFTensor((*ours, "attn_norm", "scale"), f"{hf}.input_layernorm.weight"),
        HFTensor((*attn, "wq"), f"{hf}.self_attn.q_proj.weight", 1),  # [d, heads, head_dim] <- [heads*head_dim, d]
        HFTensor((*attn, "wk"), f"{hf}.self_attn.k_proj.weight", 1),
        HFTensor((*attn, "wv"), f"{hf}.self_attn.v_proj.weight", 1),
        HFTensor((*attn, "wo"), f"{hf}.self_attn.o_proj.weight", 2),  # [heads, head_dim, d] <- [d, heads*head_dim]
    ]


def get_path(tree: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: Any, path: tuple[Any, ...], value: Any) -> None:
    get_path(tree, path[:-1])[path[-1]] = value


def source_of(state_dict: Any, name: str | None = None) -> str:
    """Where a tensor comes from, for error lines: the mapping's file (``file_of``) if it knows one."""
    file_of = getattr(state_dict, "file_of", None)
    found = file_of(name) if file_of is not None and name is not None else None
    return str(found or getattr(state_dict, "origin", None) or "state dict")


def export_tensors(model: Any, table: list[HFTensor]) -> dict[str, np.ndarray]:
    """The module's parameters under the table's names, in PyTorch's [out, in] layout (fp32), one tensor per
    layer whichever layout (scanned or unrolled) the model has."""
    pure = unrolled_pure(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    return {t.name: t.to_hf(np.asarray(get_path(pure, t.path), dtype=np.float32)) for t in table}


def import_tensors(state: nnx.State, table: list[HFTensor], state_dict: Mapping[str, Any], *, scanned: bool,
                   model_type: str, ignored: Callable[[str], bool], dtype: Any = np.float32, place: Place | None = None,
                   place_layers: PlaceLayers | None = None) -> nnx.State:
    """``state`` (an abstract model's parameters) filled from ``state_dict`` by ``table``: each tensor read once,
    checked against the parameter's shape, cast to ``dtype`` and handed to ``place`` (default: kept as numpy).

    A missing tensor, a tensor of another shape, and a tensor with no place in the table (unless ``ignored``:
    e.g. recomputed rotary frequencies, a tied head) are one DataError line naming the tensor, the weights read
    (Transformers' ``model_type``) and (where ``state_dict`` knows, by its ``file_of``) its file. ``scanned``: the
    parameters are stacked per layer; ``place_layers`` builds such a parameter from its layers as they are read
    (default: a host buffer filled layer by layer, then handed to ``place``)."""
    what = f"Hugging Face {model_type} weights"
    pure = nnx.to_pure_dict(state)
    for t in table:
        if t.name not in state_dict:
            raise DataError(f"{source_of(state_dict)}: tensor '{t.name}' is missing ({what})")
    known = {t.name for t in table}
    # anything neither in the table nor ignored would be silently lost
    unused = sorted(k for k in state_dict if k not in known and not ignored(k))
    if unused:
        raise DataError(f"{source_of(state_dict, unused[0])}: tensor '{unused[0]}' has no place in the {model_type} "
                        f"model ({len(unused)} such tensors; {what})")
    # one parameter at a time: a scanned parameter's layers are read one tensor after another into its
    # stacked buffer, which is placed (and freed here) before the next parameter is read
    groups: dict[tuple[Any, ...], list[HFTensor]] = {}
    for t in table:
        groups.setdefault(t.param_path(scanned), []).append(t)

    def read(t: HFTensor, shape: tuple[int, ...]) -> np.ndarray:
        value = state_dict[t.name]
        if tuple(value.shape) != t.hf_shape(shape):
            raise DataError(f"{source_of(state_dict, t.name)}: tensor '{t.name}' has shape {tuple(value.shape)}, "
                            f"the config implies {t.hf_shape(shape)} ({what})")
        return t.to_ours(np.asarray(value), shape).astype(dtype, copy=False)

    for path, tensors in groups.items():
        full = tuple(get_path(pure, path).shape)
        if not (scanned and tensors[0].layer() is not None):
            value = read(tensors[0], full)
            set_path(pure, path, value if place is None else place(path, value))
            continue
        layers = ((t.layer(), read(t, full[1:])) for t in tensors)  # one tensor in memory at a time
        if place_layers is not None:
            set_path(pure, path, place_layers(path, full, dtype, layers))
            continue
        buffer = np.empty(full, dtype)
        for layer, value in layers:
            buffer[layer] = value
        set_path(pure, path, buffer if place is None else place(path, buffer))
        del buffer
    nnx.replace_by_pure_dict(state, pure)
    return state


def config_reader(hf_config: Mapping[str, Any], model_type: str) -> Callable[[str], Any]:
    """``need(key)``: a config.json's value, or one ConfigError line naming the missing key; made after the
    checks every adapter starts with (its ``model_type`` is ours, it is not a quantized checkpoint)."""
    where = f"Hugging Face {model_type} config"

    def need(key: str) -> Any:
        if key not in hf_config:
            raise ConfigError(f"{where}: key '{key}' is missing")
        return hf_config[key]

    if need("model_type") != model_type:
        raise ConfigError(f"{where}: model_type '{hf_config['model_type']}' is not {model_type}")
    if hf_config.get("quantization_config"):
        raise ConfigError(f"{where}: quantization_config is not supported (a quantized checkpoint)")
    return need


# -- mixtures of experts: Transformers' checkpoints hold a tensor per expert and projection, ours one [E, in, out]

@dataclass(frozen=True)
class ExpertTensors(HFTensor):
    """One layer's stacked expert parameter [E, in, out] as Transformers' E tensors [out, in]: ``name`` holds a ``*``
    where the expert index goes; ``expert_shape`` is one expert's tensor shape, as the config implies it."""

    expert_shape: tuple[int, int] = (0, 0)
    n_experts: int = 0

    def names(self) -> list[str]:
        return [self.name.replace("*", str(e)) for e in range(self.n_experts)]

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[0], shape[2], shape[1])

    def to_ours(self, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.swapaxes(value, 1, 2).reshape(shape)

    def to_hf(self, value: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.swapaxes(value, 1, 2))


def split_experts(tensors: dict[str, np.ndarray], table: list[HFTensor]) -> dict[str, np.ndarray]:
    """``export_tensors``' output with each stacked expert parameter [E, out, in] split into its E tensors."""
    for t in table:
        if isinstance(t, ExpertTensors):
            experts = tensors.pop(t.name)
            tensors.update({name: np.ascontiguousarray(experts[e]) for e, name in enumerate(t.names())})
    return tensors


class StackedExperts:
    """One layer's E expert tensors of one projection, read as one [E, out, in] array when asked for (``shape``
    checks each expert's shape first: a wrong one is one DataError line naming its tensor)."""

    def __init__(self, source: Mapping[str, Any], names: list[str], expert_shape: tuple[int, int], what: str):
        self.source, self.names, self.expert_shape, self.what = source, names, expert_shape, what

    @property
    def shape(self) -> tuple[int, ...]:
        for name in self.names:
            found = tuple(self.source[name].shape)
            if found != self.expert_shape:
                raise DataError(f"{source_of(self.source, name)}: tensor '{name}' has shape {found}, the config "
                                f"implies {self.expert_shape} ({self.what})")
        return (len(self.names), *self.expert_shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        first = np.asarray(self.source[self.names[0]])
        out = np.empty((len(self.names), *first.shape), first.dtype)
        out[0] = first
        for e, name in enumerate(self.names[1:], start=1):
            out[e] = np.asarray(self.source[name])
        return out if dtype is None else out.astype(dtype)


class ExpertSource(Mapping[str, Any]):
    """A state dict as model/hf_tensors.py's ``import_tensors`` reads it: each layer's per-expert tensors of a
    projection behind the one name of their ``ExpertTensors`` (a ``StackedExperts``), every other tensor as it is.
    An expert tensor the config does not imply (an index >= n_experts) stays visible, so it is reported as having no
    place in the model; ``file_of`` and ``origin`` are the source's, for error lines."""

    def __init__(self, source: Mapping[str, Any], table: list[HFTensor], what: str):
        self.source, self.what = source, what
        self.origin = getattr(source, "origin", None)
        self.groups = {t.name: (t.names(), t.expert_shape) for t in table if isinstance(t, ExpertTensors)}
        self.grouped = {name for names, _ in self.groups.values() for name in names}

    def missing(self) -> str | None:
        """The first expert tensor the config implies that the source lacks."""
        return next((name for names, _ in self.groups.values() for name in names if name not in self.source), None)

    def file_of(self, name: str) -> str | None:
        file_of = getattr(self.source, "file_of", None)
        if file_of is None:
            return None
        return file_of(self.groups[name][0][0] if name in self.groups else name)

    def __contains__(self, name: object) -> bool:
        if name in self.groups:
            return all(n in self.source for n in self.groups[name][0])  # type: ignore[index]
        return name in self.source

    def __getitem__(self, name: str) -> Any:
        if name in self.groups:
            return StackedExperts(self.source, *self.groups[name], self.what)
        return self.source[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.groups
        yield from (name for name in self.source if name not in self.grouped)

    def __len__(self) -> int:
        return len(self.groups) + sum(1 for name in self.source if name not in self.grouped)


class TableAdapter:
    """A family's Hugging Face adapter (``model.family.HFAdapter``) as its table of tensors: what every family's
    export, config reading and import share. Made of what config.json names (``architecture``, ``model_type``),
    the registered ``family``, and three functions of the family's: ``tensors`` (the table for a config),
    ``to_config`` (config.json of ours) and ``from_config`` (ours of a config.json, a feature it lacks one
    ConfigError line); ``check_export`` (default: the section's validation) says what cannot be exported. A
    mixture of experts' per-expert tensors (``ExpertTensors`` in the table) are split on export and stacked on
    import here too. A family with more to leave out on import overrides ``ignored``."""

    def __init__(self, architecture: str, model_type: str, family: str,
                 tensors: Callable[[Any], list[HFTensor]],
                 to_config: Callable[[Any, int, Mapping[str, int] | None], dict[str, Any]],
                 from_config: Callable[[Mapping[str, Any]], Any],
                 check_export: Callable[[Any], None] = lambda model_cfg: model_cfg.validate("model")):
        self.architecture, self.model_type, self.family = architecture, model_type, family
        self.tensors, self.to_config, self.from_config = tensors, to_config, from_config
        self.check_export = check_export

    def ignored(self, name: str, model_cfg: Any, hf_config: Mapping[str, Any]) -> bool:
        """A state dict's tensor import may leave out: the rotary inverse frequencies (recomputed from the config)
        and a tied model's head (its embedding)."""
        return name.endswith("rotary_emb.inv_freq") or (model_cfg.tie_embeddings and name == "lm_head.weight")

    def export(self, model: Any, model_cfg: Any, vocab_size: int,
               special_ids: Mapping[str, int] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The decoder's parameters under Transformers' names in PyTorch's layout (fp32), a tensor per layer (and
        per expert) whichever layout the model has, and config.json."""
        self.check_export(model_cfg)
        table = self.tensors(model_cfg)
        return split_experts(export_tensors(model, table), table), self.to_config(model_cfg, vocab_size, special_ids)

    def config(self, hf_config: Mapping[str, Any]) -> tuple[Any, int]:
        """(our model config, vocabulary size) of a config.json."""
        vocab_size = int(hf_config.get("vocab_size") or 0)
        if vocab_size <= 0:
            raise ConfigError(f"Hugging Face {self.model_type} config: vocab_size is missing or not positive")
        return self.from_config(hf_config), vocab_size

    def import_(self, hf_config: Mapping[str, Any], state_dict: Mapping[str, Any], *,
                dtype: Any = np.float32, place: Place | None = None, scan_layers: bool | None = None,
                place_layers: PlaceLayers | None = None) -> tuple[Any, nnx.State]:
        """The inverse of ``export``: each tensor (each layer's experts of a projection: one stacked parameter) is
        read once, checked against the shape the config implies, cast to ``dtype`` and handed to ``place``
        (default: kept as a numpy array). A missing tensor, a tensor of another shape and a tensor with no place in
        the model are one DataError line naming the tensor and (where ``state_dict`` knows, by its ``file_of``)
        its file. ``scan_layers``: the layer layout made (None: the config section's default); ``place_layers``
        builds a stacked parameter from its layers as they are read (default: a host buffer filled layer by
        layer, then ``place``d)."""
        from model.family import get_family  # the registry imports the families, whose adapters import this

        cfg, vocab_size = self.config(hf_config)
        if scan_layers is not None:
            cfg = dataclasses.replace(cfg, scan_layers=scan_layers)
        state = nnx.state(get_family(self.family).abstract(cfg, vocab_size), nnx.Param)
        table = self.tensors(cfg)
        what = f"Hugging Face {self.model_type} weights"
        source = ExpertSource(state_dict, table, what)
        missing = source.missing()
        if missing is not None:
            raise DataError(f"{source_of(state_dict)}: tensor '{missing}' is missing ({what})")
        import_tensors(state, table, source, scanned=bool(cfg.scan_layers), model_type=self.model_type,
                       ignored=lambda name: self.ignored(name, cfg, hf_config), dtype=dtype, place=place,
                       place_layers=place_layers)
        return cfg, state
