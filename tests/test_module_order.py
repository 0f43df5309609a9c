"""The suite's module order: longest first by recorded times, merged and written so a damaged record costs nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.module_order import longest_modules_first, read_durations, write_durations


@dataclass
class Node:
    nodeid: str


def test_modules_start_longest_first_and_keep_their_tests_in_order() -> None:
    items = [Node("a.py::t1"), Node("b.py::t1"), Node("a.py::t2"), Node("c.py::t1"), Node("d.py::t1")]
    durations = {"a.py::t1": 1.0, "a.py::t2": 1.5, "b.py::t1": 9.0, "c.py::t1": 3.0}
    order = [n.nodeid for n in longest_modules_first(items, durations)]
    # b 9 s, c 3 s, a 2.5 s in all (its two tests summed, in their order), d unrecorded last
    assert order == ["b.py::t1", "c.py::t1", "a.py::t1", "a.py::t2", "d.py::t1"]
    assert [n.nodeid for n in longest_modules_first(items, {})] == ["a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1",
                                                                     "d.py::t1"]


def test_a_session_merges_its_times_and_a_damaged_record_is_no_order(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "durations.json"
    write_durations(path, {"a.py::t1": 2.0, "b.py::t1": 1.0})
    write_durations(path, {"a.py::t1": 5.0})  # a later session that ran only a.py
    assert read_durations(path) == {"a.py::t1": 5.0, "b.py::t1": 1.0}
    assert [p.name for p in path.parent.iterdir()] == ["durations.json"]  # no temporary left behind
    path.write_text('{"a.py::t1": 5.0, "b.py', encoding="utf-8")  # torn by a crash
    assert read_durations(path) == {}
    path.write_text('["a.py::t1"]', encoding="utf-8")
    assert read_durations(path) == {}
    assert read_durations(None) == {}
