"""The one JSONL reader (experiment/jsonl.py): its torn-tail policy, and the readers that use it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from experiment.errors import DataError
from experiment.jsonl import iter_jsonl, parse_jsonl, read_jsonl

GOOD = '{"step": 1}\n{"step": 2}\n'


def write(tmp_path: Path, text: str, name: str = "log.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


@pytest.mark.parametrize("policy", ["ignore", "warn"])
def test_a_torn_last_line_is_a_record_being_written(tmp_path: Path, policy: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, GOOD + '{"step": 3, "lo')
    with caplog.at_level(logging.WARNING, logger="experiment.jsonl"):
        contents = read_jsonl(path, torn_tail=policy)  # type: ignore[arg-type]
    assert contents.values == [{"step": 1}, {"step": 2}]
    assert contents.torn_tail == '{"step": 3, "lo'
    warned = [r.getMessage() for r in caplog.records]
    if policy == "warn":
        assert warned == [f"{path} line 3: a last line without a newline that is not JSON (15 bytes; a writer "
                          "was killed or is still writing): dropped"]
    else:
        assert warned == []


def test_a_torn_last_line_of_an_atomically_written_file_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + '{"step": 3')
    with pytest.raises(DataError, match=rf"^{path} line 3: a last line without a newline that is not JSON"):
        read_jsonl(path, torn_tail="error")


@pytest.mark.parametrize("policy", ["ignore", "warn", "error"])
def test_a_damaged_line_before_the_end_names_file_and_line(tmp_path: Path, policy: str) -> None:
    path = write(tmp_path, '{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(DataError, match=rf"^{path} line 2: not valid JSON \(") as info:
        read_jsonl(path, torn_tail=policy)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    # a damaged line that still ends with its newline is damage even when it is the last one
    with pytest.raises(DataError, match=rf"^{path} line 2: not valid JSON"):
        read_jsonl(write(tmp_path, '{"step": 1}\n{"step": 2, "lo\n'), torn_tail=policy)  # type: ignore[arg-type]


def test_empty_file_blank_lines_and_a_missing_newline(tmp_path: Path) -> None:
    assert read_jsonl(write(tmp_path, ""), torn_tail="error").records == []
    assert read_jsonl(tmp_path / "absent.jsonl", torn_tail="error", missing_ok=True).records == []
    with pytest.raises(DataError, match=r"absent.jsonl is missing"):
        read_jsonl(tmp_path / "absent.jsonl", torn_tail="error")
    with_newline = read_jsonl(write(tmp_path, GOOD), torn_tail="error")
    assert with_newline.values == [{"step": 1}, {"step": 2}] and with_newline.torn_tail is None
    # a complete record without its newline (a kill right before it) parses, so it is kept
    without = read_jsonl(write(tmp_path, GOOD.rstrip("\n")), torn_tail="error")
    assert without.values == [{"step": 1}, {"step": 2}] and without.torn_tail is None
    blank = read_jsonl(write(tmp_path, '\n{"a": 1}\n   \n\n{"a": 2}\n  '), torn_tail="error")
    assert [(r.line, r.value) for r in blank.records] == [(2, {"a": 1}), (5, {"a": 2})]


def test_lines_split_on_newline_alone() -> None:
    """``ensure_ascii=False`` JSON keeps U+2028 and U+0085 raw; str.splitlines would cut the record there."""
    text = json.dumps({"text": "абзац\u2028второй\x85\x1c"}, ensure_ascii=False) + "\n"
    assert parse_jsonl(text, "t", torn_tail="error").values == [{"text": "абзац\u2028второй\x85\x1c"}]


def test_a_tail_cut_inside_a_utf8_character_is_torn_not_undecodable(tmp_path: Path) -> None:
    data = (GOOD + '{"text": "привет"}\n').encode("utf-8")
    path = tmp_path / "cut.jsonl"
    path.write_bytes(data[:-5])  # inside the last "т"
    assert read_jsonl(path, torn_tail="ignore").values == [{"step": 1}, {"step": 2}]
    path.write_bytes(b'{"a": 1}\n{"text": "\xff"}\n')
    with pytest.raises(DataError, match=rf"^{path} line 2: not UTF-8"):
        read_jsonl(path, torn_tail="ignore")


def test_malformed_lines_can_be_handed_to_the_caller() -> None:
    """User corpora count bad records rather than stop on them; the torn-tail policy still applies."""
    lines = ['{"text": "a"}\n', "not json\n", '{"text": "b"}\n', '{"te']
    records = list(iter_jsonl(lines, "user.jsonl", torn_tail="ignore", malformed="yield"))
    assert [(r.line, r.value, r.error is not None) for r in records] == [
        (1, {"text": "a"}, False), (2, None, True), (3, {"text": "b"}, False)]
    same_text = parse_jsonl("not json\nnot json", "user.jsonl", torn_tail="ignore", malformed="yield")
    assert [r.line for r in same_text.records] == [1] and same_text.torn_tail == "not json"
    with pytest.raises(ValueError, match="torn_tail must be one of"):
        list(iter_jsonl(lines, "user.jsonl", torn_tail="skip"))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# The readers of train_log.jsonl, which once treated a torn last line three ways, now agree


def test_every_train_log_reader_ignores_a_torn_tail_and_names_a_damaged_line(tmp_path: Path) -> None:
    from cost.target import TRAIN_LOG, read_train_log
    from tracking.history import backfill_offline_history
    from trainer.resume import trim_train_log

    class OfflineRun:  # a W&B run with no earlier local folder: every step up to the resumed one is re-logged
        id, dir = "abc", str(tmp_path / "wandb" / "offline-run-1-abc" / "files")

        def __init__(self) -> None:
            self.logged: list[int] = []

        def log(self, record: dict, step: int) -> None:
            self.logged.append(step)

    def backfilled(resumed_step: int) -> list[int]:
        run = OfflineRun()
        backfill_offline_history(run, tmp_path / TRAIN_LOG, resumed_step)
        return run.logged

    lines = [{"train/step": step, "train/loss": 5.0 - step} for step in (1, 2, 3)]
    log = tmp_path / TRAIN_LOG
    log.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"train/step": 4, "train/lo', encoding="utf-8")
    assert read_train_log(tmp_path) == lines
    assert backfilled(4) == [1, 2, 3]
    assert trim_train_log(log, 2) == 3.0  # step 3 and the torn tail are retraced by the resumed run
    assert log.read_text(encoding="utf-8") == "".join(json.dumps(r) + "\n" for r in lines[:2])

    log.write_text(json.dumps(lines[0]) + "\n{garbage\n" + json.dumps(lines[1]) + "\n", encoding="utf-8")
    for read in (lambda: read_train_log(tmp_path), lambda: trim_train_log(log, 1), lambda: backfilled(2)):
        with pytest.raises(DataError, match=rf"^{log} line 2: not valid JSON"):
            read()
    assert read_train_log(tmp_path / "no-run") == []
