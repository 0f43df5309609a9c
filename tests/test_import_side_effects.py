"""No module of a package changes process state when it is imported.

A fresh interpreter (tests/import_probe.py) imports the third-party modules first, records the
logging handlers and filters (root and named loggers, absl's included), the sys/threading hooks,
warnings filters, signal handlers, the environment, JAX's config and more, imports every module of
every package, and reports each difference. Process-wide settings belong in functions a program
calls at start-up (``tracking.harness.setup_logging`` installs ``tracking.process_hooks``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from experiment.layers import PACKAGE_LAYERS

pytestmark = pytest.mark.integration  # every test runs a recipe or another process

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "import_probe.py"
PACKAGES = [p for p in PACKAGE_LAYERS if p != "recipes"]  # recipes are scripts: importing one runs nothing,
# but they are not a package (their names start with digits)


def probe(root: Path, packages: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(PROBE), str(root), *packages], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_importing_every_module_of_every_package_changes_no_process_state() -> None:
    result = probe(REPO, PACKAGES)
    assert result["failed"] == {}
    assert len(result["modules"]) > 100 and "trainer.checkpoint" in result["modules"]
    assert set(result["stubbed"]) <= {"lm_eval"}  # optional extras only; the module importing them is still checked
    assert result["changes"] == []


# What the probe must catch: one module per kind of import-time effect, the first one the hook that
# trainer/checkpoint.py once installed on import.
EFFECTS = {
    "unraisablehook": ("import sys\nprevious = sys.unraisablehook\n"
                       "sys.unraisablehook = lambda u: previous(u)\n", "sys.unraisablehook"),
    "absl_filter": ("import logging\nlogging.getLogger('absl').addFilter(logging.Filter('x'))\n", "logger absl"),
    "basic_config": ("import logging\nlogging.basicConfig(level=logging.INFO)\n", "logger <root>"),
    "named_logger_level": ("import logging\nlogging.getLogger('orbax').setLevel(logging.ERROR)\n", "logger orbax"),
    "excepthook": ("import sys\nsys.excepthook = lambda *a: None\n", "sys.excepthook"),
    "warnings_filter": ("import warnings\nwarnings.filterwarnings('ignore', category=DeprecationWarning)\n",
                        "warnings.filters"),
    "signal_handler": ("import signal\nsignal.signal(signal.SIGTERM, lambda *a: None)\n", f"signal {15}"),
    # a name no test sets (the probe's interpreter inherits this process's environment: a variable an earlier
    # test left set, e.g. the fit check's TPU_SKIP_MDS_QUERY, would show no change)
    "environment": ("import os\nos.environ['RU_IMPORT_PROBE_PLANTED'] = '1'\n", "os.environ[RU_IMPORT_PROBE_PLANTED]"),
    "jax_config": ("import jax\njax.config.update('jax_debug_nans', True)\n", "jax.config[jax_debug_nans]"),
}


def fake_package(root: Path, effect_code: str | None) -> None:
    package = root / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "clean.py").write_text(textwrap.dedent("""
        import logging
        log = logging.getLogger("fakepkg.clean")  # a plain logger: not a change
    """), encoding="utf-8")
    if effect_code is not None:
        (package / "effect.py").write_text(effect_code, encoding="utf-8")


@pytest.mark.parametrize("effect", sorted(EFFECTS))
def test_the_probe_catches_each_kind_of_import_time_effect(tmp_path: Path, effect: str) -> None:
    code, reported = EFFECTS[effect]
    fake_package(tmp_path, code)
    result = probe(tmp_path, ["fakepkg"])
    assert result["failed"] == {}
    assert any(change.startswith(reported) for change in result["changes"]), result["changes"]


def test_the_probe_reports_nothing_for_a_clean_package(tmp_path: Path) -> None:
    fake_package(tmp_path, None)
    result = probe(tmp_path, ["fakepkg"])
    assert result["modules"] == ["fakepkg", "fakepkg.clean"] and result["changes"] == []
