"""A worker started with a relative --model must recognise the absolute path submit recorded."""

from __future__ import annotations

import os

from ledger.model_path import resolve_model


def test_a_relative_model_directory_resolves_to_the_path_submit_records(tmp_path, monkeypatch):
    (tmp_path / "models" / "q").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    recorded = resolve_model(str(tmp_path / "models" / "q"))  # what `regen submit` stores
    assert resolve_model("models/q") == recorded
    assert resolve_model("./models/q/") == recorded
    assert os.path.isabs(recorded)


def test_a_hub_id_stays_as_it_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_model("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
