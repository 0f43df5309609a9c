"""What the bucket-run tests share: a run folder in a bucket holding the prepared stages, a recipe's environment
through a fault proxy, and the comparison of a run's log with a reference run's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiment.files import publish_dir
from experiment.storage import BucketPath, location
from tests.fault_proxy import FaultProxy
from tests.fixture_run import DETERMINISTIC_KEYS
from tests.recipe_runner import in_process_devices, recipe_env


def same_log(records: list[dict[str, Any]], reference: list[dict[str, Any]], steps: int) -> None:
    assert [r["train/step"] for r in records] == list(range(1, steps + 1)), "each step logged once, in order"
    for key in DETERMINISTIC_KEYS:
        assert [r[key] for r in records] == [r[key] for r in reference], key


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def bucket_run(storage_servers: Any, scheme: str, fixture_stages: Path, name: str = "tiny") -> tuple[str, BucketPath]:
    """A fresh bucket's run root, and its run ``name`` holding the prepared stages, uploaded as recipes 01-03 would
    write them."""
    root = f"{storage_servers.new_bucket(scheme)}/runs"
    run = location(root) / name
    assert isinstance(run, BucketPath)
    for stage in ("corpus", "tokenizer", "shards"):
        publish_dir(fixture_stages / "runs" / "tiny" / stage, run / stage)
    return root, run


def through(proxy: FaultProxy, scheme: str, config: Path) -> dict[str, str]:
    """A recipe's environment pointing its storage clients at ``proxy``, with as many devices as the runs of this
    process (the reference runs it is compared with bit for bit)."""
    endpoint_var = "STORAGE_EMULATOR_HOST" if scheme == "gs" else "AWS_ENDPOINT_URL"
    return {**recipe_env(config.parent, devices=in_process_devices()), endpoint_var: proxy.url,
            "TENSORSTORE_GCS_HTTP_URL": proxy.url}
