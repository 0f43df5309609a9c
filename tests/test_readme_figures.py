"""The figures README.md, docs/guide.md and eval/README.md quote come from ``tools/readme_figures.py`` alone.

Each marked block is exactly what the figures it records render to (a figure edited by hand in the text
fails); a demo-like run that this test makes gives figures with the same fields, whose values agree with what
the run's config and its own files say; where the run folder a block names is on disk and is the recorded run,
reading it again gives the recorded figures; the test counts are what pytest collects now; and the JUnit
reports the times come from are read as pytest writes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tools.readme_figures import (
    DEMO,
    DEMO_EVAL,
    FILES,
    SWEEP,
    TESTS,
    block,
    collected_tests,
    demo_eval_figures,
    demo_figures,
    find_block,
    junit_figures,
    render_demo,
    replace_block,
    sweep_figures,
)

REPO = Path(__file__).resolve().parents[1]
REWRITE = "make readme-figures"
STEPS, EVERY, KEEP = 12, 4, 2  # the tiny run: checkpoints at 4, 8 and 12, the last two kept


def keys_of(figures: Any) -> Any:
    """The shape of a figures record: its keys, nested (a list of records by its first one), not its values."""
    if isinstance(figures, dict):
        return {k: keys_of(v) for k, v in figures.items()}
    if isinstance(figures, list) and figures and isinstance(figures[0], dict):
        return [keys_of(figures[0])]
    return None


def recorded(name: str) -> tuple[dict[str, Any], str]:
    found = find_block((REPO / FILES[name]).read_text(encoding="utf-8"), name)
    assert found is not None, f"{FILES[name]} has no <!-- {name}: ... --> block"
    return found


@pytest.mark.parametrize("name", [DEMO, SWEEP, DEMO_EVAL, TESTS])
def test_each_readme_block_is_what_its_recorded_figures_render_to(name: str) -> None:
    figures, written = recorded(name)
    assert written == block(name, figures), f"{FILES[name]}'s {name} block was edited by hand: {REWRITE}"


@pytest.mark.parametrize("name", [DEMO, SWEEP, DEMO_EVAL])
def test_the_readme_figures_match_the_run_folder_they_name(name: str) -> None:
    figures, _ = recorded(name)
    folder = REPO / "runs" / figures["folder"]
    if name in (DEMO, DEMO_EVAL):
        if not (folder / "eval" / "manifest.json").is_file():
            pytest.skip(f"no demo run in {folder} (make demo) to check {FILES[name]}'s figures against")
        again = (demo_figures if name == DEMO else demo_eval_figures)(folder)
        if again["train_run"] != figures["train_run"]:
            pytest.skip(f"{folder} holds run {again['train_run']}, {FILES[name]}'s figures are run "
                        f"{figures['train_run']}'s: {REWRITE} quotes this one")
    else:
        if not (folder / "reports" / "costs.csv").is_file():
            pytest.skip(f"no sweep in {folder} (make demo-sweep) to check {FILES[name]}'s figures against")
        again = sweep_figures(folder)
        runs = [[v["run"] for v in f["variants"]] for f in (again, figures)]
        if runs[0] != runs[1]:
            pytest.skip(f"{folder} holds runs {runs[0]}, "
                        f"{FILES[name]}'s figures are runs {runs[1]}'s: {REWRITE} quotes these")
    assert again == figures


@pytest.fixture(scope="module")
def tiny_demo(fixture_stages: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """Recipes 03-07 on the fixture data (01-02 copied), as ``make demo`` runs them; returns the run folder and
    the seconds the recipes took (measured here, around them)."""
    from tests.fixture_run import fixture_config, run_copy
    from tests.recipe_runner import run_recipe

    root = tmp_path_factory.mktemp("readme-figures")
    started = time.time()  # recipe 03 is the first to stamp this run folder's configs/
    run_recipe("03_shard.py", run_copy(fixture_stages, root, shards={"validation_percent": 40.0}))
    config = fixture_config(root, shards={"validation_percent": 40.0},
                            train={"steps": STEPS, "checkpoint_every": EVERY, "keep_checkpoints": KEEP,
                                   "warmup_steps": 1},
                            eval={"tasks": ["rublimp"], "train_tasks": [], "max_items_per_task": 20,
                                  "max_validation_batches": 2, "missing_tasks": "skip"})
    for script in ("04_pretrain.py", "05_evaluate.py", "06_compare_costs.py", "07_plan_costs.py"):
        run_recipe(script, config)
    return root / "runs" / "tiny", time.time() - started


@pytest.mark.integration
def test_a_demo_like_run_gives_the_fields_readme_records(tiny_demo: tuple[Path, float]) -> None:
    folder, seconds = tiny_demo
    figures = demo_figures(folder)
    shared_data = figures["rublimp"] is not None  # RuBLiMP is read from the shared data, else skipped
    readme = recorded(DEMO)[0]
    assert keys_of(figures) == (keys_of(readme) if shared_data else {**keys_of(readme), "rublimp": None})

    assert figures["checkpoints_kept"] == list(range(EVERY, STEPS + 1, EVERY))[-KEEP:]
    assert figures["steps"] == figures["loss_last"][0] == STEPS
    # recipes 03-07 (01-02 copied): the start stamp is floored to a whole second (up to 1 s early) and the figure
    # rounded to whole seconds (up to 0.5 s more)
    assert 0 < figures["wall_seconds"] <= seconds + 1.5
    results = json.loads((folder / "eval" / "step_0000012.json").read_text(encoding="utf-8"))
    assert figures["val_bpb"] == results["validation"]["bits_per_byte"]
    text = " ".join(render_demo(figures).split())  # the rendering wraps its lines
    if shared_data:
        rublimp = results["tasks"]["rublimp"]
        assert figures["rublimp"]["random_init"] == rublimp["random_init"]["metrics"]["acc"]["value"]
        assert figures["rublimp"]["acc"] == rublimp["metrics"]["acc"]["value"]
        assert f"step-0 weights ({figures['rublimp']['random_init']:.3f})" in text
    assert f"{KEEP} checkpoints kept (steps {STEPS - EVERY}, {STEPS})" in text
    # the corpus size as recipe 01's report quotes it (the kept text; the manifest's bytes are the shard files')
    size = f"({figures['corpus_bytes'] / 1e6:.1f} MB of text)"
    assert size in text and size in (folder / "corpus" / "report.md").read_text(encoding="utf-8")

    scores = demo_eval_figures(folder)
    want = recorded(DEMO_EVAL)[0]
    assert set(scores) == set(want)
    if shared_data:
        assert keys_of(scores["tasks"]) == keys_of(want["tasks"])
        (task,) = scores["tasks"]
        assert task["task"] == "rublimp" and task["verdict"] == rublimp["vs_strongest_baseline"]["verdict"]
        assert sum(scores["rublimp_groups"].values()) == len(rublimp["groups"])

    # the block round-trips through a README: written, found, the same figures back
    text = "before\n" + block(DEMO, readme) + "\nafter\n"
    rewritten = replace_block(text, DEMO, figures)
    assert rewritten.startswith("before\n") and rewritten.endswith("\nafter\n")
    assert find_block(rewritten, DEMO) == (json.loads(json.dumps(figures)), block(DEMO, figures))


@pytest.mark.integration
def test_the_recorded_test_counts_are_what_pytest_collects_now() -> None:
    counts = recorded(TESTS)[0]["collected"]
    base, unit = collected_tests(), collected_tests("not integration")
    assert (counts["base"], counts["unit"]) == (base, unit), f"a test was added or removed since: {REWRITE}"
    assert counts["integration"] == base - unit


@pytest.mark.integration
def test_the_times_are_read_from_the_junit_report_pytest_writes(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "import pytest, time\n"
        "def test_ok():\n    time.sleep(1.2)\n"
        "def test_ok_too():\n    pass\n"
        "def test_bad():\n    assert False\n"
        "def test_skipped():\n    pytest.skip('no')\n", encoding="utf-8")
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "/dev/null", "-n", "2",
                    f"--junitxml={report}", str(tmp_path / "test_sample.py")], cwd=tmp_path, capture_output=True)
    figures = junit_figures(report)
    assert (figures["passed"], figures["failed"], figures["skipped"]) == (2, 1, 1)
    assert figures["seconds"] >= 1  # the session's wall time, the sleep included
