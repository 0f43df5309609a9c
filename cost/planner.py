"""Recipe 07: how long and how many rubles would this run take on each accelerator option?

For a model (a preset, a published reference shape such as ``llama3.1-8b``, or the experiment's
own model section), a token budget and a list of accelerator / slice / pricing options:

    train FLOPs per token  = the model family's hand count (Llama: model/llama/flops.py, 3x forward)
    tokens/s per chip      = MFU x peak bf16 FLOP/s / FLOPs per token
    hours                  = tokens / (tokens/s per chip x chips) / 3600
    rubles                 = hours x chips x USD per chip-hour x USD->RUB

MFU per option comes from the option (``cost.plan_options[i].mfu``), else from a measured run of
ours on the same accelerator (the ledger), else from the nearest anchor in size (``cost/anchors.csv``:
published runs and our own H200 bench) on hardware of the same vendor and within
``cost.plan_anchor_size_ratio`` of the planned model's parameters (off with
``cost.plan_mfu_from_anchors: false``), else ``cost.plan_mfu``; the row names its source. MFU is per
device: a chip that shows two JAX devices (TPU7x) has half its peak on each.

Each option is planned with its own setting (``model.remat`` and micro-batches): recipe 04b's choice
from ``reports/fit_check.json`` for a slice it checked; else, on TPUs, the config's (what 04b checks);
else (GPUs, Trainium) the least-recompute setting whose memory estimate fits the device
(``cost/memory.py``): an 80-141 GB GPU that holds the step without remat is not charged for it.
The setting makes the hardware do ``recompute`` x the model FLOPs (the family's ``train_costs``).
An anchor's MFU (or ``cost.plan_mfu``) is taken as the hardware FLOPs utilisation its own setting reached
and held fixed, so a setting that recomputes more runs at a proportionally lower MFU: "fits with full
remat" costs what it costs. Each plan also prices where the run's data lives (``cost/storage.py``):
the token data and the checkpoints held over the option's hours, at the GB-month price of the storage
class ``cost.storage`` names (``auto``: the run_root's bucket, or for a local run_root the option's own
cloud's), a column of its own beside the compute rubles (``plan_storage``). Every plan also re-derives the
published anchors in ``cost/anchors.csv`` (MaxText's Llama-3.1-8B and -70B on v6e) from the same arithmetic,
so a drift in the FLOP count shows up next to the numbers it would distort.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cost.catalog import Catalog, CatalogError, UnpricedError
from cost.hf_shapes import hf_model_shape, is_hf_spec
from cost.ledger_format import LEDGER_FILE
from cost.ledger_pricing import summarize_ledger
from cost.memory import STATE_BYTES_PER_PARAM, MemoryEstimate, cheapest_fitting, step_bytes
from cost.rates import UsdRubRate, resolve_usd_rub
from cost.report import SIG, Column, log_to_wandb, save_figure, significant, write_table
from cost.storage import GIB, HOURS_PER_MONTH, resolve_storage
from cost.target import Target, TargetCrossing, cost_to_target, eval_points, read_train_log, target_of
from experiment import appendlog
from experiment.batch_split import BatchSplit
from experiment.config import load_config
from experiment.errors import ConfigError, DataError
from experiment.jsontext import parse_json
from experiment.presets import preset_model_config
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.cost import PlanOption
from experiment.sections.model import FamilyConfig, family_presets, model_section_class
from experiment.sections.train import TrainConfig
from experiment.stages import FIT_CHECK, SHARDS, TOKENIZER
from experiment.storage import location
from model.family import params_label
from model.registry import family_of
from model.sharding import family_axes

log = logging.getLogger("cost.planner")

ANCHORS = Path(__file__).with_name("anchors.csv")

COLUMNS = (
    Column("accelerator", "accelerator"),
    Column("cloud", "cloud"),
    Column("pricing", "pricing"),
    Column("chips", "chips", "{:d}"),
    Column("devices", "devices", "{:d}", terminal=False),
    Column("chip_hour_price", "chip-hour price"),
    Column("usd_per_chip_hour", "USD/chip-h", "{:.3f}"),
    Column("price_kind", "price from"),
    Column("other_clouds", "other clouds", terminal=False),
    Column("peak_tflops", "peak TFLOP/s", "{:,.0f}", terminal=False),
    Column("remat", "remat"),
    Column("grad_accum_steps", "micro-batches", "{:d}"),
    Column("setting_from", "setting from", terminal=False),
    Column("recompute", "recompute", "{:.2f}x"),
    Column("mfu", "MFU", "{:.1%}"),
    Column("hfu", "HFU", "{:.1%}", terminal=False),
    Column("mfu_source", "MFU from"),
    Column("tokens_per_s_per_chip", "tokens/s/chip", "{:,.0f}"),
    Column("hours", "hours", SIG),
    Column("chip_hours", "chip-hours", SIG, terminal=False),
    Column("usd", "USD", SIG),
    Column("rub", "rubles", SIG),
    Column("rub_per_1b_tokens", "RUB / 1B tokens", SIG),
    Column("storage", "storage class", terminal=False),
    Column("storage_gb", "GB stored (avg)", "{:,.0f}", terminal=False),
    Column("storage_rub", "storage RUB", SIG),
    Column("rub_with_storage", "RUB with storage", SIG),
    Column("state_gib_per_device", "state GiB/device", "{:,.1f}", terminal=False),
    Column("memory_gib_per_device", "step GiB/device (estimate)", "{:,.1f}", terminal=False),
    Column("hours_to_target", "hours to target", SIG),  # with cost.plan_target_from only
    Column("rub_to_target", "RUB to target", SIG),
    Column("fits", "fits HBM"),
    Column("price_date", "price date"),
    Column("not_planned", "not planned / not priced"),
)
# the console's plan: one row per option, what a reader acts on, within 120 columns (plan.md has every column)
TERMINAL_COLUMNS = (
    Column("accelerator", "accelerator"),
    Column("chips", "chips", "{:d}"),
    Column("pricing_cloud", "pricing (cloud)"),
    Column("hours", "hours", SIG),
    # the rubles, or why there are none (the notes under the table say more); "{:}" right-aligns it as a number
    Column("rub_cell", "rubles", "{:}"),
    Column("mfu", "MFU", "{:.1%}"),
    Column("mfu_from", "MFU from"),
)


@dataclass(frozen=True)
class PlanModel:
    label: str
    cfg: FamilyConfig  # a model family's ``model:`` section (published anchors and presets are Llama shapes)
    vocab_size: int
    seq_len: int

    @property
    def flops_per_token(self) -> float:
        return family_of(self.cfg).flops(self.cfg, self.vocab_size, self.seq_len)

    @property
    def params(self) -> int:
        return family_of(self.cfg).param_count(self.cfg, self.vocab_size)

    @property
    def sparse(self) -> bool:
        """A mixture of experts: fewer parameters per token than in the model."""
        return family_of(self.cfg).active_params(self.cfg, self.vocab_size) < self.params


@dataclass(frozen=True)
class Anchor:
    model: PlanModel
    accelerator: str
    tokens_per_s_per_chip: float
    mfu: float
    source: str
    date: str
    note: str
    # the anchor's activation checkpointing, as published: a model.remat value, or MaxText's remat_policy custom
    # as "custom:<projections kept>" (e.g. custom:q,k,v,out: those outputs offloaded to the host, every other
    # tensor of the layer recomputed)
    remat: str = "none"
    loss_chunk_len: int = 0  # the anchor's chunked loss (0: none or not published)
    plannable: bool = True  # false: its setting is not one we model, so plans never borrow its MFU

    @property
    def recompute(self) -> float:
        """Hardware / model FLOPs of the anchor's own run: its remat and the platform's flash kernel."""
        if self.remat.startswith(CUSTOM_REMAT):
            return custom_remat_recompute(self.model, self.remat, platform_of(self.accelerator), self.loss_chunk_len)
        return recompute_factor(dataclasses.replace(self.model.cfg, remat=self.remat), self.model.vocab_size,
                                self.model.seq_len, platform_of(self.accelerator), "bfloat16", self.loss_chunk_len)


CUSTOM_REMAT = "custom:"
# forward FLOPs per token and layer of each attention projection MaxText's custom policy can keep: 2 x its matmul
CUSTOM_KEPT = {
    "q": lambda c: 2 * c.d_model * c.n_heads * c.resolved_head_dim,
    "k": lambda c: 2 * c.d_model * c.n_kv_heads * c.resolved_head_dim,
    "v": lambda c: 2 * c.d_model * c.n_kv_heads * c.resolved_head_dim,
    "out": lambda c: 2 * c.n_heads * c.resolved_head_dim * c.d_model,
}


def custom_remat_recompute(model: PlanModel, remat: str, platform: str, loss_chunk_len: int) -> float:
    """Hardware / model FLOPs under MaxText's ``remat_policy: custom`` that keeps (offloads to the host) the outputs
    of the projections ``remat`` names and recomputes the rest of each layer (its defaults, base.yml): full remat's
    recomputation less those projections' forward matmuls. The host transfers cost no FLOPs."""
    kept = [name.strip() for name in remat[len(CUSTOM_REMAT):].split(",") if name.strip()]
    unknown = [name for name in kept if name not in CUSTOM_KEPT]
    if unknown or not kept:
        raise ValueError(f"remat {remat!r}: name the kept projections among {', '.join(CUSTOM_KEPT)}")
    full = recompute_factor(dataclasses.replace(model.cfg, remat="full"), model.vocab_size, model.seq_len, platform,
                            "bfloat16", loss_chunk_len)
    saved = sum(CUSTOM_KEPT[name](model.cfg) for name in kept) * model.cfg.n_layers
    return full - saved / model.flops_per_token


def platform_of(accelerator: str) -> str:
    """The JAX platform an accelerator row runs on (which attention kernel ``auto`` would pick)."""
    return "tpu" if accelerator.startswith("tpu") else "gpu" if accelerator.startswith("nvidia") else "other"


def recompute_factor(model_cfg: FamilyConfig, vocab_size: int, seq_len: int, platform: str, compute_dtype: str,
                     loss_chunk_len: int) -> float:
    """Hardware FLOPs / model FLOPs of training ``model_cfg`` (its remat and attention) on ``platform``."""
    _, model_flops, hardware_flops = family_of(model_cfg).train_costs(model_cfg, vocab_size, seq_len, platform,
                                                                      compute_dtype, loss_chunk_len)
    return hardware_flops / model_flops


# the anchor CSV's shape columns: each is the model section field of the same name where the row's family has
# one (llama: d_ff; qwen3_moe: n_experts, top_k, d_expert), an empty cell that field's default; seq_len is the
# sequence the anchor ran at (the section's max_seq_len)
ANCHOR_SHAPE_COLUMNS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "n_experts", "top_k",
                        "d_expert")


def anchor_shape(row: dict[str, str]) -> FamilyConfig:
    """An anchor row's model as its family's ``model:`` section (``family`` empty: llama)."""
    section = model_section_class((row.get("family") or "llama").strip())
    names = {f.name for f in dataclasses.fields(section)}
    unused = [c for c in ANCHOR_SHAPE_COLUMNS if (row.get(c) or "").strip() and c not in names]
    if unused:
        raise ValueError(f"{', '.join(unused)} set, but family {section().family} has no such field")
    shape = {c: int(row[c]) for c in ANCHOR_SHAPE_COLUMNS if (row.get(c) or "").strip()}
    cfg = section(**shape, max_seq_len=int(row["seq_len"]),
                  tie_embeddings=row["tie_embeddings"].strip().lower() == "true")
    cfg.validate("")
    return cfg


def read_anchors(path: Path = ANCHORS) -> list[Anchor]:
    anchors = []
    with path.open(encoding="utf-8", newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                model = PlanModel(row["name"], anchor_shape(row), int(row["vocab_size"]), int(row["seq_len"]))
                tokens_per_s, mfu = float(row["tokens_per_s_per_chip"]), float(row["mfu"])
                if not (math.isfinite(tokens_per_s) and math.isfinite(mfu)):
                    raise ValueError("tokens_per_s_per_chip and mfu must be finite numbers")
                plannable = (row.get("plannable") or "true").strip().lower()
                if plannable not in ("true", "false"):
                    raise ValueError(f"plannable must be true or false, got {plannable!r}")
                anchor = Anchor(model, row["accelerator"], tokens_per_s, mfu, row["source"], row["date"],
                                row.get("note", ""), row.get("remat") or "none", int(row.get("loss_chunk_len") or 0),
                                plannable == "true")
                anchor.recompute  # noqa: B018 (an unknown remat fails here, naming the line, not in a plan)
                anchors.append(anchor)
            except (KeyError, ValueError, TypeError, ConfigError) as exc:
                raise DataError(f"{path} line {line}: bad anchor row ({exc})") from exc
    return anchors


def tokens_per_s_per_chip(mfu: float, peak_tflops: float, flops_per_token: float) -> float:
    return mfu * peak_tflops * 1e12 / flops_per_token


def anchor_check(anchor: Anchor, catalog: Catalog) -> dict[str, Any]:
    """Our FLOP count and the catalog's peak, at the anchor's published MFU, against its published throughput."""
    peak = catalog.chip(anchor.accelerator, key="cost/anchors.csv").peak_bf16_tflops
    if peak is None:
        raise DataError(f"cost/hardware.csv: no peak TFLOP/s for anchor accelerator {anchor.accelerator}")
    predicted = tokens_per_s_per_chip(anchor.mfu, peak, anchor.model.flops_per_token)
    return {"model": anchor.model.label, "accelerator": anchor.accelerator, "mfu": anchor.mfu,
            "published_tokens_per_s_per_chip": anchor.tokens_per_s_per_chip,
            "predicted_tokens_per_s_per_chip": predicted,
            "relative_error": predicted / anchor.tokens_per_s_per_chip - 1, "source": anchor.source}


def resolve_plan_model(cfg: ExperimentConfig, run_folder: RunFolder | None) -> PlanModel:
    """``cost.plan_model``: a preset (at its own context length, with ``cost.plan_vocab_size`` or else our
    tokenizer's vocabulary), a
    published anchor's reference shape (at its CSV length), a Hugging Face config.json (``hf:<folder
    or file>``, its own vocabulary, at model.max_seq_len), or (empty) the experiment's model at
    model.max_seq_len."""
    name = cfg.cost.plan_model
    if not name:
        return experiment_model(cfg, run_folder)
    if is_hf_spec(name):
        label, model_cfg, vocab_size = hf_model_shape(name, "cost.plan_model", cfg.model)
        return PlanModel(label, model_cfg, vocab_size, model_cfg.max_seq_len)
    presets = family_presets(cfg.model.family)
    if name in presets:
        model_cfg = preset_model_config(name, cfg.model.family)
        vocab_size = cfg.cost.plan_vocab_size or vocab_size_of(cfg, run_folder)
        return PlanModel(name, model_cfg, vocab_size, model_cfg.max_seq_len)
    anchors = {anchor.model.label: anchor.model for anchor in read_anchors()}
    if name in anchors:
        return anchors[name]
    raise ConfigError(f"config key 'cost.plan_model': unknown model '{name}' "
                      f"(known: {', '.join([*presets, *anchors])}, "
                      "or hf:<folder or config.json>)")


def vocab_size_of(cfg: ExperimentConfig, run_folder: RunFolder | None) -> int:
    """The trained tokenizer's vocabulary when recipe 02 ran, else the configured size."""
    if run_folder is not None:
        manifest = TOKENIZER.read_manifest_if_present(run_folder.tokenizer)
        if manifest is not None:
            return int(manifest["vocab_size"])
    return cfg.tokenizer.vocab_size


def planned_tokens(cfg: ExperimentConfig) -> int:
    if cfg.cost.plan_tokens:
        return cfg.cost.plan_tokens
    if cfg.cost.token_budget:
        return cfg.cost.token_budget
    return cfg.train.steps * cfg.train.batch_size * cfg.model.max_seq_len


def experiment_model(cfg: ExperimentConfig, run_folder: RunFolder | None) -> PlanModel:
    """The model this experiment trains (the one its ledger measured)."""
    return PlanModel(cfg.model.preset or f"{cfg.experiment.name} model", cfg.model,
                     vocab_size_of(cfg, run_folder), cfg.model.max_seq_len)


def measured_mfu(run_folder: RunFolder | None, model: PlanModel, catalog: Catalog) -> tuple[str, float] | None:
    """MFU of our own training run of ``model`` (its ledger): train-phase tokens/s per chip x FLOPs per
    token / peak. The planner carries it over to the planned model on the same accelerator."""
    if run_folder is None or not appendlog.exists(run_folder.ledger / LEDGER_FILE):
        return None
    summary = summarize_ledger(run_folder.ledger)
    train_seconds = summary.seconds_by_phase.get("train", 0.0)
    hardware = catalog.hardware.get(summary.accelerator)
    if not summary.tokens or train_seconds <= 0 or hardware is None or not hardware.peak_bf16_tflops:
        return None
    rate = summary.tokens / train_seconds / (summary.chips_in_use or summary.chips)  # per chip that trained
    return summary.accelerator, rate * model.flops_per_token / (hardware.peak_bf16_tflops * 1e12)


@dataclass(frozen=True)
class MfuChoices:
    """Where an option's MFU comes from, first match wins: the option, our own run on that accelerator,
    the nearest anchor in size on the same vendor's hardware within ``size_ratio`` (``cost/anchors.csv``),
    ``cost.plan_mfu``."""

    default: float
    measured: tuple[str, float] | None = None  # (accelerator, MFU) of our run
    anchors: tuple[Anchor, ...] = ()
    vendors: dict[str, str] = dataclasses.field(default_factory=dict)  # accelerator -> vendor (cost/hardware.csv)
    params: int = 0  # the planned model's
    size_ratio: float = 4.0
    sparse: bool = False  # the planned model is a mixture of experts (``PlanModel.sparse``)

    def pick(self, option: Any) -> tuple[float, str, float | None]:
        """(MFU, its source, the recompute factor it was reached at); None: it already is this setting's
        MFU (given for the option, or measured by our run), so it is not adjusted."""
        if option.mfu is not None:
            return option.mfu, "option", None
        if self.measured is not None and self.measured[0] == option.accelerator:
            return self.measured[1], "our run", None
        vendor = self.vendors.get(option.accelerator, "")
        # a mixture of experts moves tokens between devices and runs smaller matmuls than a dense model of its
        # active size: it borrows only a sparse anchor's MFU, and a dense model only a dense one's
        kind = "sparse" if self.sparse else "dense"
        related = [a for a in self.anchors
                   if self.vendors.get(a.accelerator) == vendor and a.model.sparse == self.sparse]
        kin = [a for a in related if a.plannable]
        # an anchor nearer in size that plans may not borrow from is named: "the nearest" is then the nearest usable
        refused = sorted({a.model.label for a in related if not a.plannable})
        unusable = f"; not lent: {', '.join(refused)} (plannable false in cost/anchors.csv)" if refused else ""
        if not kin:
            return self.default, (f"cost.plan_mfu (no {kind} anchor on {vendor or option.accelerator} "
                                  f"hardware{unusable})"), 1.0
        nearest = min(kin, key=lambda a: (abs(math.log(a.model.params / self.params)),
                                          a.accelerator != option.accelerator))
        ratio = nearest.model.params / self.params
        if max(ratio, 1 / ratio) > self.size_ratio:
            beyond = f"beyond cost.plan_anchor_size_ratio {self.size_ratio:g}"
            return self.default, (f"cost.plan_mfu (nearest {kind} {vendor} anchor {nearest.model.label} is "
                                  f"{ratio:.2g}x the size, {beyond}{unusable})"), 1.0
        where = "" if nearest.accelerator == option.accelerator else f" on {nearest.accelerator}"
        return nearest.mfu, f"anchor {nearest.model.label}{where}", nearest.recompute


@dataclass(frozen=True)
class RunSetting:
    """How the planned run fits: remat and micro-batches, and where that choice comes from."""

    remat: str
    grad_accum_steps: int
    source: str  # what the table says it came from: "fit check <slice>", "config", or the memory estimate
    basis: str = "config"  # "fit check", "config" or "estimate"
    estimate: MemoryEstimate | None = None  # the memory estimate it was chosen by (basis "estimate")


def slice_accelerator(slice_name: str) -> str:
    """The catalog's accelerator of a fit-check slice: v6e-8 -> tpu-v6e, tpu7x-8 -> tpu7x."""
    generation = slice_name.split("-")[0]
    return generation if generation.startswith("tpu") else f"tpu-{generation}"


def fit_settings(run_folder: RunFolder | None, catalog: Catalog) -> dict[tuple[str, int], RunSetting]:
    """(accelerator, chips) -> the setting recipe 04b chose (or checked) for that slice, when it fits."""
    path = None if run_folder is None else FIT_CHECK.dir(run_folder) / FIT_CHECK.output
    if path is None or not path.is_file():
        return {}

    try:
        reports = parse_json(path.read_text(encoding="utf-8"))
        settings = {}
        for r in reports:
            if r.get("fits") and "remat" in r:
                accelerator = slice_accelerator(r["slice"])
                chip = catalog.hardware.get(accelerator)
                chips = int(r["devices"]) // (chip.devices_per_chip if chip else 1)
                settings[accelerator, chips] = RunSetting(r["remat"], int(r["grad_accum_steps"]),
                                                          f"fit check {r['slice']}", "fit check")
        return settings
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path}: not a fit-check report ({exc}); {FIT_CHECK.run_again}") from exc


def option_setting(option: PlanOption, devices: int, hbm_gib_per_device: float | None, model: PlanModel,
                   train_cfg: TrainConfig,
                   chosen: dict[tuple[str, int], RunSetting], configured: RunSetting) -> RunSetting:
    """The setting ``option`` runs with: the fit check's for its slice, the config's on other TPU slices, else
    the least-recompute setting whose memory estimate fits the device (GPUs, Trainium)."""
    if (option.accelerator, option.chips) in chosen:
        return chosen[option.accelerator, option.chips]
    if platform_of(option.accelerator) == "tpu" or hbm_gib_per_device is None:
        return configured
    estimate = cheapest_fitting(model.cfg, model.params, model.vocab_size, model.seq_len, train_cfg.batch_size,
                                devices, hbm_gib_per_device, train_cfg.loss_chunk_len)
    source = estimate.describe() if estimate.fits else f"does not fit: {estimate.describe()}"
    return RunSetting(estimate.remat, estimate.grad_accum_steps, source, "estimate", estimate)


def batch_split_problem(devices: int, model_cfg: FamilyConfig, train_cfg: TrainConfig,
                        grad_accum_steps: int) -> str | None:
    """Why the run's batch cannot be split over ``devices`` (None: it can). The option keeps the config's tensor
    and family axes (``train.mesh``) and its data-parallel axes (data x fsdp) fill the slice, as a run moved to
    another slice would set them; each micro-batch must then divide over the devices of the batch rule's axes.
    The planner drops such an option with this line; ``cost.checks.check_plan`` refuses one the config names."""
    rules = family_of(model_cfg).mesh_rules(train_cfg.mesh.rules)
    extra = family_axes(train_cfg.mesh, rules)
    fixed = train_cfg.mesh.tensor * math.prod(extra.values())
    named = " x ".join([f"tensor={train_cfg.mesh.tensor}", *(f"axes.{a}={n}" for a, n in extra.items())])
    if devices % fixed:
        return f"its {devices} devices do not divide by train.mesh {named} = {fixed}"
    batch_axes = rules.get("batch", [])
    # data and fsdp share what the fixed axes leave of the slice: a batch rule naming both (the families' rules)
    # splits over all of it, however it is shared. One naming a single one of them splits over that axis of the
    # mesh the trainer builds there: fsdp as train.mesh sizes it, data the rest (model.sharding.mesh_shape)
    data_parallel, fsdp = devices // fixed, train_cfg.mesh.fsdp
    named_sizes = {"tensor": train_cfg.mesh.tensor, **extra}
    axis_sizes = {axis: named_sizes[axis] for axis in batch_axes if axis in named_sizes}
    if {"data", "fsdp"} <= set(batch_axes):
        axis_sizes["data x fsdp"] = data_parallel
    elif "fsdp" in batch_axes:
        axis_sizes["fsdp"] = fsdp
    elif "data" in batch_axes:  # a slice fsdp does not divide has no such mesh: then as if data took it all
        axis_sizes["data"] = data_parallel // fsdp if data_parallel % fsdp == 0 else data_parallel
    split = BatchSplit(train_cfg.batch_size, grad_accum_steps, axis_sizes)
    if not split.even:
        parts = split.parts
        return (f"train.batch_size {train_cfg.batch_size} in {grad_accum_steps} micro-batch(es) does not split over "
                f"its {parts} data-parallel devices (data x fsdp fill the slice beside train.mesh {named}): give a "
                f"batch divisible by {parts} x the micro-batches, or another slice")
    return None


def short_source(mfu_source: str) -> str:
    """The first words of an MFU source, for the console ('llama3.1-8b on tpu-v6e' for an anchor, 'cost.plan_mfu',
    'our run', 'option'); plan.md keeps the whole sentence (why no anchor applied, the recompute factors)."""
    return mfu_source.split(" (")[0].split(",")[0].removeprefix("anchor ")


def estimate(option: PlanOption, index: int, model: PlanModel, tokens: int, catalog: Catalog, rate: UsdRubRate,
             mfu_choices: MfuChoices, chosen: dict[tuple[str, int], RunSetting], configured: RunSetting,
             train_cfg: TrainConfig, vat_rate: float) -> dict[str, Any]:
    """One table row: time and money of ``tokens`` on this option, at the setting the run fits with. An option
    the catalog publishes no price for is planned in hours and says which rate to give (no rubles); one whose
    batch cannot be split over its devices is not planned, and the row says why."""
    key = f"cost.plan_options[{index}]"
    # no cloud named: the cheapest that sells it is planned, the others shown beside it
    try:
        price, *others = catalog.priced_rows(option.accelerator, option.pricing, option.cloud, option.region,
                                             key=f"{key}.accelerator", cheapest=not option.cloud,
                                             usd_rub_rate=rate.rate)
        unpriced = None
    except UnpricedError as exc:  # a row of the catalog without a figure (a Russian cloud's, say): ask for a rate
        price, others, unpriced = exc.row, [], exc
    chip = catalog.chip(option.accelerator, key=f"{key}.accelerator")
    if not chip.peak_bf16_tflops:
        raise CatalogError(f"config key '{key}.accelerator': no peak bf16 TFLOP/s for {option.accelerator} in "
                           "cost/hardware.csv, so its time cannot be estimated")
    devices = option.chips * chip.devices_per_chip
    hbm_per_device = None if chip.hbm_gib is None else chip.hbm_gib / chip.devices_per_chip
    setting = option_setting(option, devices, hbm_per_device, model, train_cfg, chosen, configured)
    billed = price.billed(vat_rate)
    row: dict[str, Any] = {
        "accelerator": option.accelerator, "cloud": price.cloud or "any", "region": price.region,
        "pricing": price.pricing, "chips": option.chips, "devices": devices,
        "usd_per_chip_hour": None if billed is None else billed if price.currency == "USD" else billed / rate.rate,
        "chip_hour_price": ("none published" if price.figure is None
                            else f"{price.figure:g} {price.currency}"
                            + (f" + {vat_rate:.0%} VAT" if price.vat == "added" else "")),
        "price_kind": price.source_kind,
        "other_clouds": "; ".join(f"{r.cloud} {r.figure:.3f}" + (" RUB" if r.currency == "RUB" else "")
                                  for r in others) or None,
        "peak_tflops": chip.peak_bf16_tflops, "remat": setting.remat, "grad_accum_steps": setting.grad_accum_steps,
        "setting_from": setting.source, "hbm_gib": chip.hbm_gib, "price_date": price.date,
        "price_source": price.source, "not_planned": None,
    }
    split = batch_split_problem(devices, model.cfg, train_cfg, setting.grad_accum_steps)
    if split is not None:  # no hours, no rubles: a run on this slice could not start with this batch
        unplanned = {c.key: None for c in COLUMNS if c.key not in row}
        return {**unplanned, **row, "not_planned": f"not planned: {split}", "mfu_source": "not planned",
                "mfu_from": "—"}
    recompute = recompute_factor(dataclasses.replace(model.cfg, remat=setting.remat), model.vocab_size, model.seq_len,
                                 platform_of(option.accelerator), train_cfg.compute_dtype, train_cfg.loss_chunk_len)
    mfu, mfu_source, basis = mfu_choices.pick(option)
    mfu_from = short_source(mfu_source)
    if basis is not None:  # the source's hardware utilisation, spent on this setting's extra work
        mfu = mfu * basis / recompute
        mfu_source += f", x{basis:.2f}/{recompute:.2f} recompute"
    per_device = tokens_per_s_per_chip(mfu, chip.peak_bf16_tflops_per_device or 0.0, model.flops_per_token)
    per_chip = per_device * chip.devices_per_chip
    hours = tokens / (per_device * devices) / 3600
    usd, rub = price.cost_of(hours * option.chips, vat_rate, rate.rate) or (None, None)
    if rub is not None and not (math.isfinite(rub) and math.isfinite(usd or 0.0)):
        raise ConfigError(f"config key '{price.price_key}': {option.chips} chips x {hours:.4g} hours x "
                          f"{price.describe_figure()} at USD->RUB {rate.rate:g} is not a finite number of rubles; "
                          "check the figure")
    state_gib = model.params * STATE_BYTES_PER_PARAM / devices / 2**30
    estimated = setting.estimate.bytes_per_device if setting.estimate else step_bytes(
        model.cfg, model.params, model.vocab_size, model.seq_len,
        max(train_cfg.batch_size / devices, 1.0) / setting.grad_accum_steps, devices, setting.remat,
        train_cfg.loss_chunk_len)
    if hbm_per_device is None:
        fits = None
    elif setting.basis == "fit check":
        fits = "yes (fit check)"
    elif setting.estimate is not None:
        fits = "yes (estimate)" if setting.estimate.fits else "no"
    else:  # the config's setting on a TPU slice 04b did not check: the state alone is compared
        fits = "state only: yes" if state_gib <= hbm_per_device else "no"
    if unpriced is not None:  # hours, but no rubles: never a price of 0
        ask = "" if "give your rate" in price.note else (
            f"; give your rate: cost.contract_rates.{option.accelerator} (e.g. {{price: <per chip-hour>, "
            "currency: RUB, vat: included}) or a user catalog row")
        row["not_planned"] = f"not priced: {price.note or 'no published rate'}{ask}"
    return {
        **row, "recompute": recompute, "mfu": mfu, "hfu": mfu * recompute, "mfu_source": mfu_source,
        "mfu_from": mfu_from, "tokens_per_s_per_chip": per_chip, "tokens_per_s_per_device": per_device,
        "hours": hours, "chip_hours": hours * option.chips, "usd": usd, "rub": rub,
        "rub_per_1b_tokens": None if rub is None else rub / tokens * 1e9, "state_gib_per_device": state_gib,
        "memory_gib_per_device": estimated / 2**30, "fits": fits,
    }


# bytes one parameter takes in a checkpoint per train.param_dtype: the weights and AdamW's two moments (optax keeps
# them in the parameters' dtype), uncompressed
CHECKPOINT_BYTES_PER_PARAM = {"float32": 3 * 4, "bfloat16": 3 * 2}
TOKEN_BYTES = 4  # a token of the data without a shards manifest to measure: an int32


@dataclass(frozen=True)
class StoragePlan:
    """What a planned run's folder holds on average over the run: its token data and checkpoints."""

    checkpoint_bytes: float  # one checkpoint
    checkpoints: float  # held on average over the run
    data_bytes: float
    bytes_per_token: float
    bytes_per_token_from: str

    @property
    def stored_bytes(self) -> float:
        return self.data_bytes + self.checkpoint_bytes * self.checkpoints

    def note(self, rows: list[dict[str, Any]]) -> str:
        classes = sorted({f"{r['storage']} ({r['storage_why']})" for r in rows if r.get("storage")})
        unpriced = sorted({r["storage_why"] for r in rows if not r.get("storage")})
        return (f"storage: the run folder held for the option's hours at its storage class's GB-month price (1 GB = "
                f"2^30 bytes, a month {HOURS_PER_MONTH:g} hours): {self.stored_bytes / GIB:,.0f} GB on average = the "
                f"token data ({self.data_bytes / GIB:,.0f} GB: the planned tokens x {self.bytes_per_token:.3g} bytes, "
                f"{self.bytes_per_token_from}) + {self.checkpoints:.3g} checkpoints held on average (the latest "
                f"train.keep_checkpoints, fewer during the first saves, and every train.keep_checkpoints_every-th, "
                f"half of them on average) x {self.checkpoint_bytes / GIB:,.1f} GB (parameters x weights and Adam's "
                f"two moments in train.param_dtype, uncompressed); the corpus, requests and the time the data is kept "
                f"after the run are not planned; classes: {'; '.join(classes) or 'none'}"
                + (f"; not priced: {'; '.join(unpriced)}" if unpriced else ""))


def checkpoints_held(steps: int, checkpoint_every: int, keep: int, keep_every: int) -> float:
    """Checkpoints a run holds on average over its steps: the latest ``keep`` of the saves every ``checkpoint_every``
    steps and at the end (the j-th interval between saves holds min(j, keep)), plus every ``keep_every``-th step's,
    which accumulate (half of them on average)."""
    saves = max(1, math.ceil(steps / checkpoint_every)) if checkpoint_every else 1
    last = min(saves - 1, keep)
    latest = (last * (last + 1) / 2 + keep * max(0, saves - 1 - keep)) / saves
    return latest + (steps // keep_every) / 2 if keep_every else latest


def storage_plan(cfg: ExperimentConfig, run_folder: RunFolder | None, model: PlanModel, tokens: int) -> StoragePlan:
    """The planned run's folder: ``tokens`` of data (the shards' own bytes per token when recipe 03's manifest is
    at hand, else an int32 each) and its checkpoints (``CHECKPOINT_BYTES_PER_PARAM`` x the planned parameters)."""
    per_token, source = float(TOKEN_BYTES), "an int32 per token: no shards manifest to measure"
    manifest = None if run_folder is None else SHARDS.read_manifest_if_present(run_folder.shards)
    if manifest is not None:
        splits = manifest["splits"].values()
        shard_bytes = sum(shard["bytes"] for split in splits for shard in split["shards"])
        shard_tokens = sum(split["tokens"] for split in splits)
        if shard_bytes and shard_tokens:
            per_token, source = shard_bytes / shard_tokens, "the shards' bytes per token in recipe 03's manifest"
    steps = math.ceil(tokens / (cfg.train.batch_size * model.seq_len))
    held = checkpoints_held(steps, cfg.train.checkpoint_every, cfg.train.keep_checkpoints,
                            cfg.train.keep_checkpoints_every)
    return StoragePlan(model.params * CHECKPOINT_BYTES_PER_PARAM[cfg.train.param_dtype], held, tokens * per_token,
                       per_token, source)


def plan_storage(rows: list[dict[str, Any]], storage: StoragePlan, cfg: ExperimentConfig, catalog: Catalog,
                 rate: UsdRubRate) -> None:
    """Each option's storage: ``storage``'s bytes over its hours at the GB-month price of its storage class
    (``cost.storage``; ``auto`` with a local run_root: the option's own cloud's), in the row's currency (a ruble
    price as it is, a dollar one at ``rate``); an option no class prices gets none, and the note says why."""
    where = location(cfg.experiment.run_root)
    for row in rows:
        choice = resolve_storage(cfg.cost, where, catalog, cloud=row["cloud"])
        row["storage_why"] = choice.why
        if not choice.priced or row.get("hours") is None:
            row.update(storage=None, storage_gb=None, storage_rub=None, rub_with_storage=None)
            continue
        price = choice.rows["gb-month"]
        gb_months = storage.stored_bytes / GIB * row["hours"] / HOURS_PER_MONTH
        rub = gb_months * (price.figure or 0.0) * (rate.rate if price.currency == "USD" else 1.0)
        row.update(storage=choice.name, storage_gb=storage.stored_bytes / GIB, storage_gb_months=gb_months,
                   storage_rub=rub, rub_with_storage=None if row.get("rub") is None else row["rub"] + rub,
                   storage_price=f"{price.describe_figure()} ({price.source_kind}, {price.date})")


def plan_figure(rows: list[dict[str, Any]], title: str) -> Any:
    """The plan's bars: rubles and hours per option (an option without either is left empty, never drawn at 0).
    Axis ticks are plain numbers with thousands separators: matplotlib's default would print 2,000,000 rubles as
    "2" under a "1e6" offset, which reads as two rubles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    labels = [f"{r['accelerator']} x{r['chips']} {r['pricing']} ({r['cloud']})" for r in rows]
    fig, (ax_rub, ax_hours) = plt.subplots(1, 2, figsize=(12, 0.5 * len(rows) + 2), sharey=True)
    ax_rub.barh(labels, [math.nan if r.get("rub") is None else r["rub"] for r in rows], color="tab:red")
    ax_rub.set_xlabel("rubles")
    ax_hours.barh(labels, [math.nan if r.get("hours") is None else r["hours"] for r in rows], color="tab:blue")
    ax_hours.set_xlabel("hours (wall clock)")
    ax_rub.invert_yaxis()
    for ax in (ax_rub, ax_hours):
        ax.grid(axis="x", alpha=0.3)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: significant(value)))
        ax.tick_params(axis="x", labelrotation=30)
    fig.suptitle(title)
    return fig


def plot_plan(rows: list[dict[str, Any]], title: str, path: Path) -> Path:
    return save_figure(plan_figure(rows, title), path)


@dataclass(frozen=True)
class MeasuredTarget:
    """A run of ours that reached the target: its folder, config, and the tokens it trained to get there."""

    folder: RunFolder
    cfg: ExperimentConfig
    target: Target
    crossing: TargetCrossing

    @property
    def tokens(self) -> float:
        return float(self.crossing.tokens or 0.0)


def measured_target_run(cfg: ExperimentConfig, run_folder: RunFolder | None) -> MeasuredTarget | None:
    """``cost.plan_target_from``: that run's tokens to ``cost.target_bpb`` / ``target_score`` (its
    ``train_log.jsonl`` eval points, interpolated as in the comparison); None when not asked."""
    name = cfg.cost.plan_target_from
    if not name:
        return None
    key = "config key 'cost.plan_target_from'"
    folder = RunFolder(location(cfg.experiment.run_root) / name)
    resolved = folder.root / "config.resolved.yaml"
    if not resolved.is_file():
        raise ConfigError(f"{key}: {folder.root} holds no run (no config.resolved.yaml): run recipes/04_pretrain.py "
                          f"for experiment '{name}' first")
    target = target_of(cfg.cost, cfg.cost.target_metric or cfg.cost.eval_metric or None)
    assert target is not None  # the cost section requires a target with plan_target_from
    crossing = cost_to_target(eval_points(read_train_log(folder.root), target.metric), target)
    if not crossing.reached or not crossing.tokens:
        raise DataError(f"{key}: experiment '{name}' {crossing.status(target)} for {target.label} in "
                        f"{folder.root / 'train_log.jsonl'}: pick a run that reached it, or another target")
    return MeasuredTarget(folder, load_config(resolved), target, crossing)


def plan(cfg: ExperimentConfig, run_folder: RunFolder | None, catalog: Catalog | None = None,
         rate: UsdRubRate | None = None) -> tuple[PlanModel, int, list[dict[str, Any]], list[dict[str, Any]]]:
    """The model, token count, one row per option, and the anchor checks (no files written)."""
    catalog = catalog or Catalog.from_config(cfg.cost)
    # the run's own accelerator and pricing are names of the catalog (a typo would plan silently); a row without
    # a published figure is fine here (recipe 04 asks for its rate: cost.checks)
    with contextlib.suppress(UnpricedError):
        catalog.lookup(cfg.cost.accelerator, cfg.cost.pricing, cfg.cost.cloud, cfg.cost.region, cheapest=True)
    rate = rate or resolve_usd_rub(cfg.cost)
    measured = measured_target_run(cfg, run_folder)
    if measured is not None:  # the measured run's own model, at the MFU its ledger measured where it ran
        model = measured_model = experiment_model(measured.cfg, measured.folder)
        mfu_folder: RunFolder | None = measured.folder
    else:
        model, measured_model, mfu_folder = (resolve_plan_model(cfg, run_folder), experiment_model(cfg, run_folder),
                                             run_folder)
    tokens = planned_tokens(cfg)
    anchors = tuple(read_anchors())
    mfu_choices = MfuChoices(cfg.cost.plan_mfu, measured_mfu(mfu_folder, measured_model, catalog),
                             anchors if cfg.cost.plan_mfu_from_anchors else (),
                             {name: row.vendor for name, row in catalog.hardware.items()}, model.params,
                             cfg.cost.plan_anchor_size_ratio, model.sparse)
    chosen = fit_settings(run_folder, catalog)
    configured = RunSetting(cfg.model.remat, cfg.train.grad_accum_steps, "config")
    rows = [estimate(option, i, model, tokens, catalog, rate, mfu_choices, chosen, configured, cfg.train,
                     cfg.cost.vat_rate) for i, option in enumerate(cfg.cost.plan_options)]
    if not rows:
        raise ConfigError("config key 'cost.plan_options': give at least one accelerator option")
    if measured is not None:  # time and money are linear in tokens: the measured tokens-to-target's share
        for row in rows:
            share = measured.tokens / tokens
            row.update(tokens_to_target=measured.tokens,
                       hours_to_target=None if row.get("hours") is None else row["hours"] * share,
                       rub_to_target=None if row.get("rub") is None else row["rub"] * share)
    plan_storage(rows, storage_plan(cfg, run_folder, model, tokens), cfg, catalog, rate)
    for row in rows:
        row.update(pricing_cloud=f"{row['pricing']} ({row['cloud']})", rub_cell=rubles_cell(row))
    checks = [anchor_check(anchor, catalog) for anchor in anchors]
    return model, tokens, rows, checks


def rubles_cell(row: dict[str, Any]) -> str:
    """The console's rubles: the figure, or in two words why there is none (the notes under the table say more)."""
    if row.get("hours") is None:
        return "not planned"
    if row.get("rub") is None:
        return "give a rate"
    return significant(row["rub"])


def plan_costs(cfg: ExperimentConfig, run_folder: RunFolder, wandb_run: Any) -> list[dict[str, Any]]:
    """Recipe 07: print and write the plan table (reports/plan.md, .csv) and chart (reports/plan.png)."""
    rate = resolve_usd_rub(cfg.cost)
    model, tokens, rows, checks = plan(cfg, run_folder, rate=rate)
    amount = f"{tokens / 1e9:,.4g}B tokens" if tokens >= 1e9 else f"{tokens:,} tokens"
    title = f"Plan: {model.label} ({params_label(model.params)} parameters, vocabulary {model.vocab_size:,}), {amount}"
    preamble = (f"Model {model.label}: {params_label(model.params)} parameters, vocabulary {model.vocab_size}, "
                f"sequence {model.seq_len}, {model.flops_per_token / 1e9:,.3f} GFLOP per trained token "
                f"(the family's hand count, 3x forward). USD->RUB {rate.rate:.4f} of {rate.date} ({rate.source}).")
    notes = [f"anchor: {c['model']} on {c['accelerator']} at {c['mfu']:.1%} MFU: our arithmetic gives "
             f"{c['predicted_tokens_per_s_per_chip']:,.0f} tokens/s/chip, published "
             f"{c['published_tokens_per_s_per_chip']:,.0f} ({c['relative_error']:+.2%}; {c['source']})" for c in checks]
    notes.append("recompute = hardware / model FLOPs of the setting (remat, the flash kernel's backward, the chunked "
                 "loss; the family's hand count); an anchor's MFU or cost.plan_mfu is held as hardware utilisation "
                 "(HFU) and divided by it; 'setting from' says whether recipe 04b's fit check or the config chose "
                 "the setting")
    notes.append(f"setting: recipe 04b's choice for a slice it checked; else the config's on TPUs (state = "
                 f"{STATE_BYTES_PER_PARAM} bytes/parameter sharded over the devices: 'state only: yes' is necessary, "
                 "not sufficient: run recipe 04b); else the least-recompute setting whose memory estimate (state, one "
                 "micro-batch's activations and logits; cost/memory.py) fits the device")
    notes.append("price from: 'catalog snapshot' (SkyPilot's catalog of the clouds' lists), 'provider list', "
                 "'third-party' (not the provider's own figure: check it), 'contract' (cost.contract_rates, in its "
                 "own currency: rubles are multiplied as rubles, cost.vat_rate added to a figure before VAT); an "
                 "option without a cloud is priced at the cheapest cloud, the others in 'other clouds'")
    notes.append("MFU is per device (a TPU7x chip is two devices, each with half its peak); 'MFU from' names the "
                 "measured or published anchor (the nearest in size on the same vendor's hardware, within "
                 "cost.plan_anchor_size_ratio) or cost.plan_mfu")
    measured = measured_target_run(cfg, run_folder)
    if measured is not None:
        notes.append(f"to target: experiment '{measured.folder.root.name}' reached {measured.target.label} after "
                     f"{measured.tokens:,.0f} tokens ({measured.crossing.status(measured.target)}; its rubles "
                     f"{measured.crossing.rub:.4g}); hours to target = those tokens / the option's projected tokens/s")
    notes.append(storage_plan(cfg, run_folder, model, tokens).note(rows))
    notes.extend(f"{row['accelerator']} x{row['chips']} {row['pricing']} ({row['cloud']}): {row['not_planned']}"
                 for row in rows if row.get("not_planned"))
    notes.extend(f"{row['accelerator']} x{row['chips']} {row['pricing']} ({row['cloud']}): does not fit the device "
                 f"by the memory estimate ({row['setting_from']})" for row in rows if row.get("fits") == "no")
    notes.extend(rate.notes)
    reports = run_folder.reports
    reports.mkdir(parents=True, exist_ok=True)
    columns = COLUMNS if measured is not None else tuple(c for c in COLUMNS if not c.key.endswith("_to_target"))
    files = write_table(rows, columns, reports / "plan", title, preamble=preamble, notes=notes,
                        terminal_columns=TERMINAL_COLUMNS)
    chart = plot_plan(rows, title, reports / "plan.png")
    log_to_wandb(wandb_run, "plan", rows, columns, {"chart": chart}, files, artifact_type="cost-plan")
    if wandb_run is not None and not getattr(wandb_run, "disabled", False):
        wandb_run.config.update({f"cost_{k}": v for k, v in rate.as_dict().items()}, allow_val_change=True)
        wandb_run.summary.update({f"plan/anchor/{c['model']}/{c['accelerator']}/relative_error": c["relative_error"]
                                  for c in checks})
    return rows
