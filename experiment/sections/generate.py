"""The ``generate:`` section: recipe 09's prompts, sampling and which model it continues them with."""

from __future__ import annotations

from dataclasses import dataclass, field

from experiment.errors import ConfigError
from experiment.storage.urls import check_location


@dataclass
class GenerateConfig:
    # the prompts, in order; prompt_file's lines (one prompt per line, blank lines skipped) come after them
    prompts: list[str] = field(default_factory=lambda: ["Москва — столица", "Однажды утром"])
    prompt_file: str = ""
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # sample among the k most likely tokens only; 0: all
    top_p: float = 1.0  # sample among the most likely tokens whose probability reaches top_p; 1: all
    seed: int = 0  # the sampling's random draws: the same seed gives the same completions
    checkpoint_step: int | None = None  # None: the run's latest checkpoint
    # a Hugging Face model folder to generate with instead of the run's checkpoints (and its own tokenizer.json or
    # tokenizer.model)
    hf_model: str = ""
    stop: list[str] = field(default_factory=list)  # a completion is cut before the first of these strings

    def validate(self, key: str) -> None:
        prefix = f"{key}." if key else ""
        check_location(self.prompt_file, f"{prefix}prompt_file")
        check_location(self.hf_model, f"{prefix}hf_model")
        if not self.prompts and not self.prompt_file:
            raise ConfigError(f"config key '{prefix}prompts': no prompts (prompts and prompt_file are both empty)")
        if self.max_new_tokens <= 0:
            raise ConfigError(f"config key '{prefix}max_new_tokens': must be positive, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"config key '{prefix}temperature': must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"config key '{prefix}top_k': must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"config key '{prefix}top_p': must be in (0, 1], got {self.top_p}")
        if self.checkpoint_step is not None and self.checkpoint_step < 0:
            raise ConfigError(f"config key '{prefix}checkpoint_step': must be >= 0, got {self.checkpoint_step}")
        if any(not s for s in self.stop):
            raise ConfigError(f"config key '{prefix}stop': an empty stop string would cut every completion at once")
