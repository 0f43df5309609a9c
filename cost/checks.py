"""The cost section's checks before anything is written (``Stage.checks``, experiment/check.py): the run's own
price (what recipe 04's ledger books), and what recipe 07 plans: its model, each option's price and chip, and
whether the run's batch splits over each planned slice. They read the catalog and the config only: no rate is
fetched and no cache file is written (a configured USD->RUB rate is checked for its age)."""

from __future__ import annotations

import datetime as dt
import math

from cost.catalog import Catalog
from cost.ledger import price_rows
from cost.planner import measured_target_run, resolve_plan_model
from cost.rates import UsdRubRate, check_age
from experiment.errors import ConfigError
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.model import family_axis_rules
from experiment.sections.train import BASE_MESH_AXES


def check_run_price(cfg: ExperimentConfig, run_folder: RunFolder) -> None:
    """``cost.accelerator`` / ``pricing`` / ``cloud`` / ``region``, the infrastructure rows and a named storage
    class are rows of the catalog (what the ledger prices each session by: ``cost.ledger.price_rows``)."""
    price_rows(cfg.cost)


def check_plan(cfg: ExperimentConfig, run_folder: RunFolder) -> None:
    """What recipe 07 plans, before it writes its tables: ``cost.plan_model`` (a preset, an anchor or hf:<folder>),
    ``cost.plan_target_from``'s run, each of ``cost.plan_options`` priced in the catalog with its chip's figures,
    the run's batch split over the devices of each option the config names for its own model
    (``slice_batch_problem``), and a configured rate's age."""
    catalog = Catalog.from_config(cfg.cost)
    catalog.lookup(cfg.cost.accelerator, cfg.cost.pricing, cfg.cost.cloud, cfg.cost.region, cheapest=True)
    if measured_target_run(cfg, run_folder) is None:
        resolve_plan_model(cfg, run_folder)
    if not cfg.cost.plan_options:
        raise ConfigError("config key 'cost.plan_options': give at least one accelerator option")
    for index, option in enumerate(cfg.cost.plan_options):
        key = f"cost.plan_options[{index}]"
        catalog.priced_rows(option.accelerator, option.pricing, option.cloud, option.region, key=f"{key}.accelerator",
                            cheapest=not option.cloud)
        chip = catalog.chip(option.accelerator, key=f"{key}.accelerator")
        # slices planned for this run's batch: the options the config names (the default set is a survey of
        # accelerators), for the run's own model (not cost.plan_model's other shape, nor plan_target_from's run)
        planned = ("cost.plan_options" in cfg.explicit_keys and not cfg.cost.plan_model
                   and not cfg.cost.plan_target_from)
        problem = slice_batch_problem(cfg, option.chips * chip.devices_per_chip) if planned else None
        if problem:
            raise ConfigError(f"config key '{key}': {option.accelerator} x {option.chips} chips: {problem}; plan a "
                              "slice the batch splits over, or change train.batch_size")
    if cfg.cost.usd_rub_rate is not None:  # a fetched rate is the planner's to get (it writes a cache file)
        check_age(UsdRubRate(float(cfg.cost.usd_rub_rate), dt.date.fromisoformat(cfg.cost.usd_rub_date), "config"),
                  cfg.cost, dt.date.today())


def slice_batch_problem(cfg: ExperimentConfig, devices: int) -> str | None:
    """Why the run's batch cannot be split over a slice of ``devices`` devices (None: it can). On another slice the
    run keeps ``train.mesh``'s sizes of the axes that do not split the batch (tensor, and a family axis the "batch"
    rule leaves out) and spreads the batch axes (data, fsdp, expert ...) over the devices left; every micro-batch
    (at any ``train.grad_accum_steps``) then divides by those devices only if the batch does."""
    mesh = cfg.train.mesh
    batch_axes = {**family_axis_rules(cfg.model.family), **mesh.rules}.get("batch", [])
    sizes = {"data": max(mesh.data, 1) * mesh.dcn_data, "fsdp": mesh.fsdp, "tensor": mesh.tensor, **mesh.axes}
    held = {axis: size for axis, size in sizes.items() if axis not in batch_axes and size > 1}
    fixed = math.prod(held.values())
    if devices % fixed:
        what = " x ".join(f"{axis} {size}" for axis, size in held.items())
        return f"train.mesh's {what} = {fixed} devices does not divide its {devices} devices"
    parts = devices // fixed
    if cfg.train.batch_size % parts:
        over = [axis for axis in (*BASE_MESH_AXES, *mesh.axes) if axis in batch_axes]
        return (f"the batch of {cfg.train.batch_size} sequences (train.batch_size) does not split over its {parts} "
                f"data-parallel devices ({' x '.join(over)})")
    return None
