"""The tests' compilation cache (tests/recipe_runner.py): kept between sessions in the user's cache folder,
emptied when it outgrows its cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recipe_runner import default_test_xla_cache


def test_the_cache_is_kept_under_its_cap_and_emptied_over_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = default_test_xla_cache(max_bytes=100)
    assert folder == tmp_path / "ru-pretrain" / "xla-tests" and folder.is_dir()
    (folder / "jit_step-abc-cache").write_bytes(b"x" * 100)
    assert default_test_xla_cache(max_bytes=100) == folder and (folder / "jit_step-abc-cache").is_file()
    (folder / "jit_step-def-cache").write_bytes(b"x")
    assert default_test_xla_cache(max_bytes=100) == folder and list(folder.iterdir()) == []

