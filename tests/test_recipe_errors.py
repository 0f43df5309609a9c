"""Bad input ends every recipe with one plain error line, exit code 2, and nothing half-written."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests.recipe_runner import error_line, run_recipe, tiny_config

pytestmark = pytest.mark.integration  # every test runs a recipe or another process

FIXTURE_TEXTS = Path(__file__).parent / "fixtures" / "corpus"
NOWHERE = Path("/nonexistent-path-for-full-disk-tests")


def run_recipe_on_full_disk(script: str, config: Path, *overrides: str, fsync_full: Path = NOWHERE,
                            usage_full: Path = NOWHERE) -> subprocess.CompletedProcess[str]:
    """``run_recipe`` (here, unchecked) as if a disk were full: fsync of a file under ``fsync_full`` fails with
    ENOSPC (where a full disk shows for buffered writes), shutil.disk_usage reports 1000 bytes free under
    ``usage_full``. (tests/test_checkpoint_integrity.py fills the checkpoints' disk with it too.)"""
    fsync_prefix, usage_prefix = str(fsync_full.resolve()), str(usage_full.resolve())
    real_fsync, real_usage = os.fsync, shutil.disk_usage

    def fsync(fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        if os.readlink(f"/proc/self/fd/{fd}").startswith(fsync_prefix):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    def disk_usage(path: Any) -> Any:
        usage = real_usage(path)
        return usage._replace(free=1000) if os.path.abspath(path).startswith(usage_prefix) else usage

    with mock.patch("os.fsync", fsync), mock.patch("shutil.disk_usage", disk_usage):
        return run_recipe(script, config, *overrides, check=False)


def assert_clean_failure(proc, pattern: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert line.startswith("error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
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


def test_full_disk_is_one_line_naming_the_file_and_the_free_space(tmp_path):
    cfg = tiny_config(tmp_path, corpus={"sources": [{"kind": "files", "paths": [str(FIXTURE_TEXTS / "ru_*.txt")]}]})
    corpus_dir = tmp_path / "runs" / "tiny" / "corpus"
    proc = run_recipe_on_full_disk("01_build_corpus.py", cfg, fsync_full=corpus_dir, usage_full=corpus_dir)
    assert_clean_failure(proc, rf"^error: cannot write {re.escape(str(corpus_dir))}/docs-\d+\.jsonl: No space left on "
                               r"device \(1000 bytes free on that disk\): free some space and rerun the same command$")
    assert sorted(p.name for p in corpus_dir.iterdir()) == [], "no manifest, no half-written file"
    run_recipe("01_build_corpus.py", cfg)
    assert (corpus_dir / "manifest.json").is_file()


def test_full_disk_while_sharding_is_one_line_and_leaves_no_manifest(fixture_stages, tmp_path):
    """Recipe 03 on a full disk: one line naming the shard file and the free space; no shards manifest, so
    recipe 04 refuses the half-written folder; a rerun with space writes the stage."""
    from tests.fixture_run import run_copy

    cfg = run_copy(fixture_stages, tmp_path)
    shards_dir = tmp_path / "runs" / "tiny" / "shards"
    shutil.rmtree(shards_dir)
    proc = run_recipe_on_full_disk("03_shard.py", cfg, fsync_full=shards_dir, usage_full=shards_dir)
    assert_clean_failure(proc, rf"^error: cannot write {re.escape(str(shards_dir))}/\S+: No space left on device "
                               r"\(1000 bytes free on that disk\): free some space and rerun the same command$")
    assert not (shards_dir / "manifest.json").exists()
    run_recipe("03_shard.py", cfg)
    assert (shards_dir / "manifest.json").is_file()
