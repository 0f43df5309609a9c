"""What the corpus and shard Beam pipelines share: importing the optional extra with a clear error,
and reading back the small summary records the workers staged for the driver."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from experiment.errors import ConfigError, DataError

_WORKER_ERROR = re.compile(r"\b(DataError|ConfigError): (.+)")


def import_beam(config_key: str) -> Any:
    """``apache_beam``, or a one-line error naming the config key that asked for it."""
    try:
        import apache_beam as beam
    except ImportError as exc:
        raise ConfigError(f"config key '{config_key}': 'beam' needs the beam extra "
                          "(pip install 'ru-pretrain[beam]'; it pins protobuf below 7, so use its own venv)") from exc
    return beam


def read_staged_json(pattern: str) -> list[Any]:
    """Every JSON line of the files matching ``pattern`` (local or a Beam filesystem such as gs://).

    Only summaries are staged this way (one line per shard, one for the counts): the driver's memory
    and disk stay independent of the corpus size.
    """
    from apache_beam.io.filesystems import FileSystems

    rows: list[Any] = []
    for match in FileSystems.match([pattern])[0].metadata_list:
        with FileSystems.open(match.path) as handle:
            rows.extend(json.loads(line) for line in handle.read().decode("utf-8").splitlines() if line.strip())
    return rows


def run_pipeline(beam: Any, options: list[str], build: Callable[[Any], None]) -> None:
    """Build and run a pipeline; a DataError/ConfigError raised on a worker comes back as that error,
    one line (runners wrap worker exceptions in their own, with the remote traceback as text)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    try:
        with beam.Pipeline(options=PipelineOptions(options or ["--runner=DirectRunner"])) as pipeline:
            build(pipeline)
    except (DataError, ConfigError) as exc:  # in-process runners re-raise it with the step's name appended
        raise type(exc)(_without_step(str(exc))) from exc
    except Exception as exc:
        found = _WORKER_ERROR.search(str(exc))
        if found is None:
            raise
        kind = DataError if found.group(1) == "DataError" else ConfigError
        raise kind(_without_step(found.group(2))) from exc


def _without_step(message: str) -> str:
    return re.sub(r"\s*\[while running .*$", "", message.strip().splitlines()[0]).strip()
