from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExperimentSection:
    name: str
    run_root: str = "runs"  # the run folder is <run_root>/<name>
    seed: int = 0
    description: str = ""
