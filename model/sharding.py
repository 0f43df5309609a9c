"""The device mesh and the logical-axis rules that lay parameters and activations out on it.

Every parameter of the decoder names its dimensions with logical axes ("embed", "heads", "mlp",
...). A rules table (the family's ``AXIS_RULES`` under ``train.mesh.rules`` in the config) maps each
logical axis to zero or more mesh axes ("data", "fsdp", "tensor", and any axis a family adds, such as a
mixture of experts' "expert", sized by ``train.mesh.axes``). We translate names to ``PartitionSpec``s
here rather than through Flax's global rules context, so that one function decides every layout and can check it:
under ``jax.jit`` a dimension that does not divide its mesh axes is silently left unsharded,
which on a TPU slice means a model that no longer fits, so indivisible layouts are errors here.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from experiment.errors import ConfigError
from experiment.sections.train import BASE_MESH_AXES, MeshConfig

MESH_AXES = BASE_MESH_AXES  # every run's; a family's rules may add more (``train.mesh.axes``: ``family_axes``)
Rules = Mapping[str, Sequence[str]]


def family_axes(mesh_cfg: MeshConfig, rules: Rules | None = None) -> dict[str, int]:
    """The mesh axes beyond data/fsdp/tensor with their sizes: those ``train.mesh.axes`` sizes (config load has
    added every one the family's rules use), then any other that ``rules`` lay a logical axis out on (size 1)."""
    sizes = dict(mesh_cfg.axes)
    for axes in (rules or {}).values():
        for axis in axes:
            if axis not in MESH_AXES:
                sizes.setdefault(axis, 1)
    return sizes


def mesh_shape(mesh_cfg: MeshConfig, n_devices: int, rules: Rules | None = None) -> dict[str, int]:
    """Sizes of the mesh axes for ``n_devices``, in the mesh's order: data, fsdp, the family's axes
    (``family_axes``), tensor; ``data: -1`` takes what is left.

    Why this order: the last axes of a device grid are the devices nearest each other (on a TPU slice
    ``mesh_utils.create_device_mesh`` gives them the fastest links, on a GPU host NVLink). Tensor parallelism
    exchanges activations inside every matmul, so it is innermost; expert parallelism's all-to-all (once per
    mixture-of-experts layer) next; fsdp's gathers of the weights then; data parallelism reduces the gradients
    once per step, and is the outermost (the one that spans slices)."""
    extra = family_axes(mesh_cfg, rules)
    fixed = mesh_cfg.fsdp * mesh_cfg.tensor * mesh_cfg.dcn_data * math.prod(extra.values())
    data = mesh_cfg.data
    if data == -1:
        if n_devices % fixed:
            raise ConfigError(
                f"config key 'train.mesh': fsdp={mesh_cfg.fsdp} x tensor={mesh_cfg.tensor} "
                f"x dcn_data={mesh_cfg.dcn_data}{''.join(f' x axes.{a}={n}' for a, n in extra.items())} "
                f"= {fixed} does not divide the {n_devices} devices"
            )
        data = n_devices // fixed  # per slice: the data axis spans the slices too
    data *= mesh_cfg.dcn_data
    shape = {"data": data, "fsdp": mesh_cfg.fsdp, **extra, "tensor": mesh_cfg.tensor}
    if math.prod(shape.values()) != n_devices:
        raise ConfigError(
            f"config key 'train.mesh': {' x '.join(shape)} = {' x '.join(map(str, shape.values()))} "
            f"= {math.prod(shape.values())} devices, but {n_devices} are available"
        )
    return shape


def build_mesh(mesh_cfg: MeshConfig, devices: Sequence[Any] | None = None, rules: Rules | None = None) -> Mesh:
    """A mesh with Auto axis types (GSPMD propagation) over ``devices`` (default: all devices), its axes
    ``mesh_shape``'s: data, fsdp, the family's own (``train.mesh.axes``; ``rules``, the run's, adds any they use
    that the config does not size, at size 1), tensor.

    With several slices (``dcn_data > 1``) the data axis spans slices, so only data-parallel
    gradient reductions cross the slow data-centre network.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_cfg, len(devices), rules)
    names = tuple(shape)
    axis_types = (AxisType.Auto,) * len(names)
    if mesh_cfg.dcn_data > 1:
        from jax.experimental import mesh_utils

        ici = (shape["data"] // mesh_cfg.dcn_data, *list(shape.values())[1:])
        dcn = (mesh_cfg.dcn_data, *[1] * (len(names) - 1))
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
        return Mesh(grid, names, axis_types=axis_types)
    if devices and devices[0].platform == "tpu":
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(tuple(shape.values()), devices=devices)
    else:
        grid = np.asarray(devices).reshape(tuple(shape.values()))
    return Mesh(grid, names, axis_types=axis_types)


def check_mesh_axes(mesh: Mesh | AbstractMesh, rules: Rules) -> None:
    """Every mesh axis ``rules`` lay a logical axis out on is one of ``mesh``'s (a family's axis, such as
    expert, comes from ``train.mesh.axes``, which config load fills in; a config built in code must size it)."""
    for logical, axes in rules.items():
        missing = [axis for axis in axes if axis not in mesh.axis_names]
        if missing:
            raise ConfigError(f"config key 'train.mesh.axes.{missing[0]}': the rule for logical axis '{logical}' "
                              f"lays it out on mesh axis '{missing[0]}', which the mesh ({', '.join(mesh.axis_names)})"
                              " does not have; size it in train.mesh.axes (1: not split)")


def logical_to_spec(logical: Sequence[str | None], rules: Rules) -> PartitionSpec:
    """Translate logical dim names to a PartitionSpec (a mesh axis is used at most once)."""
    used: set[str] = set()
    spec: list[Any] = []
    for name in logical:
        axes = [] if name is None else [a for a in rules[name] if a not in used]
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*spec)


def spec_axes(entry: str | Sequence[str] | None) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, one axis name or several)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def mesh_parts(mesh: Mesh, entry: str | Sequence[str] | None) -> int:
    """How many parts a dim laid out by one PartitionSpec entry is split into on ``mesh``."""
    return math.prod(mesh.shape[axis] for axis in spec_axes(entry))


def check_divisible(what: str, shape: Sequence[int], spec: PartitionSpec, mesh: Mesh) -> None:
    for dim, entry in zip(shape, spec, strict=False):
        if entry is None:
            continue
        axes = spec_axes(entry)
        parts = mesh_parts(mesh, axes)
        if dim % parts:
            raise ConfigError(
                f"{what}: dimension of size {dim} cannot be split over mesh axes {'x'.join(axes)} ({parts} devices); "
                "change train.mesh (or train.mesh.rules) or the model size"
            )


def tree_shardings(abstract_tree: Any, mesh: Mesh, rules: Rules) -> Any:
    """The same tree with every leaf replaced by its NamedSharding.

    Parameters (and optimizer moments, which optax builds with the same ``nnx.Param`` nodes) are
    laid out by their logical axis names; other leaves (step counters, RNG) are replicated. Every
    sharded dim must divide its mesh axes, else a ConfigError names the parameter and the axes.
    """

    def sharding(path: tuple[Any, ...], leaf: Any) -> Any:
        if not isinstance(leaf, nnx.Variable):
            return NamedSharding(mesh, PartitionSpec())
        where = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        names = leaf.get_metadata().get("out_sharding")
        if names is None:
            raise ValueError(f"parameter {where} has no logical axis names (out_sharding metadata)")
        spec = logical_to_spec(names, rules)
        check_divisible(f"parameter {where} {tuple(names)}", leaf.shape, spec, mesh)
        return leaf.replace(NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(sharding, abstract_tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(("batch", "length"), rules))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


# Activation layout: the model calls ``constrain(x, ("batch", "length", "act_embed"))`` at key
# points; while a trainer has set a mesh and rules (during tracing), that pins the layout, and
# outside it (eval on one device, tests) it does nothing.
_ACTIVATION_LAYOUT: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
    "activation_layout", default=None
)


@contextlib.contextmanager
def activation_layout(mesh: Mesh, rules: Rules) -> Iterator[None]:
    token = _ACTIVATION_LAYOUT.set((mesh, rules))
    try:
        yield
    finally:
        _ACTIVATION_LAYOUT.reset(token)


def current_layout() -> tuple[Mesh, Rules] | None:
    """The mesh and rules of the step being traced, or None outside one (eval on one device, tests)."""
    return _ACTIVATION_LAYOUT.get()


def compiled_platform() -> str:
    """The platform the step being traced is compiled for: the mesh's (a TPU topology's in an ahead-of-time
    compile on a CPU host), or the default backend outside a trainer's layout."""
    layout = _ACTIVATION_LAYOUT.get()
    return mesh_platform(layout[0]) if layout is not None else jax.default_backend()


def mesh_platform(mesh: Mesh | AbstractMesh) -> str:
    """The platform of a mesh's devices. An ``AbstractMesh`` (no devices: a step traced for a machine this
    host does not have, e.g. the Trainium check of trainer/neuron_check.py) names it in its abstract device."""
    if isinstance(mesh, AbstractMesh):
        return mesh.abstract_device.platform if mesh.abstract_device is not None else jax.default_backend()
    return mesh.devices.flat[0].platform


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    layout = _ACTIVATION_LAYOUT.get()
    if layout is None:
        return x
    mesh, rules = layout
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(logical, rules)))
