"""Bad input ends every recipe with one plain error line, exit code 2, and nothing half-written."""

from __future__ import annotations

import pytest

from tests.recipe_runner import error_line, run_recipe, tiny_config


def assert_clean_failure(proc, pattern: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert line.startswith("error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    import re

    assert re.search(pattern, line), line


def test_misspelled_config_key(tmp_path):
    cfg = tiny_config(tmp_path)
    proc = run_recipe("01_build_corpus.py", cfg, "corpus.min_chrs=5", check=False)
    assert_clean_failure(proc, r"corpus\.min_chrs.*did you mean 'corpus\.min_chars'")
    assert not (tmp_path / "runs" / "tiny" / "corpus" / "manifest.json").exists()


def test_missing_corpus_path(tmp_path):
    cfg = tiny_config(tmp_path, corpus={"sources": [{"kind": "files", "paths": [str(tmp_path / "nowhere" / "*.txt")]}]})
    proc = run_recipe("01_build_corpus.py", cfg, check=False)
    assert_clean_failure(proc, r"nowhere")
    assert not (tmp_path / "runs" / "tiny" / "corpus" / "manifest.json").exists()


def test_empty_corpus(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    latin = tmp_path / "latin.txt"
    latin.write_text("Only English words here, nothing in Cyrillic at all. " * 20, encoding="utf-8")
    cfg = tiny_config(tmp_path, corpus={"sources": [{"kind": "files", "paths": [str(empty), str(latin)]}]})
    proc = run_recipe("01_build_corpus.py", cfg, check=False)
    assert_clean_failure(proc, r"(?i)empty|no document")
    assert not (tmp_path / "runs" / "tiny" / "corpus" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("script", "needs"),
    [
        ("02_train_tokenizer.py", "01_build_corpus.py"),
        ("03_shard.py", "01_build_corpus.py|02_train_tokenizer.py"),
        ("04_pretrain.py", "03_shard.py"),
        ("05_evaluate.py", "04_pretrain.py|03_shard.py|02_train_tokenizer.py"),
    ],
)
def test_missing_earlier_stage_names_the_recipe(tmp_path, script, needs):
    proc = run_recipe(script, tiny_config(tmp_path), check=False)
    assert_clean_failure(proc, rf"run recipes/({needs}) first")
