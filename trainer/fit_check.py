"""Will this config fit in a TPU slice's HBM? Answered on a CPU, before paying for the slice.

libtpu (the optional ``tpu`` extra) can compile for a TPU topology it does not have. We build the
real train step (same model, mesh rules, optimizer, batch) for the named topology, compile it
ahead of time from abstract inputs, and read the compiler's per-device memory analysis: the
arguments (parameters, optimizer state, batch), outputs, and temporaries (activations). A config
that cannot fit fails to compile within seconds with ``RESOURCE_EXHAUSTED ... HbmOom``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import logging
import math
import os
import re
import time
from typing import Any

from cost.hf_shapes import hf_model_shape
from experiment.errors import ConfigError, RecipeError
from experiment.files import atomic_write_json, atomic_write_text
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.model import FamilyConfig
from experiment.sections.train import CONTEXT_AXIS, MeshConfig, TrainConfig
from experiment.stages import FIT_CHECK, SHARDS, TOKENIZER
from experiment.storage import location
from trainer.fit_verdicts import MEMORY_PARTS, FitVerdicts, verdict_key, worth_keeping

log = logging.getLogger("trainer.fit_check")
GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str  # libtpu's topology name, e.g. "v5e:4x4"
    chip_config: str  # "default", or "megacore" for v4/v5p (two cores act as one device)
    usable_hbm_gib: float  # what the compiler lets a program use per device


# Cloud TPU slice names (chips for v5e/v6e, TensorCores for v5p and tpu7x) -> topology. A tpu7x chip shows its
# two TensorCores as two devices (no megacore): tpu7x-8 is 8 devices on 4 chips (2x2x1), 94.75 GiB each.
_V5E, _V6E, _V5P, _TPU7X = 15.75, 31.24, 95.73, 94.75  # usable HBM per device as libtpu reports it here
TOPOLOGIES: dict[str, Topology] = {
    "v5e-4": Topology("v5e:2x2", "default", _V5E),
    "v5e-8": Topology("v5e:2x4", "default", _V5E),
    "v5e-16": Topology("v5e:4x4", "default", _V5E),
    "v5e-32": Topology("v5e:4x8", "default", _V5E),
    "v5e-64": Topology("v5e:8x8", "default", _V5E),
    "v5e-128": Topology("v5e:8x16", "default", _V5E),
    "v5e-256": Topology("v5e:16x16", "default", _V5E),
    "v6e-4": Topology("v6e:2x2", "default", _V6E),
    "v6e-8": Topology("v6e:2x4", "default", _V6E),
    "v6e-16": Topology("v6e:4x4", "default", _V6E),
    "v6e-32": Topology("v6e:4x8", "default", _V6E),
    "v6e-64": Topology("v6e:8x8", "default", _V6E),
    "v6e-256": Topology("v6e:16x16", "default", _V6E),
    "v5p-8": Topology("v5:2x2x1", "megacore", _V5P),
    "v5p-16": Topology("v5:2x2x2", "megacore", _V5P),
    "v5p-32": Topology("v5:2x2x4", "megacore", _V5P),
    "v5p-64": Topology("v5:2x4x4", "megacore", _V5P),
    "v5p-128": Topology("v5:4x4x4", "megacore", _V5P),
    "tpu7x-8": Topology("tpu7x:2x2x1", "default", _TPU7X),
    "tpu7x-16": Topology("tpu7x:2x2x2", "default", _TPU7X),
    "tpu7x-32": Topology("tpu7x:2x2x4", "default", _TPU7X),
    "tpu7x-64": Topology("tpu7x:2x4x4", "default", _TPU7X),
    "tpu7x-128": Topology("tpu7x:4x4x4", "default", _TPU7X),
}


class DoesNotFit(RecipeError):
    """The train step needs more HBM per device than the topology has."""


def require_libtpu() -> None:
    if importlib.util.find_spec("libtpu") is None:
        raise RecipeError("the TPU fit check needs libtpu: pip install -e '.[tpu]' (jax[tpu] at this jax version)")
    # several compiles (tests, parallel checks) may load libtpu in one machine; no TPU is attached
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


@functools.cache
def explain_libtpu_warning() -> None:
    """Once per process, before the first topology loads libtpu: libtpu then prints, on every run, a warning that
    sounds fatal and is not (it looks for the TPU of this machine; the compiles name their target topology)."""
    log.info("libtpu may warn next that it 'could not determine TPU accelerator type': expected, no TPU is attached "
             "here and each compile names its target topology")


def check_topology_name(slice_name: str) -> None:
    if slice_name not in TOPOLOGIES:
        near = difflib.get_close_matches(slice_name, list(TOPOLOGIES), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise ConfigError(f"config key 'train.fit_topologies': unknown TPU slice '{slice_name}'{hint} "
                          f"(known: {', '.join(TOPOLOGIES)})")


def check_topology_names(cfg: ExperimentConfig, run_folder: RunFolder) -> None:
    """The stage check of recipe 04b (experiment/check.py): every ``train.fit_topologies`` entry is a slice
    it knows, before anything is written or compiled."""
    for slice_name in cfg.train.fit_topologies:
        check_topology_name(slice_name)


def topology_devices(slice_name: str, num_slices: int = 1) -> list[Any]:
    check_topology_name(slice_name)
    require_libtpu()
    from jax.experimental import topologies

    explain_libtpu_warning()
    topo = TOPOLOGIES[slice_name]
    desc = topologies.get_topology_desc(platform="tpu", topology_name=topo.name, chip_config_name=topo.chip_config,
                                        chips_per_host_bounds=(2, 2, 1), num_slices=num_slices)
    return list(desc.devices)


@dataclasses.dataclass(frozen=True)
class ContextSplit:
    """A sequence split over ``parts`` devices (model/context.py), the chips taken from the data-parallel axes
    (``context_candidates``): ``train.mesh.axes.context=parts`` with ``data`` x ``fsdp`` the rest of them. The
    parameters and optimizer state are sharded over the context axis too (``train.mesh.rules.embed`` gains
    ``context``, as MaxText shards them over its sequence axes): otherwise a chip given to context would hold a
    larger share of the state than before."""

    parts: int
    attention: str  # model.context_attention: all_gather or ring
    data: int  # train.mesh.data, per slice
    fsdp: int  # train.mesh.fsdp
    embed: tuple[str, ...]  # train.mesh.rules.embed: the run's rule and the context axis

    def overrides(self) -> list[str]:
        return [f"train.mesh.data={self.data}", f"train.mesh.fsdp={self.fsdp}",
                f"train.mesh.axes.{CONTEXT_AXIS}={self.parts}", f"train.mesh.rules.embed=[{','.join(self.embed)}]",
                f"model.context_attention={self.attention}"]

    def mesh(self, mesh_cfg: MeshConfig) -> MeshConfig:
        """``mesh_cfg`` with this split (the sequence laid out on the context axis, as config load does)."""
        return dataclasses.replace(mesh_cfg, data=self.data, fsdp=self.fsdp,
                                   axes={**mesh_cfg.axes, CONTEXT_AXIS: self.parts},
                                   rules={**mesh_cfg.rules, "length": [CONTEXT_AXIS], "embed": list(self.embed)})


@dataclasses.dataclass(frozen=True)
class Setting:
    """What the fit search varies: the knobs that trade HBM for compute or for steps (and, where nothing fits
    without it, the context split)."""

    remat: str
    attention: str
    grad_accum_steps: int
    context: ContextSplit | None = None

    def overrides(self) -> list[str]:
        return [f"model.remat={self.remat}", f"model.attention={self.attention}",
                f"train.grad_accum_steps={self.grad_accum_steps}", *(self.context.overrides() if self.context else [])]


def configured_setting(model_cfg: FamilyConfig, train_cfg: TrainConfig) -> Setting:
    return Setting(model_cfg.remat, model_cfg.attention, train_cfg.grad_accum_steps)


def setting_costs(model_cfg: FamilyConfig, train_cfg: TrainConfig, vocab_size: int, seq_len: int,
                  platform: str) -> dict[str, Any]:
    """Hand-counted model and hardware FLOPs per step of this setting, and the kernel ``auto`` picks."""
    from model.registry import family_of

    kernel, model_flops, hardware_flops = family_of(model_cfg).train_costs(
        model_cfg, vocab_size, seq_len, platform, train_cfg.compute_dtype, train_cfg.loss_chunk_len)
    tokens = train_cfg.batch_size * seq_len
    return {"attention_kernel": kernel, "model_flops_per_step": model_flops * tokens,
            "hardware_flops_per_step": hardware_flops * tokens, "recompute_factor": hardware_flops / model_flops}


def check_fit(model_cfg: FamilyConfig, train_cfg: TrainConfig, vocab_size: int, seq_len: int, slice_name: str,
              packed: bool = False, setting: Setting | None = None,
              verdicts: FitVerdicts | None = None) -> dict[str, Any]:
    """Compile the train step for ``slice_name`` and report per-device memory; never raises on OOM.

    ``setting`` replaces the config's remat, attention and accumulation (the fit search's candidates).
    ``verdicts``: the compiler's answers kept from earlier runs (trainer/fit_verdicts.py): the same lowered
    program for the same target is not compiled again (``verdict_cached`` in the report).
    """
    from trainer.step import TrainProgram

    setting = setting or configured_setting(model_cfg, train_cfg)
    model_cfg = dataclasses.replace(model_cfg, remat=setting.remat, attention=setting.attention)
    train_cfg = dataclasses.replace(train_cfg, grad_accum_steps=setting.grad_accum_steps)
    if setting.context is not None:
        model_cfg = dataclasses.replace(model_cfg, context_attention=setting.context.attention)
        train_cfg = dataclasses.replace(train_cfg, mesh=setting.context.mesh(train_cfg.mesh))
    devices = topology_devices(slice_name, train_cfg.mesh.dcn_data)
    capacity = TOPOLOGIES[slice_name].usable_hbm_gib
    report: dict[str, Any] = {"slice": slice_name, "topology": TOPOLOGIES[slice_name].name, "devices": len(devices),
                              "capacity_gib": capacity, **dataclasses.asdict(setting),
                              **context_fields(model_cfg, train_cfg),
                              "scan_layers": model_cfg.scan_layers, "loss_chunk_len": train_cfg.loss_chunk_len,
                              **setting_costs(model_cfg, train_cfg, vocab_size, seq_len, "tpu")}
    try:
        mesh, parts = slice_layout(model_cfg, train_cfg, devices)
    except ConfigError as exc:  # this slice's devices, not the config: the others are still checked
        return {**report, "fits": False, "unsplittable": True, "compile_s": 0.0, "error": str(exc)}
    except NotImplementedError as exc:  # jax's mesh_utils: an axis that is no product of the torus's axes
        return {**report, "fits": False, "unsplittable": True, "compile_s": 0.0,
                "error": f"config key 'train.mesh': the mesh does not tile the slice's torus ({str(exc)[:200]})"}
    report.update(mesh=dict(mesh.shape),
                  micro_batch_per_device=train_cfg.batch_size // setting.grad_accum_steps // parts)
    try:
        program = TrainProgram(model_cfg, train_cfg, vocab_size, mesh, seed=0)
        lowered = program.lower(program.abstract_batch(train_cfg.batch_size, seq_len, packed))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 (a feature the TPU path lacks, found while lowering its kernels)
        return {**report, "fits": False, "compile_s": 0.0, "error": compiler_error(exc)}
    if verdicts is None:
        return {**report, **read_answer(compile_answer(lowered), capacity), "verdict_cached": False}
    topology = TOPOLOGIES[slice_name]
    key = verdict_key(lowered.as_text(), {"topology": topology.name, "chip_config": topology.chip_config,
                                          "num_slices": train_cfg.mesh.dcn_data})
    answer = verdicts.get(key)
    cached = answer is not None
    if answer is None:
        answer = compile_answer(lowered)
        if worth_keeping(answer):
            verdicts.put(key, answer,
                         {k: report[k] for k in ("slice", "mesh", "remat", "attention", "grad_accum_steps")})
    return {**report, **read_answer(answer, capacity), "verdict_cached": cached}


def context_fields(model_cfg: FamilyConfig, train_cfg: TrainConfig) -> dict[str, Any]:
    """The report's context split: the devices one sequence is split over and how they attend (1 and "" when the
    sequence is not split)."""
    parts = train_cfg.mesh.axes.get(CONTEXT_AXIS, 1)
    return {"context_parts": parts, "context_attention": getattr(model_cfg, "context_attention", "") if parts > 1
            else ""}


def compiler_error(exc: BaseException) -> str:
    """The report's error: the compiler's out-of-memory line, else what would not compile (the compiler
    reports OOM, and features a topology lacks, as generic runtime errors)."""
    text = str(exc)
    lines = text.splitlines() or [""]
    if "RESOURCE_EXHAUSTED" in text or "HbmOom" in text:
        return next((line for line in lines if "RESOURCE_EXHAUSTED" in line), lines[0][:300])
    return f"does not compile: {type(exc).__name__}: {lines[0][:300]}"


def compile_answer(lowered: Any) -> dict[str, Any]:
    """What the compiler says of ``lowered``: its per-device memory parts in bytes, or its error line."""
    started = time.perf_counter()
    try:
        memory = lowered.compile().memory_analysis()
    except Exception as exc:  # noqa: BLE001 (compiler_error)
        return {"error": compiler_error(exc), "compile_s": time.perf_counter() - started}
    return {"memory_bytes": {name: int(getattr(memory, f"{name}_size_in_bytes", 0)) for name in MEMORY_PARTS},
            "compile_s": time.perf_counter() - started}


def read_answer(answer: dict[str, Any], capacity_gib: float) -> dict[str, Any]:
    """The report's verdict from the compiler's answer and the slice's capacity."""
    if "error" in answer:
        return {"fits": False, "compile_s": answer["compile_s"], "error": answer["error"]}
    parts = answer["memory_bytes"]
    needed = parts["argument"] + parts["output"] - parts["alias"] + parts["temp"] + parts["generated_code"]
    return {"fits": needed <= capacity_gib * GIB, "needed_gib": needed / GIB,
            **{f"{k}_gib": v / GIB for k, v in parts.items()}, "compile_s": answer["compile_s"]}


def _data_parts(mesh: Any, model_cfg: FamilyConfig, train_cfg: TrainConfig) -> int:
    """The devices the batch is split over: the mesh axes of the run's "batch" rule (data x fsdp, and a
    family's expert axis where its rules list it)."""
    from model.registry import family_of
    from model.sharding import batch_sharding, mesh_parts

    spec = batch_sharding(mesh, family_of(model_cfg).mesh_rules(train_cfg.mesh.rules)).spec
    return mesh_parts(mesh, spec[0] if spec else None)


def slice_layout(model_cfg: FamilyConfig, train_cfg: TrainConfig, devices: list[Any]) -> tuple[Any, int]:
    """(the run's mesh over a slice's ``devices``, the devices the batch is split over); a ConfigError naming the
    key when the mesh does not divide the slice or the micro-batch does not split over its data-parallel devices
    (what recipe 04 would refuse on that slice: the fit search's other slices are still checked)."""
    from model.registry import family_of
    from model.sharding import batch_sharding, build_mesh
    from trainer.step import check_batch

    mesh = build_mesh(train_cfg.mesh, devices)
    check_batch(train_cfg, batch_sharding(mesh, family_of(model_cfg).mesh_rules(train_cfg.mesh.rules)))
    return mesh, _data_parts(mesh, model_cfg, train_cfg)


def describe(report: dict[str, Any]) -> str:
    mesh = f"mesh {report['mesh']}; " if "mesh" in report else ""
    head = (f"{report['slice']} ({report['topology']}, {report['devices']} devices, {mesh}"
            f"{'scanned' if report.get('scan_layers') else 'unrolled'} layers, remat {report['remat']}, "
            + (f"context {report['context_parts']} ({report['context_attention']} attention), "
               if report.get("context_parts", 1) > 1 else
               f"attention {report['attention']} -> {report['attention_kernel']}, ") +
            f"{report['grad_accum_steps']} micro-batch(es))")
    if "needed_gib" in report:
        verdict = "fits" if report["fits"] else "DOES NOT FIT"
        return (f"{head}: {verdict}, {report['needed_gib']:.2f} GiB of {report['capacity_gib']:.2f} GiB per device "
                f"(arguments {report['argument_gib']:.2f}, temporaries {report['temp_gib']:.2f}); "
                f"recompute {report['recompute_factor']:.2f}x; compiled in {report['compile_s']:.0f} s"
                + (" by an earlier run (the same program for this slice: its answer was kept)"
                   if report.get("verdict_cached") else ""))
    if report.get("unsplittable"):
        return f"{head}: CANNOT SPLIT the step over this slice ({report['error']})"
    return f"{head}: DOES NOT FIT ({report['error']})"


REMAT_ORDER = ("none", "save_dots", "offload", "full")  # by recompute, cheapest first


def accumulation_splits(train_cfg: TrainConfig, data_parts: int) -> list[int]:
    """Accumulation steps that keep the micro-batch divisible over the data-parallel devices, fewest first."""
    return [k for k in range(1, train_cfg.batch_size + 1)
            if train_cfg.batch_size % k == 0 and (train_cfg.batch_size // k) % data_parts == 0]


def search_fit(model_cfg: FamilyConfig, train_cfg: TrainConfig, vocab_size: int, seq_len: int, slice_name: str,
               packed: bool = False, verdicts: FitVerdicts | None = None) -> list[dict[str, Any]]:
    """Try remat policies x attention kernels x accumulation splits on ``slice_name``, then, only where none of
    them fits (or the batch does not split over the slice), context splits (``search_context``); every
    compile's report.

    For each remat policy and kernel, accumulation grows (1, 2, 4, ...; jumping by the compiler's
    temporaries) until the step fits, and never past the fewest micro-batches that already fit with a
    cheaper policy (they could not be the best), so a policy costs one compile when it fits. Kernels tried: the
    config's (``auto`` picks splash on TPU) and XLA's ``dot_product`` when the config's is not it, so the table
    shows what the kernel buys.
    The best row is marked (``best``): see ``best_setting``.
    """
    devices = topology_devices(slice_name, train_cfg.mesh.dcn_data)
    try:
        parts = slice_layout(model_cfg, dataclasses.replace(train_cfg, grad_accum_steps=1), devices)[1]
    except (ConfigError, NotImplementedError):  # the mesh does not divide (or tile) the slice, or the batch does not
        # split over it at one micro-batch
        parts = None
    splits = accumulation_splits(train_cfg, parts) if parts else []
    rows: list[dict[str, Any]] = []
    if not splits:  # nothing to search: the config's setting, reported as what cannot split over this slice
        report = check_fit(model_cfg, train_cfg, vocab_size, seq_len, slice_name, packed, verdicts=verdicts)
        log.info("  %s", describe(report))
        rows.append(report)
    kernels = [model_cfg.attention] + (["dot_product"] if model_cfg.attention != "dot_product" else [])
    fewest = splits[-1] if splits else 0  # micro-batches of the best setting so far: more cannot win
    for attention in kernels if splits else []:
        for remat in [r for r in REMAT_ORDER if r in train_cfg.fit_search_remat]:
            rows += grow_accumulation(model_cfg, train_cfg, vocab_size, seq_len, slice_name, packed, verdicts,
                                      splits, fewest, remat, attention)
            if rows[-1]["fits"]:
                fewest = min(fewest, rows[-1]["grad_accum_steps"])
    if not any(row["fits"] for row in rows):
        rows += search_context(model_cfg, train_cfg, vocab_size, seq_len, slice_name, packed, verdicts, len(devices))
    best = best_setting(rows)
    for row in rows:
        row["best"] = row is best
    return rows


def grow_accumulation(model_cfg: FamilyConfig, train_cfg: TrainConfig, vocab_size: int, seq_len: int,
                      slice_name: str, packed: bool, verdicts: FitVerdicts | None, splits: list[int], most: int,
                      remat: str, attention: str, context: ContextSplit | None = None) -> list[dict[str, Any]]:
    """One setting's compiles, accumulation growing from the fewest split (jumping by the compiler's temporaries,
    ``next_split``) until the step fits, ``most`` micro-batches are passed, or it does not compile at all."""
    rows = []
    accum: int | None = splits[0]
    while accum is not None and accum <= most:
        report = check_fit(model_cfg, train_cfg, vocab_size, seq_len, slice_name, packed,
                           Setting(remat, attention, accum, context), verdicts)
        log.info("  %s", describe(report))
        rows.append(report)
        if report["fits"] or report.get("unsplittable") or "does not compile" in report.get("error", ""):
            break
        accum = next_split(splits, accum, report)
    return rows


def context_candidates(model_cfg: FamilyConfig, train_cfg: TrainConfig, seq_len: int,
                       devices: int) -> tuple[list[ContextSplit], str]:
    """The context splits worth compiling on a slice of ``devices``, fewest parts first (each part more is another
    exchange of keys and values per layer), with ring attention; or none and why.

    A split of N parts takes its chips from the data-parallel axes (data x fsdp x the configured context axis,
    per slice), from data first: fsdp stays the largest that divides both the chips left and the configured
    fsdp x context, so fsdp x context, which shards the parameters and optimizer state, is never less than it was
    (one fewer replica of the state, or more shards of it); tensor and the family's other axes are kept. Tried:
    the divisors N of those chips, larger than the configured context axis, where the sequence cuts into 2N
    load-balanced chunks (model/context.py) and the batch still splits over the data-parallel devices left."""
    from model.registry import family_of
    from model.sharding import mesh_shape

    if not getattr(type(model_cfg), "CONTEXT_PARALLEL", False):
        return [], f"the {model_cfg.family} family's decoder does not split a sequence (model/context.py)"
    mesh = train_cfg.mesh
    rules = family_of(model_cfg).mesh_rules(mesh.rules)
    try:
        shape = mesh_shape(mesh, devices, rules)
    except ConfigError as exc:
        return [], str(exc)
    configured = shape.get(CONTEXT_AXIS, 1)
    sequence_chips = shape["data"] // mesh.dcn_data * shape["fsdp"] * configured
    embed = (*rules.get("embed", []), *([] if CONTEXT_AXIS in rules.get("embed", []) else [CONTEXT_AXIS]))
    candidates = []
    for parts in range(configured + 1, sequence_chips + 1):
        if sequence_chips % parts or seq_len % (2 * parts):
            continue
        fsdp = math.gcd(shape["fsdp"] * configured, sequence_chips // parts)
        data = sequence_chips // parts // fsdp
        if train_cfg.batch_size % (data * mesh.dcn_data * fsdp) == 0:
            candidates.append(ContextSplit(parts, "ring", data, fsdp, embed))
    why = "" if candidates else (
        f"no context axis over its {sequence_chips} data-parallel chips cuts the sequence of {seq_len} into 2 x N "
        f"chunks and leaves data-parallel devices that split the batch of {train_cfg.batch_size}")
    return candidates, why


def search_context(model_cfg: FamilyConfig, train_cfg: TrainConfig, vocab_size: int, seq_len: int,
                   slice_name: str, packed: bool, verdicts: FitVerdicts | None, devices: int) -> list[dict[str, Any]]:
    """Where nothing fits with whole sequences per chip: split each over more chips (``context_candidates``).

    The compiles are bounded: the most memory-saving remat policy of ``train.fit_search_remat`` (full) and ring
    attention (a chip holds one share of keys and values, not the whole sequence's: it needs less HBM than
    all-gather at every split) with accumulation grown as for the other settings; when that does not fit, the next
    split tried is the one the compiler's temporaries ask for (activations shrink with the parts, ``next_split``).
    At the first split that fits, all-gather is compiled once more at the same accumulation (one gather per layer
    instead of N - 1 exchanges, when it fits) and the search stops: more parts only add exchanges."""
    candidates, why = context_candidates(model_cfg, train_cfg, seq_len, devices)
    if not candidates:
        log.info("  no context split tried on %s: %s", slice_name, why)
        return []
    log.info("  nothing fits %s with whole sequences per data-parallel device: trying context splits of %s",
             slice_name, ", ".join(str(c.parts) for c in candidates))
    remat = max(train_cfg.fit_search_remat, key=REMAT_ORDER.index)
    parts = [c.parts for c in candidates]
    rows: list[dict[str, Any]] = []
    split: ContextSplit | None = candidates[0]
    while split is not None:
        splits = accumulation_splits(train_cfg, split.data * train_cfg.mesh.dcn_data * split.fsdp)
        tried = grow_accumulation(model_cfg, train_cfg, vocab_size, seq_len, slice_name, packed, verdicts, splits,
                                  splits[-1], remat, model_cfg.attention, split)
        rows += tried
        last = tried[-1]
        if last["fits"]:
            report = check_fit(model_cfg, train_cfg, vocab_size, seq_len, slice_name, packed,
                               Setting(remat, model_cfg.attention, last["grad_accum_steps"],
                                       dataclasses.replace(split, attention="all_gather")), verdicts)
            log.info("  %s", describe(report))
            return [*rows, report]
        if "does not compile" in last.get("error", ""):
            return rows
        more = next_split(parts, split.parts, last)
        split = next((c for c in candidates if c.parts == more), None)
    return rows


def next_split(splits: list[int], accum: int, report: dict[str, Any]) -> int | None:
    """The next accumulation to try after ``report`` did not fit: activations scale with the micro-batch,
    so jump straight to the split whose temporaries would fit (from the compiler's figure), at least the next."""
    larger = [k for k in splits if k > accum]
    if not larger:
        return None
    temporaries = report.get("temp_gib")
    if temporaries is None:  # out of memory at compile time: the message names the temporaries
        found = re.search(r"temporaries \(([\d.]+)G\)", report.get("error", ""))
        temporaries = float(found.group(1)) if found else None
    room = report["capacity_gib"] - report.get("argument_gib", 0.0)
    if temporaries is None or room <= 0:
        return larger[0]
    wanted = accum * temporaries / room
    return next((k for k in larger if k >= wanted), larger[-1])


def best_setting(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fitting row with the sequence split over the fewest chips (context parallelism's exchanges per layer),
    then the fewest micro-batches (each one re-gathers the FSDP-sharded weights and shrinks the matmuls), then the
    least recompute, then the least HBM (between ring and all-gather at one split: ring)."""
    fitting = [r for r in rows if r["fits"]]
    return min(fitting, key=lambda r: (r.get("context_parts", 1), r["grad_accum_steps"],
                                       round(r["recompute_factor"], 3), r["needed_gib"]), default=None)


def setting_of(report: dict[str, Any]) -> Setting:
    """The setting a report was compiled with (its overrides reproduce it)."""
    context = report.get("context")
    return Setting(report["remat"], report["attention"], report["grad_accum_steps"],
                   ContextSplit(**{**context, "embed": tuple(context["embed"])}) if context else None)


SEARCH_COLUMNS = (("remat", "remat", "{}"), ("attention_kernel", "attention", "{}"), ("context_parts", "context", "{}"),
                  ("grad_accum_steps", "micro-batches", "{:d}"), ("micro_batch_per_device", "rows/device", "{:d}"),
                  ("needed_gib", "HBM GiB/chip", "{:.2f}"), ("model_flops_per_step", "model TFLOP/step", "tera"),
                  ("recompute_factor", "recompute", "{:.3f}x"), ("fits", "fits", "{}"))


def search_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the search, one row per compile."""
    lines = ["| " + " | ".join(title for _, title, _ in SEARCH_COLUMNS) + " | |",
             "|" + "---|" * (len(SEARCH_COLUMNS) + 1)]
    for row in rows:
        cells = []
        for key, _, fmt in SEARCH_COLUMNS:
            value = row.get(key)
            if value is None:
                cells.append("-")
            elif key == "context_parts":  # the chips a sequence is split over and how they attend
                cells.append(f"{value} {row['context_attention']}" if value > 1 else "-")
            elif fmt == "tera":
                cells.append(f"{value / 1e12:,.1f}")
            elif key == "fits" and not value:
                cells.append("no (" + ("OOM" if "RESOURCE_EXHAUSTED" in row.get("error", "RESOURCE_EXHAUSTED") else
                                        row.get("error", "")[:60]) + ")")
            else:
                cells.append(fmt.format(value))
        lines.append("| " + " | ".join(cells) + (" | **best** |" if row.get("best") else " | |"))
    return "\n".join(lines)


def vocab_and_seq_len(cfg: ExperimentConfig, run_folder: RunFolder) -> tuple[int, int]:
    """From the tokenizer and shards manifests when they exist, else from the config (a fit check may
    come before any data is prepared)."""
    tokenizer = TOKENIZER.read_manifest_if_present(run_folder.tokenizer)
    shards = SHARDS.read_manifest_if_present(run_folder.shards)
    if tokenizer is None or shards is None:
        return cfg.tokenizer.vocab_size, cfg.model.max_seq_len
    return int(tokenizer["vocab_size"]), int(shards["seq_len"])


def fit_model(cfg: ExperimentConfig, run_folder: RunFolder) -> tuple[Any, int, int]:
    """``(model section, vocab_size, seq_len)`` to compile: ``train.fit_model``'s Hugging Face shape (its
    own vocabulary, model.max_seq_len), else the experiment's model with its tokenizer and shards."""
    if cfg.train.fit_model:
        _, model_cfg, vocab = hf_model_shape(cfg.train.fit_model, "train.fit_model", cfg.model)
        return model_cfg, vocab, model_cfg.max_seq_len
    vocab, seq_len = vocab_and_seq_len(cfg, run_folder)
    return cfg.model, vocab, seq_len


def fit_verdicts(cfg: ExperimentConfig, run_folder: RunFolder) -> FitVerdicts | None:
    """Where the compiler's answers are kept (``train.compilation_cache``): ``tpu_fit/`` in the compilation cache
    JAX was given, else in the run's ``xla_cache/`` (recipe 04's). JAX's own cache is turned off for this
    process: it would store each topology's executable, which it cannot read back without a TPU."""
    import jax

    folder = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_enable_compilation_cache", False)
    if not cfg.train.compilation_cache:
        return None
    if not folder or "://" in folder:  # JAX's cache may be a bucket (gs://...): the answers stay with the run
        folder = run_folder.root / "xla_cache"
    return FitVerdicts(location(folder) / "tpu_fit")


def fit_check(cfg: ExperimentConfig, run_folder: RunFolder, wandb_run: Any) -> list[dict[str, Any]]:
    """Recipe 04b: check (or, with ``train.fit_search``, search) every slice in ``train.fit_topologies``.

    Writes ``reports/fit_check.json``: one report per slice, the configured setting's or the search's
    best (the planner prices that setting). A search also writes ``reports/fit_search.json`` and
    ``.md`` (every compile) and prints the overrides of the best setting. A slice whose devices the mesh does
    not divide, or the batch does not split over, is reported as such and the next one checked. DoesNotFit
    names the slices where nothing fits or the step cannot split.
    """
    # every name before the first compile: a slice that cannot split the step is reported and the others checked
    check_topology_names(cfg, run_folder)
    require_libtpu()
    verdicts = fit_verdicts(cfg, run_folder)
    model_cfg, vocab, seq_len = fit_model(cfg, run_folder)
    packed = cfg.shards.packing == "document"
    reports, searched = [], {}
    for slice_name in cfg.train.fit_topologies:
        log.info("compiling the train step for %s (vocab %d, seq_len %d, batch %d)", slice_name, vocab, seq_len,
                 cfg.train.batch_size)
        if cfg.train.fit_search:
            rows = search_fit(model_cfg, cfg.train, vocab, seq_len, slice_name, packed, verdicts)
            searched[slice_name] = rows
            best = best_setting(rows)
            report = best if best is not None else min(rows, key=lambda r: r.get("needed_gib", float("inf")))
            log.info("%s search:\n%s", slice_name, search_table(rows))
            if best is not None:
                overrides = " ".join(setting_of(best).overrides())
                log.info("best setting on %s: %s", slice_name, overrides)
                report = {**report, "overrides": overrides}
        else:
            report = check_fit(model_cfg, cfg.train, vocab, seq_len, slice_name, packed, verdicts=verdicts)
        log.info("%s", describe(report))
        reports.append(report)
        if wandb_run is not None:
            wandb_run.summary.update({f"fit/{slice_name}/{k}": v for k, v in report.items()
                                      if isinstance(v, (int, float, bool, str)) and k != "error"})
    reports_dir = run_folder.reports
    if searched:
        atomic_write_json(reports_dir / "fit_search.json", searched)
        atomic_write_text(reports_dir / "fit_search.md", "\n\n".join(
            f"## {name}\n\nvocabulary {vocab}, sequence {seq_len}, batch {cfg.train.batch_size}; best = fewest "
            f"micro-batches, then least recompute, then least HBM\n\n{search_table(rows)}\n"
            for name, rows in searched.items()))
    atomic_write_json(reports_dir / FIT_CHECK.output, reports)
    failed = [r for r in reports if not r["fits"]]
    if failed:
        raise DoesNotFit("; ".join(describe(r) for r in failed) +
                         ". Use more chips, a larger train.mesh.fsdp, model.remat, train.grad_accum_steps, or "
                         "train.fit_search=true to try them")
    return reports
