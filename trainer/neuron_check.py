"""Will this config's train step run under jax-neuronx on AWS Trainium? Answered on a CPU, before renting one.

AWS's JAX path for Trainium (``jax-neuronx`` with the ``libneuronxla`` PJRT plugin, beta) comes from AWS's
own pip index and needs a Neuron device, so this check is static: it traces the exact train step the
config would run (trainer/step.py ``TrainProgram``: model family, scanned layers, remat, chunked loss,
NaN policy, quantization, accumulation, a frozen body) from abstract inputs, under the Neuron path's
settings, and walks the resulting jaxpr, every sub-jaxpr included, for the constructs AWS documents as
unsupported (``KNOWN_ISSUES_URL``):

- ``jax.lax.cond`` (and ``lax.switch``): the ``cond`` primitive;
- a ``jax.lax.while_loop`` whose trip count is not static (``static_trip_count`` says which are);
  a ``fori_loop`` with Python-int bounds is a ``scan``, which is fine;
- host callbacks: ``jax.debug.print`` / ``callback`` / ``breakpoint`` / ``inspect_array_sharding``,
  ``io_callback``, ``pure_callback``, an unfunctionalized ``checkify.check``;
- the Threefry PRNG ("not completely supported, use rbg"): any ``random_*`` primitive on a Threefry key,
  or the ``threefry2x32`` primitive itself;
- FP8 dtypes other than e4m3 and e5m2 (``NEURON_FP8``), and ``jax.lax.reduce_precision``, which JAX's remat
  itself puts on every value a policy saves (``remat_partial_eval``, against XLA's excess precision): a step
  under ``model.remat`` save_dots or offload has one per saved projection, full and none have none.

The Neuron path's settings: ``jax_default_prng_impl=rbg`` (AWS's advice; rbg still hashes with Threefry to
split and fold in keys, which is the configuration AWS recommends, so only Threefry *keys* are reported)
and ``model.attention=dot_product`` (XLA's attention: the splash and cuDNN kernels do not exist there; what
``auto`` picks on the ``neuron`` platform anyway).

Each finding names the source line that made it (the innermost frame of this repository in the
equation's traceback, jax's own frames stripped). The FLOPs reported are the family's hand count
(``model.family.ModelFamily.train_costs``), not XLA's: its cost analysis counts a scanned layer once.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
from jax.extend import core as jcore
from jax.extend import source_info_util
from jax.sharding import AbstractMesh, AxisType

from experiment.config import to_dict
from experiment.errors import RecipeError
from experiment.files import atomic_write_json
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.model import FamilyConfig
from experiment.sections.train import MeshConfig, TrainConfig
from experiment.stages import NEURON_CHECK
from model.sharding import family_axes
from trainer.fit_check import setting_costs, vocab_and_seq_len
from trainer.step import TrainProgram

log = logging.getLogger("trainer.neuron_check")

KNOWN_ISSUES_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/jax/setup/jax-neuronx-known-issues.html"
NEURON_PLATFORM = "neuron"
NEURON_PRNG = "rbg"
NEURON_ATTENTION = "dot_product"
CLEAN = "no construct jax-neuronx documents as unsupported"
# AWS: "Neuron only supports float8_e4m3 and float8_e5m2 for FP8 dtypes". JAX has two dtypes for E4M3:
# float8_e4m3fn, the OCP/NVIDIA E4M3 (finite, no infinities) that PyTorch, Transformer Engine and Qwix call
# E4M3, and float8_e4m3, the IEEE-754-style variant whose name the sentence spells. The sentence names a
# format, not a JAX spelling, so both are taken as the e4m3 it allows (train.quantization=fp8 uses
# float8_e4m3fn); the fnuz, b11 and e3m4 / e8m0 variants are reported.
NEURON_FP8 = frozenset({"float8_e4m3fn", "float8_e4m3", "float8_e5m2"})
HOST_CALLBACKS = {
    "debug_callback": "host callback (jax.debug.callback / breakpoint)",
    "debug_print": "host callback (jax.debug.print)",
    "inspect_sharding": "host callback (jax.debug.inspect_array_sharding)",
    "io_callback": "host callback (io_callback)",
    "pure_callback": "host callback (pure_callback)",
    "check": "host callback (checkify.check, not functionalized)",
}
THREEFRY_TAG = "fry"  # a Threefry key's dtype prints as key<fry>
COMPARISONS = {"lt", "le", "gt", "ge", "ne"}
REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    location: str  # file:line of the source line that made the construct ("unknown" without a traceback)
    construct: str  # what AWS documents as unsupported, in a few words

    def __str__(self) -> str:
        return f"{self.location}: {self.construct}"


# -- walking the jaxpr --


def sub_jaxprs(params: dict[str, Any]) -> Iterator[jcore.Jaxpr]:
    """Every jaxpr an equation's parameters hold: scan/while/cond bodies, pjit, remat, custom_vjp/jvp, shard_map."""
    stack = list(params.values())
    while stack:
        value = stack.pop()
        if isinstance(value, jcore.ClosedJaxpr):
            yield value.jaxpr
        elif isinstance(value, jcore.Jaxpr):
            yield value
        elif isinstance(value, (tuple, list)):
            stack.extend(value)


def walk(jaxpr: jcore.Jaxpr, callers: tuple[jcore.JaxprEqn, ...] = ()
         ) -> Iterator[tuple[jcore.JaxprEqn, jcore.Jaxpr, tuple[jcore.JaxprEqn, ...]]]:
    """(equation, the jaxpr it is in, the equations holding that jaxpr, outermost first) for every equation,
    each sub-jaxpr once per equation that holds it (a scanned body once, as it is compiled once)."""
    for eqn in jaxpr.eqns:
        yield eqn, jaxpr, callers
        for sub in sub_jaxprs(eqn.params):
            yield from walk(sub, (*callers, eqn))


def count_equations(jaxpr: jcore.Jaxpr) -> tuple[int, dict[str, int]]:
    """Equations in ``jaxpr`` and its sub-jaxprs, and how many of each primitive (most first)."""
    counts = collections.Counter(eqn.primitive.name for eqn, _, _ in walk(jaxpr))
    return sum(counts.values()), dict(counts.most_common())


def source_line(eqn: jcore.JaxprEqn, callers: tuple[jcore.JaxprEqn, ...] = ()) -> str:
    """file:line of the code that made ``eqn``: the innermost frame in this repository of its traceback, a
    library frame below it appended (``via``). An equation whose traceback has no frame of ours (inside a
    library's or jax's own jitted function, e.g. ``jax.random.normal``'s: jax traces those apart) takes the
    line of the innermost equation holding it that has one. A custom VJP's backward rule is named at the
    call of the custom_vjp function: jax gives transposed equations the source line of what they transpose."""
    frames = user_frames(eqn)
    ours = next((f for f in frames if _in_repo(f[0])), None)
    library = frames[0] if frames and frames[0] is not ours else None
    if ours is None:
        holder = next((line for caller in reversed(callers) if (line := _repo_line(caller)) is not None), None)
        if holder is None:
            return _frame_text(library) if library is not None else "unknown"
        return holder if library is None else f"{holder} (via {_frame_text(library)})"
    return _frame_text(ours) if library is None else f"{_frame_text(ours)} (via {_frame_text(library)})"


FRAME = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::\d+)? \(.*\)$")  # jax's "file:line[:column] (function)"
MAX_FRAMES = 200


def user_frames(eqn: jcore.JaxprEqn) -> list[tuple[str, int]]:
    """(file, line) of the frames of ``eqn``'s traceback outside jax and the standard library, innermost
    first (read from jax's public ``summarize``, which lists them outermost first)."""
    text = source_info_util.summarize(eqn.source_info, num_frames=MAX_FRAMES)
    found = (FRAME.match(line) for line in reversed(text.splitlines()))
    return [(m["file"], int(m["line"])) for m in found if m is not None]


def _repo_line(eqn: jcore.JaxprEqn) -> str | None:
    frame = next((f for f in user_frames(eqn) if _in_repo(f[0])), None)
    return None if frame is None else _frame_text(frame)


def _in_repo(file_name: str) -> bool:
    path = Path(file_name)
    return path.is_relative_to(REPO) and "site-packages" not in path.parts


def _frame_text(frame: tuple[str, int]) -> str:
    path = Path(frame[0])
    if path.is_relative_to(REPO):
        shown = str(path.relative_to(REPO))
    elif "site-packages" in path.parts:  # a library: from its package folder on
        shown = str(Path(*path.parts[path.parts.index("site-packages") + 1:]))
    else:
        shown = str(path)
    return f"{shown}:{frame[1]}"


def _dtype_name(aval: Any) -> str:
    dtype = getattr(aval, "dtype", None)
    return "" if dtype is None else str(dtype)


def _threefry_key(var: Any) -> bool:
    return _dtype_name(getattr(var, "aval", None)) == f"key<{THREEFRY_TAG}>"


def constructs(eqn: jcore.JaxprEqn, enclosing: jcore.Jaxpr) -> list[str]:
    """What in ``eqn`` jax-neuronx documents as unsupported (empty: nothing)."""
    name = eqn.primitive.name
    found = []
    if name == "cond":
        found.append("jax.lax.cond / switch (cond primitive)")
    elif name == "while" and not static_trip_count(eqn, enclosing):
        found.append("jax.lax.while_loop with a dynamic trip count (while primitive)")
    elif name in HOST_CALLBACKS:
        found.append(HOST_CALLBACKS[name])
    elif name == "reduce_precision":  # also what jax.checkpoint puts on each value a remat policy saves
        found.append("jax.lax.reduce_precision (JAX's remat adds one to each value model.remat=save_dots or "
                     "offload keeps; model.remat=full or none adds none)")
    if name == "threefry2x32" or (name.startswith("random_") and any(
            _threefry_key(v) for v in (*eqn.invars, *eqn.outvars))):
        found.append("Threefry PRNG (use jax_default_prng_impl=rbg)")
    fp8 = sorted({d for v in eqn.outvars if (d := _dtype_name(v.aval)).startswith("float8_") and d not in NEURON_FP8})
    found += [f"FP8 dtype {d} (only e4m3 and e5m2 are supported)" for d in fp8]
    return found


def find_unsupported(closed: jcore.ClosedJaxpr) -> list[Finding]:
    """The constructs of ``closed`` (and its sub-jaxprs) that jax-neuronx documents as unsupported, one per
    construct and source line, sorted by location."""
    findings = {Finding(source_line(eqn, callers), what) for eqn, enclosing, callers in walk(closed.jaxpr)
                for what in constructs(eqn, enclosing)}
    inputs = sorted({d for v in closed.jaxpr.invars if (d := _dtype_name(v.aval)).startswith("float8_")
                     and d not in NEURON_FP8})
    findings |= {Finding("the step's inputs", f"FP8 dtype {d} (only e4m3 and e5m2 are supported)") for d in inputs}
    return sorted(findings)


# -- a while loop with a static trip count --


def static_trip_count(eqn: jcore.JaxprEqn, enclosing: jcore.Jaxpr) -> bool:
    """Whether a ``while`` equation runs a number of times known when it is traced.

    Recognised: a counter in the loop's carry that starts from a constant, that the body steps by a
    nonzero constant, and that the condition compares (<, <=, >, >=, !=) with a constant, a constant of
    the loop, or another carry element that starts from a constant and that the body passes through
    unchanged (what ``fori_loop`` with traced bounds builds). "Constant": a literal, a closed-over concrete
    value, or a conversion of one. Anything else (a condition on the data, a bound computed at run time)
    is dynamic: Neuron compiles only the static kind.
    """
    cond, body = eqn.params["cond_jaxpr"], eqn.params["body_jaxpr"]
    n_cond, n_body = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    outer = known_values(enclosing)
    inits = [_value_of(v, outer) for v in eqn.invars[n_cond + n_body:]]
    cond_known = known_values(cond.jaxpr, cond.consts)
    for var, outer_var in zip(cond.jaxpr.invars[:n_cond], eqn.invars[:n_cond], strict=True):
        value = _value_of(outer_var, outer)
        if value is not None:
            cond_known[var] = value
    carry_index = {var: i for i, var in enumerate(cond.jaxpr.invars[n_cond:])}
    compare = _defining(cond.jaxpr, cond.jaxpr.outvars[0])
    if compare is None or compare.primitive.name not in COMPARISONS:
        return False
    body_inputs = body.jaxpr.invars[n_body:]
    body_known = known_values(body.jaxpr, body.consts)

    def carry(operand: Any) -> int | None:  # a Literal is no carry element (and is not hashable)
        return carry_index.get(operand) if isinstance(operand, jcore.Var) else None

    def counter(operand: Any) -> bool:
        k = carry(operand)
        if k is None or inits[k] is None:
            return False
        step = _defining(body.jaxpr, body.jaxpr.outvars[k])
        if step is None or step.primitive.name not in ("add", "sub"):
            return False
        a, b = step.invars
        by = (_value_of(b, body_known) if a is body_inputs[k] else
              _value_of(a, body_known) if b is body_inputs[k] and step.primitive.name == "add" else None)
        return by is not None and by != 0

    def bound(operand: Any) -> bool:
        if _value_of(operand, cond_known) is not None:
            return True
        k = carry(operand)
        return k is not None and inits[k] is not None and body.jaxpr.outvars[k] is body_inputs[k]

    a, b = compare.invars
    return (counter(a) and bound(b)) or (counter(b) and bound(a))


def known_values(jaxpr: jcore.Jaxpr, consts: Any = ()) -> dict[Any, Any]:
    """The variables of ``jaxpr`` whose values are known at trace time: its concrete closed-over constants
    and conversions (``convert_element_type``, ``copy``) of known values."""
    known: dict[Any, Any] = {}
    for var, value in zip(jaxpr.constvars, consts, strict=False):
        with contextlib.suppress(TypeError, jax.errors.ConcretizationTypeError):
            known[var] = _scalar(value)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("convert_element_type", "copy") and len(eqn.invars) == 1:
            value = _value_of(eqn.invars[0], known)
            if value is not None:
                known[eqn.outvars[0]] = value
    return {var: value for var, value in known.items() if value is not None}


def _scalar(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _value_of(atom: Any, known: dict[Any, Any]) -> float | None:
    if isinstance(atom, jcore.Literal):
        return _scalar(atom.val)
    return known.get(atom)


def _defining(jaxpr: jcore.Jaxpr, var: Any) -> jcore.JaxprEqn | None:
    return next((eqn for eqn in jaxpr.eqns if any(out is var for out in eqn.outvars)), None)


# -- the train step under the Neuron path's settings --


@contextlib.contextmanager
def neuron_settings(prng_impl: str = NEURON_PRNG) -> Iterator[None]:
    """The process settings the Neuron path runs under while a step is built, traced and run: the rbg PRNG
    (``prng_impl``: another, to trace the default path for comparison). Scoped, so that a check in a process
    that also trains (the tests) leaves its PRNG as it was; a training run on Trainium sets it for the whole
    process instead (``JAX_DEFAULT_PRNG_IMPL=rbg``, docs/launch.md)."""
    with jax.default_prng_impl(prng_impl):
        yield


def neuron_model_config(model_cfg: FamilyConfig) -> FamilyConfig:
    """The model section as the Neuron path runs it: XLA's attention."""
    return dataclasses.replace(model_cfg, attention=NEURON_ATTENTION)


def neuron_mesh(mesh_cfg: MeshConfig) -> AbstractMesh:
    """The config's mesh as an ``AbstractMesh`` on a ``neuron`` abstract device.

    Why abstract: the step is traced, never compiled or run here, so no devices are needed, and a mesh of
    the config's own axis sizes keeps its checks honest (every sharded dimension divides its mesh axes, the
    micro-batch splits over the data-parallel devices) where a one-device mesh would pass anything. The
    jaxpr's constructs do not depend on the sizes. ``data: -1`` (all devices left over) counts as 1: the
    Trainium device count is the launch's, not the config's. The abstract device's platform is what
    platform-dependent choices read (``model.sharding.compiled_platform``: the scan's unroll, ``auto``).
    """
    data = (mesh_cfg.data if mesh_cfg.data > 0 else 1) * mesh_cfg.dcn_data
    device = jax.sharding.AbstractDevice(device_kind="Trainium", num_cores=None, platform=NEURON_PLATFORM)
    extra = family_axes(mesh_cfg)  # a family's own axes (expert), in model.sharding.mesh_shape's order
    names = ("data", "fsdp", *extra, "tensor")
    return AbstractMesh((data, mesh_cfg.fsdp, *extra.values(), mesh_cfg.tensor), names,
                        axis_types=(AxisType.Auto,) * len(names), abstract_device=device)


def trace_neuron_step(model_cfg: FamilyConfig, train_cfg: TrainConfig, vocab_size: int, seq_len: int,
                      packed: bool = False, prng_impl: str = NEURON_PRNG) -> jcore.ClosedJaxpr:
    """The jaxpr of the train step ``TrainProgram`` builds for these sections, as the Neuron path runs it;
    nothing is materialised (abstract state and batch)."""
    with neuron_settings(prng_impl):
        program = TrainProgram(neuron_model_config(model_cfg), train_cfg, vocab_size, neuron_mesh(train_cfg.mesh),
                               seed=0)
        batch = program.abstract_batch(train_cfg.batch_size, seq_len, packed)
        return jax.make_jaxpr(program.train_step)(program.abstract_state, batch)


class UnsupportedOnNeuron(RecipeError):
    """The train step uses a construct jax-neuronx documents as unsupported."""


def check_step(model_cfg: FamilyConfig, train_cfg: TrainConfig, vocab_size: int, seq_len: int,
               packed: bool = False) -> dict[str, Any]:
    """Trace the step for the Neuron path and report: findings, equations, hand-counted FLOPs, trace time."""
    started = time.perf_counter()
    closed = trace_neuron_step(model_cfg, train_cfg, vocab_size, seq_len, packed)
    traced_s = time.perf_counter() - started
    findings = find_unsupported(closed)
    op_count, primitives = count_equations(closed.jaxpr)
    mesh = neuron_mesh(train_cfg.mesh)
    costs = setting_costs(neuron_model_config(model_cfg), train_cfg, vocab_size, seq_len, NEURON_PLATFORM)
    return {"findings": [dataclasses.asdict(f) for f in findings], "finding_lines": [str(f) for f in findings],
            "op_count": op_count, "primitives": primitives, "trace_s": round(traced_s, 3),
            "family": model_cfg.family, "vocab_size": vocab_size, "seq_len": seq_len,
            "batch_size": train_cfg.batch_size, "packed": packed, "mesh": dict(mesh.shape),
            "settings": {"jax_default_prng_impl": NEURON_PRNG, "attention": NEURON_ATTENTION,
                         "configured_attention": model_cfg.attention,
                         "scan_layers": model_cfg.scan_layers,
                         "remat": model_cfg.remat, "loss_chunk_len": train_cfg.loss_chunk_len,
                         "nan_policy": train_cfg.nan_policy, "quantization": train_cfg.quantization,
                         "grad_accum_steps": train_cfg.grad_accum_steps, "trainable": train_cfg.trainable,
                         "embeddings_only_steps": train_cfg.embeddings_only_steps,
                         "compute_dtype": train_cfg.compute_dtype},
            "flops_source": "hand count (model.family.ModelFamily.train_costs); XLA's cost analysis counts a scanned "
                            "layer once",
            **{k: costs[k] for k in ("model_flops_per_step", "hardware_flops_per_step", "recompute_factor")},
            "known_issues": KNOWN_ISSUES_URL,
            "notes": ["float8_e4m3fn (train.quantization=fp8) is counted as the e4m3 AWS names; float8_e4m3 too"]}


def describe(name: str, report: dict[str, Any]) -> str:
    mesh = " x ".join(f"{axis} {size}" for axis, size in report["mesh"].items())
    return (f"{name}: train step traced for Trainium ({NEURON_PRNG} PRNG, XLA attention; mesh {mesh}) in "
            f"{report['trace_s']:.1f} s: {report['op_count']:,} equations, "
            f"{flops_text(report['model_flops_per_step'])} per step by hand count "
            f"({flops_text(report['hardware_flops_per_step'])} with recompute)")


def flops_text(flops: float) -> str:
    """``1,448.9 TFLOP``, or GFLOP below a teraflop (the demo's step)."""
    return f"{flops / 1e12:,.1f} TFLOP" if flops >= 1e12 else f"{flops / 1e9:,.1f} GFLOP"


def neuron_check(cfg: ExperimentConfig, run_folder: RunFolder, wandb_run: Any) -> dict[str, Any]:
    """Recipe 04c: trace the run's train step for jax-neuronx and list what AWS documents as unsupported.

    Writes ``reports/neuron_check.json`` (atomically: findings, equations, FLOPs, the settings traced and the
    config's model and train sections), prints the findings or ``CLEAN`` as the last lines of stdout, and
    raises ``UnsupportedOnNeuron`` (one line) when something is found.
    """
    vocab, seq_len = vocab_and_seq_len(cfg, run_folder)
    packed = cfg.shards.packing == "document"
    log.info("tracing the train step for jax-neuronx (vocab %d, seq_len %d, batch %d)", vocab, seq_len,
             cfg.train.batch_size)
    recorded = to_dict(cfg)  # credentials as the ${VAR} they were read from, as in config.resolved.yaml
    report = {"experiment": cfg.experiment.name, **check_step(cfg.model, cfg.train, vocab, seq_len, packed),
              "config": {"model": recorded["model"], "train": recorded["train"]}}
    log.info("%s", describe(cfg.experiment.name, report))
    atomic_write_json(run_folder.reports / NEURON_CHECK.output, report)
    if wandb_run is not None:
        wandb_run.summary.update({"neuron/op_count": report["op_count"], "neuron/findings": len(report["findings"]),
                                  "neuron/model_flops_per_step": report["model_flops_per_step"]})
    lines = report["finding_lines"]
    print("\n".join(lines) if lines else CLEAN, flush=True)
    if lines:
        raise UnsupportedOnNeuron(f"the train step uses {len(lines)} construct(s) jax-neuronx documents as "
                                  f"unsupported ({KNOWN_ISSUES_URL}): " + "; ".join(lines))
    return report
