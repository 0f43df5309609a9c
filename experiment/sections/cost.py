from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass, field
from typing import Literal

from experiment.errors import ConfigError

_STORAGE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")  # a catalog name: lowercase, no spaces or slashes

@dataclass
class InfraItem:
    """An infrastructure row of the catalog billed beside the accelerators (CPU host, disk, egress)."""

    name: str  # a catalog row of kind 'infra', e.g. cpu-host-e2-standard-16
    quantity: float = 1.0  # hosts for 'hour' rows, GB for 'gb-month' and 'gb' rows
    cloud: str = ""
    region: str = ""

    def validate(self, key: str) -> None:
        if self.quantity < 0:
            raise ConfigError(f"config key '{key}.quantity': must be >= 0, got {self.quantity}")


@dataclass
class PlanOption:
    """One accelerator / slice / pricing choice the planner prices."""

    accelerator: str
    chips: int = 8
    pricing: str = "on-demand"
    cloud: str = ""
    region: str = ""
    mfu: float | None = None  # None: cost.plan_mfu

    def validate(self, key: str) -> None:
        if self.chips < 1:
            raise ConfigError(f"config key '{key}.chips': must be >= 1, got {self.chips}")
        if self.mfu is not None and not 0 < self.mfu <= 1:
            raise ConfigError(f"config key '{key}.mfu': must be in (0, 1], got {self.mfu}")


# Russia's VAT (НДС) since 2026-01-01: Cloud.ru's tariff tables in force from that day state "НДС* (22%)"
# (https://cloud.ru/documents/tariffs/evolution/evolution-notebooks, version 260101)
RUSSIAN_VAT_RATE = 0.22


@dataclass
class ContractRate:
    """A team's own price for one chip-hour (a contract, a quote, a Capacity Block) in the currency it is billed in.

    ``vat``: ``included`` when the figure is what the invoice says per chip-hour (a Russian provider's price "с НДС",
    or a foreign cloud that charges no Russian VAT); ``added`` when it is a price before VAT ("без НДС"), to which
    ``cost.vat_rate`` is added."""

    price: float
    currency: Literal["RUB", "USD"] = "USD"
    vat: Literal["included", "added"] = "included"

    def validate(self, key: str) -> None:
        if not math.isfinite(self.price) or self.price <= 0:
            raise ConfigError(f"config key '{key}.price': must be a finite positive number of {self.currency} per "
                              f"chip-hour, got {self.price!r}")


def _seed_plan_options() -> list[PlanOption]:
    # The comparison set the project was started for, on demand and on spot: three TPU generations, three NVIDIA
    # GPUs (each at the cheapest cloud that sells it), Trainium 1 and 2 (Trainium2 has no spot price anywhere we
    # read; its on-demand figure is a third party's, and the plan says so). TPU7x has no public price: give
    # cost.contract_rates and add it.
    options = []
    for accelerator, chips in (("tpu-v5e", 8), ("tpu-v5p", 8), ("tpu-v6e", 8), ("nvidia-h100", 8),
                               ("nvidia-h200", 8), ("nvidia-b200", 8), ("aws-trainium1", 16)):
        options += [PlanOption(accelerator, chips, "on-demand"), PlanOption(accelerator, chips, "spot")]
    return [*options, PlanOption("aws-trainium2", 16, "on-demand")]


@dataclass
class CostConfig:
    accelerator: str = "cpu-e2-standard-2"  # a row of cost/catalog.csv (or of catalog_path)
    cloud: str = ""  # empty: the only cloud that sells this accelerator at this pricing
    region: str = ""
    pricing: str = "on-demand"  # on-demand, spot, 1y, 3y
    chips: int = 1
    catalog_path: str = ""  # a user price catalog (CSV, same columns) that extends or overrides the bundled one
    hardware_path: str = ""  # a user hardware catalog (CSV) that extends or overrides cost/hardware.csv
    infrastructure: list[InfraItem] = field(default_factory=list)
    # your own price per chip-hour for an accelerator (a contract, a Capacity Block, a quote): used instead of the
    # catalog's price by the ledger and the planner, and named as the figure used. A number is USD as billed
    # ({aws-trainium2: 2.1}); a mapping gives the currency and whether the figure includes VAT, e.g.
    # {nvidia-a100: {price: 450, currency: RUB, vat: added}}: rubles are then priced as rubles (never through USD)
    contract_rates: dict[str, float | ContractRate] = field(default_factory=dict)
    # VAT added to a price given before VAT (a contract rate or catalog row with vat: added); Russia's rate by default
    vat_rate: float = RUSSIAN_VAT_RATE
    usd_rub_rate: float | None = None  # None: fetch the Bank of Russia rate (cache / offline fallback)
    usd_rub_date: str = ""  # YYYY-MM-DD of the rate
    max_rate_age_days: int = 30
    stale_rate: Literal["warn", "error"] = "warn"
    fetch_rate: bool = True  # allow a short request to cbr.ru when no rate is configured
    fetch_timeout_s: float = 3.0
    rate_cache_dir: str = "${XDG_CACHE_HOME:-~/.cache}/ru-pretrain/cbr"
    token_budget: int | None = None  # tokens planned for the run, for the projection
    flush_seconds: float = 5.0  # the ledger is fsynced at least this often
    # the time from a preempted or crashed session to the session that resumes it, booked as idle (cost/README.md):
    # held = the slice stays yours and bills at the session's hourly rate (an on-demand or committed VM left
    # standing), released = it was given back and bills nothing (a spot VM or queued resource taken away); auto =
    # released for spot pricing, held otherwise
    between_sessions: Literal["auto", "held", "released"] = "auto"
    # where the run's data lives, priced as object storage (cost/storage.py): a storage class of the catalog (rows of
    # kind storage: gcs-standard, s3-standard, or a user catalog's, e.g. a Russian provider's in rubles), "none", or
    # "auto": by experiment.run_root, a gs:// bucket is gcs-standard, an s3:// bucket on AWS s3-standard, a bucket at
    # another S3-compatible endpoint asks for its class by name (unpriced, with a warning), a local folder is none
    # (the planner: the option's own cloud's class, where a run on it would keep its data)
    storage: str = "auto"
    storage_region: str = ""  # the storage class's region, when its rows name several
    # planner (recipe 07)
    # a model preset, an anchor shape (llama3.1-8b), or a Hugging Face config.json: hf:<folder or file>
    # (hf:Qwen3-1.7B and hf:Llama-3.2-1B are shipped in cost/hf_configs/); empty: the experiment's model
    plan_model: str = ""
    # the vocabulary a preset is planned at; 0: our tokenizer's (recipe 02's, else tokenizer.vocab_size). A Hugging
    # Face config.json and an anchor bring their own
    plan_vocab_size: int = 0
    # 0: cost.token_budget, else train.steps x batch x model.max_seq_len. The planned length is the
    # planned model's: model.max_seq_len, a preset's own, or an anchor's from cost/anchors.csv
    plan_tokens: int = 0
    plan_mfu: float = 0.4
    plan_mfu_from_anchors: bool = True  # a measured or published MFU (cost/anchors.csv) beats plan_mfu
    # an anchor lends its MFU to plans of models within this factor of its parameter count (same vendor's hardware)
    plan_anchor_size_ratio: float = 4.0
    plan_options: list[PlanOption] = field(default_factory=_seed_plan_options)
    # compare (recipe 06)
    compare_experiments: list[str] = field(default_factory=list)  # more experiments under the same run_root
    loss_metric: str = "train/loss"
    eval_metric: str = ""  # summary key of the eval score; empty: eval/<first eval task>/acc, else any eval/*/acc
    # rubles to reach a quality (recipes 06, 07; needs eval during training, train.eval_every): validation bits
    # per byte (eval/val_bpb) at most target_bpb, or target_metric (empty: eval_metric's) at least target_score
    target_bpb: float | None = None
    target_score: float | None = None
    target_metric: str = ""
    # recipe 07: project this experiment's measured tokens-to-target (a run under the same run_root) onto each
    # plan option; its model is the one planned
    plan_target_from: str = ""

    def validate(self, key: str) -> None:
        prefix = f"{key}." if key else ""
        if self.chips < 1:
            raise ConfigError(f"config key '{prefix}chips': must be >= 1, got {self.chips}")
        if self.usd_rub_rate is not None:
            if self.usd_rub_rate <= 0:
                raise ConfigError(f"config key '{prefix}usd_rub_rate': must be > 0, got {self.usd_rub_rate}")
            if not self.usd_rub_date:
                raise ConfigError(f"config key '{prefix}usd_rub_date': a configured usd_rub_rate needs its date "
                                  "(YYYY-MM-DD) so its age can be checked")
        if self.usd_rub_date:
            try:
                dt.date.fromisoformat(self.usd_rub_date)
            except ValueError as exc:
                raise ConfigError(f"config key '{prefix}usd_rub_date': {self.usd_rub_date!r} is not a "
                                  "YYYY-MM-DD date") from exc
        for name, rate in self.contract_rates.items():
            if isinstance(rate, ContractRate):
                continue  # validated when it was built
            if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not math.isfinite(rate) or rate <= 0:
                raise ConfigError(f"config key '{prefix}contract_rates.{name}': must be a finite positive number "
                                  "of USD per chip-hour (or {price: <per chip-hour>, currency: RUB, vat: included}), "
                                  f"got {rate!r}")
        if not 0 <= self.vat_rate < 1:
            raise ConfigError(f"config key '{prefix}vat_rate': a share of the price in [0, 1) (0.22: 22%), got "
                              f"{self.vat_rate}")
        if self.max_rate_age_days < 0:
            raise ConfigError(f"config key '{prefix}max_rate_age_days': must be >= 0")
        if self.fetch_timeout_s <= 0 or self.fetch_timeout_s > 60:
            raise ConfigError(f"config key '{prefix}fetch_timeout_s': must be in (0, 60] seconds")
        if self.flush_seconds <= 0:
            raise ConfigError(f"config key '{prefix}flush_seconds': must be > 0")
        if not _STORAGE_NAME.fullmatch(self.storage):
            raise ConfigError(f"config key '{prefix}storage': {self.storage!r} is not a storage class name: 'auto' (by "
                              "experiment.run_root), 'none', or a catalog row of kind storage such as gcs-standard")
        if self.storage_region and self.storage == "none":
            raise ConfigError(f"config key '{prefix}storage_region': set with cost.storage: none, which prices nothing")
        if self.token_budget is not None and self.token_budget <= 0:
            raise ConfigError(f"config key '{prefix}token_budget': must be > 0")
        if not 0 < self.plan_mfu <= 1:
            raise ConfigError(f"config key '{prefix}plan_mfu': must be in (0, 1], got {self.plan_mfu}")
        if self.target_bpb is not None and self.target_bpb <= 0:
            raise ConfigError(f"config key '{prefix}target_bpb': must be > 0 bits per byte, got {self.target_bpb}")
        if self.target_bpb is not None and self.target_score is not None:
            raise ConfigError(f"config key '{prefix}target_score': set one target, target_bpb or target_score")
        if self.plan_target_from and self.target_bpb is None and self.target_score is None:
            raise ConfigError(f"config key '{prefix}plan_target_from': needs a target (cost.target_bpb or "
                              "cost.target_score) to project")
        if not self.plan_anchor_size_ratio >= 1:
            raise ConfigError(f"config key '{prefix}plan_anchor_size_ratio': must be >= 1, got "
                              f"{self.plan_anchor_size_ratio}")
        if self.plan_tokens < 0:
            raise ConfigError(f"config key '{prefix}plan_tokens': must be >= 0")
        if self.plan_vocab_size < 0:
            raise ConfigError(f"config key '{prefix}plan_vocab_size': must be >= 0 (0: our tokenizer's vocabulary)")
