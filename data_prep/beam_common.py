"""What the corpus and shard Beam pipelines share: importing the optional extra with a clear error."""

from __future__ import annotations

from typing import Any

from experiment.errors import ConfigError


def import_beam(config_key: str) -> Any:
    """``apache_beam``, or a one-line error naming the config key that asked for it."""
    try:
        import apache_beam as beam
    except ImportError as exc:
        raise ConfigError(f"config key '{config_key}': 'beam' needs the beam extra "
                          "(pip install 'ru-pretrain[beam]'; it pins protobuf below 7, so use its own venv)") from exc
    return beam
