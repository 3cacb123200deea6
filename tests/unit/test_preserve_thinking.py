"""``--preserve-thinking``: the template's history keyword found by rendering, its default, its record and hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.errors import ConfigError
from ledger.hashing import history_kept
from producer.run_config import build_run_config

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "templates"


def _model(tmp_path: Path, template: str) -> str:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": (PUBLISHED / template).read_text()}))
    return str(tmp_path)


def test_qwen36_defaults_to_its_templates_own_default_and_records_the_keyword(tmp_path):
    config = build_run_config(_model(tmp_path, "qwen36.jinja"), max_tokens=8)
    record = config.as_record()
    assert (record["history_arg"], record["preserve_thinking"], record["preserve_thinking_share"]) == (
        "preserve_thinking", "off", 0.0)
    assert config.provenance()["history_arg"] == "preserve_thinking"
    assert config.provenance()["preserve_thinking"] == "off"


def test_each_mode_is_its_own_run_config(tmp_path):
    model = _model(tmp_path, "qwen36.jinja")
    configs = {mode: build_run_config(model, max_tokens=8, preserve_thinking=mode) for mode in ("on", "off", "mix")}
    assert configs["mix"].as_record()["preserve_thinking_share"] == 0.5
    assert len({c.hash for c in configs.values()}) == 3
    shared = build_run_config(model, max_tokens=8, preserve_thinking="mix", preserve_thinking_share=0.25)
    assert shared.hash != configs["mix"].hash


def test_a_template_without_the_keyword_refuses_the_option_and_records_nothing(tmp_path):
    model = _model(tmp_path, "qwen3.jinja")
    with pytest.raises(ConfigError, match=r"--preserve-thinking on: .* no keyword that changes how earlier "):
        build_run_config(model, max_tokens=8, preserve_thinking="on")
    record = build_run_config(model, max_tokens=8).as_record()
    assert not {"history_arg", "preserve_thinking", "preserve_thinking_share"} & set(record)


def test_a_share_out_of_range_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--preserve-thinking-share must be between 0 and 1"):
        build_run_config(_model(tmp_path, "qwen36.jinja"), max_tokens=8, preserve_thinking="mix",
                         preserve_thinking_share=1.5)


def test_mix_keeps_a_seeded_share_of_conversations_apart_from_the_thinking_draw():
    ids = [f"s{n}" for n in range(2000)]
    kept = [history_kept("mix", 0.3, sid) for sid in ids]
    assert kept == [history_kept("mix", 0.3, sid) for sid in ids]   # the same on every worker and retry
    assert 0.26 < sum(kept) / len(ids) < 0.34
    assert all(history_kept("on", 0.0, sid) for sid in ids[:10]) and not any(history_kept("off", 1.0, s) for s in ids[:10])
