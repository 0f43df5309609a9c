"""The cost section's checks before anything is written (``Stage.checks``, experiment/check.py): the run's own
price (what recipe 04's ledger books), and what recipe 07 plans: its model, each option's price and chip, and
whether the run's batch splits over each planned slice. They read the catalog and the config only: no rate is
fetched and no cache file is written (a configured USD->RUB rate is checked for its age)."""

from __future__ import annotations

import datetime as dt

from cost.catalog import Catalog, UnpricedError
from cost.ledger import price_rows
from cost.ledger_pricing import check_finite
from cost.planner import batch_split_problem, measured_target_run, resolve_plan_model
from cost.rates import UsdRubRate, check_age, shipped_fallback
from cost.summary import price_dict
from experiment.errors import ConfigError
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig


def check_run_price(cfg: ExperimentConfig, run_folder: RunFolder) -> None:
    """``cost.accelerator`` / ``pricing`` / ``cloud`` / ``region``, the infrastructure rows and a named storage
    class are rows of the catalog (what the ledger prices each session by: ``cost.ledger.price_rows``), and their
    hour is a finite number of rubles (at the configured USD->RUB rate, else the shipped fallback's: the rate of
    the day is the ledger's to fetch)."""
    price, infra = price_rows(cfg.cost)
    rate = float(cfg.cost.usd_rub_rate) if cfg.cost.usd_rub_rate is not None else shipped_fallback().rate
    check_finite({"price": price_dict(price), "infra": infra, "chips": cfg.cost.chips, "vat_rate": cfg.cost.vat_rate,
                  "usd_rub_rate": rate})


def check_plan(cfg: ExperimentConfig, run_folder: RunFolder) -> str | None:
    """What recipe 07 plans, before it writes its tables: ``cost.plan_model`` (a preset, an anchor or hf:<folder>),
    ``cost.plan_target_from``'s run, each of ``cost.plan_options`` priced in the catalog with its chip's figures,
    the run's batch split over the devices of each option the config names for its own model
    (``cost.planner.batch_split_problem``), and a configured rate's age."""
    catalog = Catalog.from_config(cfg.cost)
    unpriced: list[str] = []
    try:
        catalog.lookup(cfg.cost.accelerator, cfg.cost.pricing, cfg.cost.cloud, cfg.cost.region, cheapest=True)
    except UnpricedError as exc:  # recipe 04 refuses it (check_run_price); a plan only asks for the rate
        unpriced.append(f"cost.accelerator: {exc}")
    if measured_target_run(cfg, run_folder) is None:
        resolve_plan_model(cfg, run_folder)
    if not cfg.cost.plan_options:
        raise ConfigError("config key 'cost.plan_options': give at least one accelerator option")
    for index, option in enumerate(cfg.cost.plan_options):
        key = f"cost.plan_options[{index}]"
        try:
            catalog.priced_rows(option.accelerator, option.pricing, option.cloud, option.region,
                                key=f"{key}.accelerator", cheapest=not option.cloud)
        except UnpricedError as exc:  # a row without a published figure: the plan shows it and asks for a rate
            unpriced.append(f"{key}: {exc}")
        chip = catalog.chip(option.accelerator, key=f"{key}.accelerator")
        # slices planned for this run's batch: the options the config names (the default set is a survey of
        # accelerators), for the run's own model (not cost.plan_model's other shape, nor plan_target_from's run)
        planned = ("cost.plan_options" in cfg.explicit_keys and not cfg.cost.plan_model
                   and not cfg.cost.plan_target_from)
        problem = (batch_split_problem(option.chips * chip.devices_per_chip, cfg.model, cfg.train,
                                       cfg.train.grad_accum_steps) if planned else None)
        if problem:
            raise ConfigError(f"config key '{key}': {option.accelerator} x {option.chips} chips: {problem}")
    if cfg.cost.usd_rub_rate is not None:  # a fetched rate is the planner's to get (it writes a cache file)
        check_age(UsdRubRate(float(cfg.cost.usd_rub_rate), dt.date.fromisoformat(cfg.cost.usd_rub_date), "config"),
                  cfg.cost, dt.date.today())
    return "; ".join(f"no rubles for {line} (the plan shows its hours and asks for the rate)"
                     for line in unpriced) or None
