"""bench/bench_decode.py's token-equality check: the decode benchmark's claim that both sides produced the
same greedy tokens must fail when they did not."""

from __future__ import annotations

from bench.bench_decode import compare_tokens, mismatches, summarize


def call(tokens: list[list[int]], rate: float = 100.0) -> dict:
    return {"decode_tokens_per_s": rate, "decode_steps": len(tokens[0]) - 1, "tokens": tokens}


def test_compare_tokens_equal_and_first_difference() -> None:
    assert compare_tokens([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) == {
        "equal": True, "rows": 2, "first_difference": None}
    assert compare_tokens([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]])["first_difference"] == {
        "row": 1, "position": 1}
    assert not compare_tokens([[1, 2, 3]], [[1, 2]])["equal"]  # a row cut short
    assert not compare_tokens([[1, 2], [3, 4]], [[1, 2]])["equal"]  # a row missing


def test_summarize_reports_a_mismatch_in_any_round() -> None:
    ours = [call([[1, 2, 3]], 200.0), call([[1, 2, 3]], 220.0)]
    theirs = [call([[1, 2, 3]], 100.0), call([[1, 2, 7]], 100.0)]  # the second round differs
    row = summarize(1, {"ours": ours, "hf_static": theirs})
    assert row["tokens_equal"]["hf_static"] == {
        "equal": False, "rows": 1, "first_difference": {"row": 0, "position": 2}}
    assert row["ratio_ours_over_hf_static"]["rounds"] == [2.0, 2.2]
    assert row["sides"]["ours"]["decode_tokens_per_s_median"] == 210.0
    assert mismatches([row]) == ["batch 1: hf_static"]
    assert mismatches([summarize(8, {"ours": ours[:1], "hf_static": theirs[:1]})]) == []
