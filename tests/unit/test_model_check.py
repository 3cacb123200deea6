"""A mistyped model path fails fast with a whole, correct message (issue 59): no hub retries."""

from __future__ import annotations

import time

import pytest
from huggingface_hub import constants

from ledger.errors import ConfigError
from producer import submit_checks


def test_an_id_whose_org_is_a_local_folder_is_a_mistyped_path_and_names_the_close_folders(tmp_path, monkeypatch):
    (tmp_path / "regen" / "tiny").mkdir(parents=True)
    (tmp_path / "regen" / "tiny-tools").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(submit_checks, "_check_hub_model", lambda _: pytest.fail("the hub was asked"))
    with pytest.raises(ConfigError) as refused:
        submit_checks.check_model("regen/tiny-typo")
    assert str(refused.value) == (
        "--model regen/tiny-typo: no such folder: regen/ is a folder here but holds no 'tiny-typo' (did you mean "
        "regen/tiny-tools or regen/tiny?); not looked up on the hub while ./regen is a folder here (submit from "
        "another folder for the hub model of that id)")


def test_a_hub_id_that_cannot_be_asked_is_refused_at_once_with_a_whole_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        submit_checks.check_model("no-org/no-such-model")
    assert time.monotonic() - start < 5
    message = str(refused.value)
    assert "the hub cannot be asked (HF_HUB_OFFLINE is set)" in message
    assert message.endswith("(`hf download no-org/no-such-model`)")
