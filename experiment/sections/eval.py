from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EvalConfig:
    checkpoint_step: int | None = None  # None: the latest checkpoint
    batch_size: int = 16
    max_validation_batches: int | None = None
    tasks: list[str] = field(default_factory=lambda: ["rublimp"])
    rublimp_dir: str = "${RU_SHARED_DATA:-../shared/data}/bench/rublimp"
    max_items_per_task: int | None = None
