"""Will this config fit in a TPU slice's HBM? Answered on a CPU, before paying for the slice.

libtpu (the optional ``tpu`` extra) can compile for a TPU topology it does not have. We build the
real train step (same model, mesh rules, optimizer, batch) for the named topology, compile it
ahead of time from abstract inputs, and read the compiler's per-device memory analysis: the
arguments (parameters, optimizer state, batch), outputs, and temporaries (activations). A config
that cannot fit fails to compile within seconds with ``RESOURCE_EXHAUSTED ... HbmOom``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Any

from experiment.errors import ConfigError, RecipeError
from experiment.files import atomic_write_json
from experiment.runfolder import RunFolder

log = logging.getLogger("trainer.fit_check")
GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str  # libtpu's topology name, e.g. "v5e:4x4"
    chip_config: str  # "default", or "megacore" for v4/v5p (two cores act as one device)
    usable_hbm_gib: float  # what the compiler lets a program use per device


# Cloud TPU slice names (chips for v5e/v6e, TensorCores for v5p) -> topology
_V5E, _V6E, _V5P = 15.75, 31.24, 95.73  # usable HBM per chip as reported by libtpu here (STACK_NOTES)
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


def topology_devices(slice_name: str, num_slices: int = 1) -> list[Any]:
    if slice_name not in TOPOLOGIES:
        raise ConfigError(f"config key 'train.fit_topologies': unknown TPU slice '{slice_name}' "
                          f"(known: {', '.join(TOPOLOGIES)})")
    require_libtpu()
    from jax.experimental import topologies

    topo = TOPOLOGIES[slice_name]
    desc = topologies.get_topology_desc(platform="tpu", topology_name=topo.name, chip_config_name=topo.chip_config,
                                        chips_per_host_bounds=(2, 2, 1), num_slices=num_slices)
    return list(desc.devices)


def check_fit(model_cfg: Any, train_cfg: Any, vocab_size: int, seq_len: int, slice_name: str,
              packed: bool = False) -> dict[str, Any]:
    """Compile the train step for ``slice_name`` and report per-device memory; never raises on OOM."""
    from model.presets import resolve
    from model.sharding import build_mesh
    from trainer.step import build_program

    devices = topology_devices(slice_name, train_cfg.mesh.dcn_data)
    mesh = build_mesh(train_cfg.mesh, devices)
    model_cfg = resolve(model_cfg)
    capacity = TOPOLOGIES[slice_name].usable_hbm_gib
    report: dict[str, Any] = {"slice": slice_name, "topology": TOPOLOGIES[slice_name].name, "devices": len(devices),
                              "mesh": dict(mesh.shape), "capacity_gib": capacity}
    started = time.perf_counter()
    program = build_program(model_cfg, train_cfg, vocab_size, mesh, seed=0)
    lowered = program.lower_step(program.abstract_batch(train_cfg.batch_size, seq_len, packed))
    try:
        compiled = lowered.compile()
    except Exception as exc:  # the compiler reports OOM as a generic XlaRuntimeError
        text = str(exc)
        if "RESOURCE_EXHAUSTED" not in text and "HbmOom" not in text:
            raise
        report.update(fits=False, compile_s=time.perf_counter() - started,
                      error=next((line for line in text.splitlines() if "RESOURCE_EXHAUSTED" in line), text[:300]))
        return report
    memory = compiled.memory_analysis()
    parts = {name: int(getattr(memory, f"{name}_size_in_bytes", 0)) for name in
             ("argument", "output", "alias", "temp", "generated_code")}
    needed = parts["argument"] + parts["output"] - parts["alias"] + parts["temp"] + parts["generated_code"]
    report.update(fits=needed <= capacity * GIB, needed_gib=needed / GIB,
                  **{f"{k}_gib": v / GIB for k, v in parts.items()}, compile_s=time.perf_counter() - started)
    return report


def describe(report: dict[str, Any]) -> str:
    head = f"{report['slice']} ({report['topology']}, {report['devices']} devices, mesh {report['mesh']})"
    if "needed_gib" in report:
        verdict = "fits" if report["fits"] else "DOES NOT FIT"
        return (f"{head}: {verdict}, {report['needed_gib']:.2f} GiB of {report['capacity_gib']:.2f} GiB per device "
                f"(arguments {report['argument_gib']:.2f}, temporaries {report['temp_gib']:.2f}); "
                f"compiled in {report['compile_s']:.0f} s")
    return f"{head}: DOES NOT FIT ({report['error']})"


def vocab_and_seq_len(cfg: Any, run_folder: RunFolder) -> tuple[int, int]:
    """From the tokenizer and shards manifests when they exist, else from the config (a fit check may
    come before any data is prepared)."""
    from experiment.manifest import manifest_path

    vocab, seq_len = cfg.tokenizer.vocab_size, cfg.shards.seq_len
    with_manifests = manifest_path(run_folder.tokenizer).is_file() and manifest_path(run_folder.shards).is_file()
    if with_manifests:
        import json

        vocab = json.loads(manifest_path(run_folder.tokenizer).read_text(encoding="utf-8"))["vocab_size"]
        seq_len = json.loads(manifest_path(run_folder.shards).read_text(encoding="utf-8"))["seq_len"]
    return int(vocab), int(seq_len)


def fit_check(cfg: Any, run_folder: RunFolder, wandb_run: Any) -> list[dict[str, Any]]:
    """Recipe 04b: check every slice in ``train.fit_topologies``; DoesNotFit names the ones that fail."""
    require_libtpu()
    vocab, seq_len = vocab_and_seq_len(cfg, run_folder)
    reports = []
    for slice_name in cfg.train.fit_topologies:
        log.info("compiling the train step for %s (vocab %d, seq_len %d, batch %d)", slice_name, vocab, seq_len,
                 cfg.train.batch_size)
        report = check_fit(cfg.model, cfg.train, vocab, seq_len, slice_name, cfg.shards.packing == "document")
        log.info("%s", describe(report))
        reports.append(report)
        if wandb_run is not None:
            wandb_run.summary.update({f"fit/{slice_name}/{k}": v for k, v in report.items()
                                      if isinstance(v, (int, float, bool))})
    atomic_write_json(Path(run_folder.reports) / "fit_check.json", reports)
    failed = [r for r in reports if not r["fits"]]
    if failed:
        raise DoesNotFit("; ".join(describe(r) for r in failed) +
                         ". Use more chips, a larger train.mesh.fsdp, model.remat, or a smaller train.batch_size")
    return reports
