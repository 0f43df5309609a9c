from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class WandbConfig:
    project: str = "ru-pretrain"
    entity: str = ""
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"  # auto: offline without an API key
    tags: list[str] | None = None
