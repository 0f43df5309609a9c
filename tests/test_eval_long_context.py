"""Evaluation at length: the passkey retrieval's generator and scorer (eval/passkey.py), bits per byte by position
bucket (eval/bpb.py), and recipe 05 running both on the fixture run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from data_prep.shards.packing import Packer
from eval.bpb import bucket_spans, position_bucket_bpb, stream_documents
from eval.passkey import (
    NEEDLE,
    QUESTION,
    answer_tokens,
    context_lengths,
    evaluate_passkey,
    filler_sentences,
    key_credit,
    make_items,
)
from eval.report import render_markdown
from experiment.errors import ConfigError, DataError
from experiment.sections.eval import EvalConfig, PasskeyConfig

FIXTURE_TEXTS = Path(__file__).parent / "fixtures" / "corpus"
EOS = 0


def byte_encode(text: str) -> list[int]:
    """A byte-level tokenizer as the prompt codec reads it: EOS first, then one id per UTF-8 byte."""
    return [EOS, *text.encode("utf-8")]


def fixture_sentences() -> list[str]:
    return filler_sentences(path.read_text(encoding="utf-8") for path in sorted(FIXTURE_TEXTS.glob("ru_*.txt")))


def items(seed: int = 0, **settings: object) -> list:
    cfg = PasskeyConfig(**{"lengths": [600, 2000], "depths": [0.0, 0.5, 1.0], "items_per_depth": 3, **settings})
    return make_items(fixture_sentences(), byte_encode, cfg, max_len=4096, seed=seed)


def test_filler_has_no_digits_and_one_sentence_a_line() -> None:
    sentences = filler_sentences(["Было 5 яблок. Солнце село за лесом, и стало тихо.\nПотом\nпошёл дождь над рекой."])
    assert sentences == ["Солнце село за лесом, и стало тихо.", "Потом пошёл дождь над рекой."]


def test_items_are_the_same_for_a_seed_and_differ_across_seeds() -> None:
    first, again, other = items(seed=3), items(seed=3), items(seed=4)
    assert first == again
    assert len(first) == 2 * 3 * 3 and len({item.id for item in first}) == len(first)
    assert [item.key for item in first] != [item.key for item in other]
    assert all(re.fullmatch(r"\d{5}", item.key) for item in first)
    assert [len(item.key) for item in items(digits=7)] == [7] * 18


def test_the_key_sits_at_the_requested_depth() -> None:
    for item in items():
        needle = NEEDLE.format(key=item.key)
        assert item.prompt.count(item.key) == 1 and item.prompt.endswith(QUESTION)
        filler = item.prompt[:-len(QUESTION)].replace(needle, "")
        before = item.prompt.index(needle)
        # the share of filler characters before the key: the depth, within one sentence either way
        longest = max(len(s) for s in fixture_sentences()) + 1
        assert abs(before - item.depth * len(filler)) <= longest, (item.id, before, len(filler))
        assert item.needle_sentence == round(item.depth * item.filler_sentences)
        if item.depth == 0.0:
            assert item.prompt.startswith(needle)
        if item.depth == 1.0:
            assert item.prompt.endswith(needle + QUESTION)


def test_each_prompt_fits_its_length_with_the_answer_and_fills_it() -> None:
    longest = max(len(byte_encode(s)) for s in fixture_sentences())
    for item in items():
        tokens = len(byte_encode(item.prompt))
        assert item.tokens == tokens
        assert tokens + answer_tokens(5) <= item.length  # EOS (counted in tokens), prompt and answer
        assert tokens + answer_tokens(5) > item.length - longest  # one more sentence would not have fit
        assert item.filler_sentences > 0


def test_lengths_are_capped_at_the_context() -> None:
    assert context_lengths([4096, 8192, 131072], 8192) == [4096, 8192]
    assert context_lengths([4096, 8192], 64) == [64]
    cfg = PasskeyConfig(lengths=[4096, 131072], depths=[0.5], items_per_depth=1)
    assert [item.length for item in make_items(fixture_sentences(), byte_encode, cfg, max_len=1000, seed=0)] == [1000]


def test_a_context_too_short_for_the_key_and_question_is_one_line() -> None:
    cfg = PasskeyConfig(lengths=[30], depths=[0.5], items_per_depth=1)
    with pytest.raises(DataError, match=r"^eval\.passkey: the key and the question take \d+ tokens, a 30-token"):
        make_items(fixture_sentences(), byte_encode, cfg, max_len=4096, seed=0)
    with pytest.raises(DataError, match="no filler sentences"):
        make_items(filler_sentences(["1 2 3. 4 5 6."]), byte_encode, cfg, max_len=4096, seed=0)


@pytest.mark.parametrize(("completion", "credit"), [
    (" 12345\n", (1.0, 1.0)), ("12345", (1.0, 1.0)), (" 12346", (0.0, 0.8)), (" 123456", (0.0, 1.0)),
    (" 02345.", (0.0, 0.8)), (" пароль 12345", (0.0, 0.0)), ("", (0.0, 0.0)), (" 1 2345", (0.0, 0.2)),
])
def test_the_scorer_reads_the_leading_digits(completion: str, credit: tuple[float, float]) -> None:
    assert key_credit("12345", completion) == credit


def test_passkey_results_against_chance_per_length_and_depth() -> None:
    made = items()
    cfg = PasskeyConfig(lengths=[600, 2000], depths=[0.0, 0.5, 1.0], items_per_depth=3)

    def finds_the_key(prompts: list[str], max_new_tokens: int, stop: tuple[str, ...]) -> list[str]:
        assert max_new_tokens == answer_tokens(5) and stop == ("\n",)
        return [" " + re.search(r"пароль: (\d+)\.", p).group(1) for p in prompts]

    def says_zeros(prompts: list[str], max_new_tokens: int, stop: tuple[str, ...]) -> list[str]:
        return [" 00000"] * len(prompts)

    found = evaluate_passkey(made, finds_the_key, cfg, seed=0, source="fixture", batch_size=4)
    assert found["items"] == 18 and found["seed"] == 0 and found["lengths"] == [600, 2000]
    exact = found["metrics"]["exact_match"]
    assert exact["value"] == 1.0 and exact["chance"] == 1e-5 and exact["n"] == 18
    assert found["metrics"]["digit_acc"]["chance"] == 0.1
    assert found["baselines"]["strongest"] == "chance" and found["vs_strongest_baseline"]["verdict"] == "above"
    assert len(found["groups"]) == 6 and all(g["n"] == 3 and g["value"] == 1.0 for g in found["groups"].values())
    assert "2000 tokens, depth 0.50" in found["groups"]
    zeros = evaluate_passkey(made, says_zeros, cfg, seed=0, source="fixture")
    assert zeros["metrics"]["exact_match"]["value"] == 0.0
    assert zeros["vs_strongest_baseline"]["verdict"] == "not distinguishable"  # 0 of 18 cannot beat 1e-5 nor lose
    assert zeros["answers"]["one_answer"] and zeros["answers"]["top"] == "00000"


@pytest.mark.parametrize(("settings", "message"), [
    ({"depths": [1.5]}, "'eval.passkey.depths': shares between 0 and 1"),
    ({"lengths": [0]}, "'eval.passkey.lengths': positive"),
    ({"digits": 0}, "'eval.passkey.digits'"),
    ({"items_per_depth": 0}, "'eval.passkey.items_per_depth'"),
])
def test_bad_passkey_settings_are_one_line(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        PasskeyConfig(**settings).validate("eval.passkey")


def test_passkey_is_a_known_task_and_has_no_task_file() -> None:
    from eval.tasks import check_task_names

    check_task_names(EvalConfig(tasks=["passkey"], train_tasks=["passkey"]))
    with pytest.raises(ConfigError, match=r"^config key 'eval.task_files.passkey': the passkey items are generated"):
        check_task_names(EvalConfig(task_files={"passkey": "x.jsonl"}))


def test_bucket_starts_must_increase_from_zero() -> None:
    assert bucket_spans([0, 256, 512, 1024, 2048], 1024) == [(0, 256), (256, 512), (512, 1024)]
    for starts in ([16, 32], [0, 32, 16]):
        with pytest.raises(ConfigError, match="eval.bpb_position_buckets"):
            EvalConfig(bpb_position_buckets=starts).validate("eval")
        with pytest.raises(ConfigError, match="eval.bpb_position_buckets"):
            bucket_spans(starts, 64)


@pytest.mark.parametrize("mode", ["concat", "document"])
def test_documents_come_back_whole_from_packed_rows(mode: str) -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 50, size=n).astype(np.int32) for n in (5, 40, 3, 17, 64, 9)]
    packer = Packer(seq_len=8, mode=mode, pad_id=EOS)
    rows = [packer.add([np.append(d, EOS) for d in docs]), packer.finish()]
    batches = []
    for r in rows:
        if not r["input_ids"].size:
            continue
        batch = {"inputs": r["input_ids"][:, :-1], "targets": r["input_ids"][:, 1:]}
        if mode == "document":
            batch.update(segment_ids=r["segment_ids"][:, :-1], positions=r["positions"][:, :-1])
        batches.append(batch)
    got = list(stream_documents(batches, EOS))
    if mode == "concat":  # the last partial row is dropped by the packer: the last document may be cut short
        assert [list(d) for d in got[:-1]] == [list(d) for d in docs[:len(got) - 1]]
        assert list(got[-1]) == list(docs[len(got) - 1][:got[-1].size])
    else:
        assert [list(d) for d in got] == [list(d) for d in docs]


def test_position_buckets_count_tokens_and_bytes_of_long_documents_only() -> None:
    vocab, max_len = 7, 16
    piece_bytes = np.array([0, 1, 2, 1, 2, 1, 2])

    def uniform(inputs, **_):
        import jax.numpy as jnp
        return jnp.zeros((*inputs.shape, vocab), dtype=jnp.float32)

    docs = [np.arange(1, 21) % 6 + 1, np.arange(5) + 1, np.full(16, 2), np.full(40, 3)]
    found = position_bucket_bpb(uniform, docs, piece_bytes, [(0, 4), (4, 8), (8, 16)], EOS, max_len, batch_size=2)
    assert found.documents == 3 and found.shorter == 1
    first_16 = [d[:16] for d in (docs[0], docs[2], docs[3])]
    for (lo, hi), acc in zip(found.spans, found.buckets, strict=True):
        assert acc.tokens == 3 * (hi - lo)
        assert acc.bytes == sum(int(piece_bytes[d[lo:hi]].sum()) for d in first_16)
        assert math.isclose(acc.nats, acc.tokens * math.log(vocab), rel_tol=1e-6)
    assert position_bucket_bpb(uniform, docs, piece_bytes, [(0, 16)], EOS, max_len, 2, max_documents=1).documents == 1
    none_long = position_bucket_bpb(uniform, docs[1:2], piece_bytes, [(0, 8), (8, 16)], EOS, max_len, 2)
    found = {**none_long.to_dict(), "max_len": max_len}  # nothing measured: null, not NaN, and the report says so
    assert found["shorter_documents"] == 1 and [b["bits_per_byte"] for b in found["buckets"]] == [None, None]
    report = render_markdown({"step": 1, "validation_by_position": found})
    assert "(0 documents; 1 shorter left out)" in report and "| [8, 16) | n/a | n/a | 0 | 0 |" in report


@pytest.mark.integration
def test_recipe_05_reports_passkey_against_chance_and_bpb_by_position(fixture_pretrained: Path,
                                                                     tmp_path: Path) -> None:
    from tests.fixture_run import pretrained_copy
    from tests.recipe_runner import run_recipe

    config = pretrained_copy(fixture_pretrained, tmp_path)
    # the fixture's 10% validation split is empty: half of its documents held out instead (the same tokenizer)
    held_out = "shards.validation_percent=50"
    run_recipe("03_shard.py", config, held_out)
    run_recipe("05_evaluate.py", config, held_out, "eval.tasks=[passkey]", "eval.bpb_position_buckets=[0,16,32]",
               "eval.passkey.items_per_depth=2", "eval.max_validation_batches=null")
    eval_dir = tmp_path / "runs" / "tiny" / "eval"
    results = json.loads(sorted(eval_dir.glob("step_*.json"))[-1].read_text(encoding="utf-8"))
    by_position = results["validation_by_position"]
    assert by_position["max_len"] == 64 and by_position["documents"] >= 1
    assert [(b["start"], b["end"]) for b in by_position["buckets"]] == [(0, 16), (16, 32), (32, 64)]
    for b in by_position["buckets"]:
        assert b["tokens"] == by_position["documents"] * (b["end"] - b["start"]) and b["bytes"] > 0
        assert 0 < b["bits_per_byte"] < 20
    r = results["tasks"]["passkey"]
    assert r["items"] == 10 and r["lengths"] == [64] and r["seed"] == 0 and r["digits"] == 5  # 5 depths x 2
    assert r["metrics"]["exact_match"]["chance"] == 1e-5 and len(r["metrics"]["exact_match"]["ci95"]) == 2
    assert r["prompt_tokens"]["max"] + answer_tokens(5) <= 64
    assert {"chance", "random_init"} <= set(r["baselines"]) and len(r["groups"]) == 5
    assert r["source"].endswith("(validation split)")
    report = sorted(eval_dir.glob("step_*.md"))[-1].read_text(encoding="utf-8")
    assert "## Bits per byte by position" in report and "| [32, 64) |" in report
    assert re.search(r"\| passkey \| exact_match \| [0-9.]+ \| \[[0-9.]+, [0-9.]+\] \| 1e-05 \|", report)
    assert "## passkey by group" in report and "64 tokens, depth 0.50" in report
    # eval during training (train.eval_every): the same two, as the flat metrics the trainer logs
    from eval.run import evaluate_model
    from experiment.config import load_config
    from experiment.runfolder import RunFolder
    from trainer.trained_model import load_trained_model

    cfg = load_config(config, [held_out, "eval.train_tasks=[passkey]", "eval.bpb_position_buckets=[0,16,32]",
                               "eval.passkey.items_per_depth=1", "eval.train_validation_batches=100"])
    run_folder = RunFolder.for_config(cfg)
    model, step, _ = load_trained_model(run_folder)
    flat = evaluate_model(model, cfg, run_folder, int(step))
    assert [flat[f"eval/val_bpb_position/{lo}-{hi}"] for lo, hi in ((0, 16), (16, 32), (32, 64))] == [
        pytest.approx(b["bits_per_byte"], rel=1e-5) for b in by_position["buckets"]]
    assert flat["eval/passkey/baseline_chance"] == 1e-5 and 0.0 <= flat["eval/passkey/exact_match"] <= 1.0
