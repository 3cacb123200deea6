"""Rejected rows as submit and ``regen status --rejected`` show them: ``file:row reason detail``."""

from __future__ import annotations

from producer.monitoring.rejected import reject_line


def test_a_rejected_row_is_one_line_with_paths_under_the_current_folder_shown_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    row = {"file": str(tmp_path / "data" / "b.jsonl"), "row": 4, "reason": "duplicate_id",
           "detail": f"sample id 'x' first seen at {tmp_path / 'data' / 'a.jsonl'}:2\n(and more)"}
    assert reject_line(row) == "data/b.jsonl:4 duplicate_id sample id 'x' first seen at data/a.jsonl:2 (and more)"
    elsewhere = {"file": "/elsewhere/c.json", "row": 0, "reason": "not_an_object", "detail": ""}
    assert reject_line(elsewhere) == "/elsewhere/c.json:0 not_an_object"
