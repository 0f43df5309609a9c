from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CostConfig:
    accelerator: str = "cpu-e2-standard-2"  # a row of cost/catalog.csv (or of catalog_path)
    cloud: str = ""
    region: str = ""
    pricing: str = "on-demand"
    chips: int = 1
    catalog_path: str = ""  # a user catalog that extends or overrides the bundled one
    usd_rub_rate: float | None = None
    usd_rub_date: str = ""  # YYYY-MM-DD of the rate
    max_rate_age_days: int = 30
    token_budget: int | None = None  # tokens planned for the run, for the projection
