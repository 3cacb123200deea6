"""Export rows from output rows: a fake engine's row has the shape a real one has, and a row of no known
shape is refused naming the sample, never a KeyError (issue 36, part 1)."""

from __future__ import annotations

import asyncio

import pytest

from ledger.errors import ShardError
from producer.results.export_rows import token_rows
from producer.results.outputs import is_fake_row
from worker.engine.fake import FAKE_ENGINE_VERSION, FakeEngineHost, FakeEngineSpec, fake_sample

RUN = {"model": "m", "sampling": {"max_tokens": 50, "temperature": 1.0}, "provenance": {}}
SAMPLE = {"sample_id": "s1", "messages": [{"role": "user", "content": "hi"}], "source": {"file": "f", "row": 1}}


def _fake_row() -> dict:
    engine = FakeEngineHost("m", FakeEngineSpec.parse("tok_s=100000,seqs=4,mean=5,sigma=0.1"))
    return asyncio.run(fake_sample(engine, SAMPLE, RUN))


def test_a_fake_engines_row_is_told_fake_and_has_every_key_the_tokens_export_reads():
    row = _fake_row()
    assert is_fake_row(row) and row["fake_engine"] == FAKE_ENGINE_VERSION
    assert not is_fake_row({**row, "fake_engine": None})
    rows, left_out = token_rows(row, run="r", run_seed=0, sample_class="ok", turn_classes=["ok"])
    assert left_out == 0 and [r["id"] for r in rows] == ["s1_gen0"]


def test_an_event_without_a_turn_is_refused_naming_the_sample():
    row = _fake_row()
    del row["events"][0]["turn"]
    with pytest.raises(ShardError, match=r"sample 's1': generation event 0 has no turn number"):
        token_rows(row, run="r", run_seed=0, sample_class="ok", turn_classes=["ok"])
