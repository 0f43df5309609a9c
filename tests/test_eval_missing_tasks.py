"""A task whose benchmark files are absent stops the eval, or is skipped with its reason when asked."""

from __future__ import annotations

import dataclasses

import pytest

from eval.loaders import SourceUnavailable
from eval.run import load_tasks
from experiment.sections.eval import EvalConfig


def test_missing_task_files_error_by_default(tmp_path):
    cfg = EvalConfig(rublimp_dir=str(tmp_path / "nowhere"), bench_dir=str(tmp_path / "nowhere"))
    with pytest.raises(SourceUnavailable, match=r"task 'rublimp': no source found .*nowhere"):
        load_tasks(["rublimp"], cfg, max_items=5, skipped={})


def test_missing_task_files_skipped_when_configured(tmp_path):
    (tmp_path / "rublimp").mkdir()
    (tmp_path / "rublimp" / "np_agreement_case.csv").write_text(
        "id,source_sentence,target_sentence,source_word,target_word,level,phenomenon,PID,subtype,domain,tree_depth\n"
        "1,Он видел большой дом.,Он видел большого дом.,большой,большого,Morphology,Agreement,np_agreement_case,"
        "np_agreement_case,wiki,2\n", encoding="utf-8")
    cfg = dataclasses.replace(EvalConfig(), rublimp_dir=str(tmp_path / "rublimp"), bench_dir=str(tmp_path / "none"),
                              missing_tasks="skip")
    skipped: dict[str, str] = {}
    loaded = load_tasks(["rublimp", "parus"], cfg, max_items=5, skipped=skipped)
    assert [d.spec.name for d in loaded] == ["rublimp"]
    assert list(skipped) == ["parus"] and "could not be loaded" in skipped["parus"]


def test_a_skipped_task_is_not_retried(tmp_path, monkeypatch):
    import eval.harness as harness

    cfg = dataclasses.replace(EvalConfig(), rublimp_dir=str(tmp_path / "none"), bench_dir=str(tmp_path / "none"),
                              missing_tasks="skip", seed=12345)
    first: dict[str, str] = {}
    load_tasks(["parus"], cfg, max_items=3, skipped=first)
    calls = []
    monkeypatch.setattr(harness, "load_task", lambda *a, **k: calls.append(a))
    again: dict[str, str] = {}
    assert load_tasks(["parus"], cfg, max_items=3, skipped=again) == []
    assert again == first and calls == []
