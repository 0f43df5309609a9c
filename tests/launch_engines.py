"""Recipe 07b's launch files as the engines read them: run with the launch engines' venv (``.venvs/launch``, from
tests/launch-engines.txt; ``RU_LAUNCH_ENGINES`` names another), never imported by the project's tests.

    .venvs/launch/bin/python tests/launch_engines.py sky runs/launch/x/sky_task.yaml xpk runs/launch/x/xpk_workload.sh

Each ``kind path`` pair is loaded by the engine's own code: a SkyPilot task by ``sky.Task.from_yaml`` (its task and
resources schemas, then its ``Resources``), an xpk script's command by xpk's own argument parser (its
``--tpu-type`` choices, its workload-name check); ``$XPK_CLUSTER`` / ``$XPK_PROJECT`` / ``$XPK_ZONE`` read as
placeholders. Prints one JSON object per file, in order: what was read, or ``error``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
from typing import Any

PLACEHOLDERS = {"${XPK_CLUSTER}": "my-cluster", "${XPK_PROJECT}": "my-project", "${XPK_ZONE}": "us-central1-a"}


def read_sky(path: str) -> dict[str, Any]:
    import sky

    try:
        task = sky.Task.from_yaml(path)
    except Exception as exc:  # whatever the loader refuses with is the answer
        return {"error": f"{type(exc).__name__}: {exc}"}
    (resources,) = task.resources
    ((accelerator, count),) = resources.accelerators.items()
    return {"accelerator": accelerator, "count": count, "num_nodes": task.num_nodes, "use_spot": resources.use_spot,
            "job_recovery": resources.job_recovery, "cloud": str(resources.cloud).lower(),
            "region": resources.region, "run": task.run, "setup": task.setup, "envs": dict(task.envs),
            "workdir": task.workdir}


def read_xpk(path: str) -> dict[str, Any]:
    from xpk.parser.core import set_parser

    with open(path, encoding="utf-8") as f:
        line = f.read().rstrip("\n").splitlines()[-1]
    for placeholder, value in PLACEHOLDERS.items():
        line = line.replace(placeholder, value)
    argv = shlex.split(line)
    if argv[:3] != ["xpk", "workload", "create"]:
        return {"error": f"not an xpk workload create command: {argv[:3]}"}
    parser = argparse.ArgumentParser(prog="xpk")
    set_parser(parser)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(argv[1:])
    except SystemExit:
        return {"error": errors.getvalue().strip().splitlines()[-1]}
    return {k: v for k, v in vars(args).items() if isinstance(v, str | int | float | bool | list | type(None))}


def main(argv: list[str]) -> None:
    readers = {"sky": read_sky, "xpk": read_xpk}
    pairs = list(zip(argv[::2], argv[1::2], strict=True))
    print(json.dumps([readers[kind](path) for kind, path in pairs]))


if __name__ == "__main__":
    main(sys.argv[1:])
