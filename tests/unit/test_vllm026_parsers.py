"""regen reads turns with the GPU machines' vLLM (0.26), not only CI's (0.32): the classes that differ, run here.

vLLM 0.26's ``mistral`` reasoning parser refuses a Hugging Face tokenizer (it asks for
mistral_common's), and regen's worker holds one: on the GPU's vLLM every Magistral case of the
family fidelity suite failed at its first turn (docs/results/h100-fidelity-2026-12-05b.txt). The
0.26 file is kept verbatim in tests/data/vllm026 (its source and hash in SOURCE.md) and loaded
here over the CPU build's vLLM, whose modules it imports.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.fixtures.model import VLLM_HINT
from tests.support.helpers import refuse_reasoning_parsers, require
from worker.conversation.dialogue import Generation

require("vllm", VLLM_HINT, module_level=True)

VLLM026 = Path(__file__).resolve().parents[1] / "data" / "vllm026"


def _load_026(name: str):
    spec = importlib.util.spec_from_file_location(f"regen_test_vllm026_{name}", VLLM026 / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mistral_026():
    return _load_026("mistral_reasoning_parser").MistralReasoningParser


@pytest.fixture(scope="module")
def magistral_tokenizer():
    from worker.tiny import family_model as fm
    from worker.tiny.families import SPECS

    spec = SPECS["magistral"]
    return fm.train_tokenizer(spec, fm.tokenizer_corpus(spec, 0))


@pytest.fixture
def parsers_of_026(monkeypatch, mistral_026):
    """The ``mistral`` reasoning parser is 0.26's; every other name is this vLLM's."""
    import targets.vllm_compat as compat

    own = compat.reasoning_parser_class
    monkeypatch.setattr(compat, "reasoning_parser_class", lambda name: mistral_026 if name == "mistral" else own(name))


def _generation(tokenizer, text: str) -> Generation:
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Generation(prompt_token_ids=[1], token_ids=ids, text=None, finish_reason="stop", stop_reason=None)


def test_vllm_026s_mistral_reasoning_parser_refuses_a_hugging_face_tokenizer(mistral_026, magistral_tokenizer):
    """The refusal that failed every Magistral turn on the GPU: the reason for the adapter below."""
    with pytest.raises(ValueError, match="MistralTokenizer"):
        mistral_026(magistral_tokenizer)


def test_regen_builds_it_on_the_hugging_face_tokenizer_and_vllms_own_code_reads_the_thought(
        parsers_of_026, mistral_026, magistral_tokenizer):
    from targets.turn_parsers import VllmTurnParser

    parser = VllmTurnParser(magistral_tokenizer, reasoning="mistral", tool="mistral")
    assert type(parser._reasoning) is mistral_026  # vLLM 0.26's class, not a stand-in
    vocab = magistral_tokenizer.get_vocab()
    assert (parser._reasoning.start_token_id, parser._reasoning.end_token_id) == (vocab["[THINK]"], vocab["[/THINK]"])
    assert parser.think_end_id == vocab["[/THINK]"]

    split, calls = parser.parse(_generation(magistral_tokenizer, "[THINK]check the map[/THINK]Paris is north."),
                                thinking=True, tools=None, turn=0)
    assert (split.reasoning_content, split.content, split.think_tags_ok) == ("check the map", "Paris is north.", True)
    assert calls.tool_calls == [] and calls.content == "Paris is north."
    # Magistral opens its own thought: a turn that does not is all answer.
    split, _ = parser.parse(_generation(magistral_tokenizer, "Just an answer."), thinking=True, tools=None, turn=0)
    assert (split.reasoning_content, split.content) == (None, "Just an answer.")


def test_a_refusal_of_another_kind_is_not_papered_over(monkeypatch, magistral_tokenizer):
    from targets.turn_parsers import VllmTurnParser

    refuse_reasoning_parsers(monkeypatch, ValueError("this parser needs a model config"))
    with pytest.raises(ValueError, match="needs a model config"):
        VllmTurnParser(magistral_tokenizer, reasoning="mistral", tool=None)


def test_a_class_that_asks_for_mistral_common_but_reads_no_think_tags_keeps_its_refusal(monkeypatch,
                                                                                       magistral_tokenizer):
    from targets.turn_parsers import VllmTurnParser

    # Not a subclass of vLLM's think-tag base: nothing for regen to build it through.
    refuse_reasoning_parsers(monkeypatch, ValueError("The tokenizer must be an instance of MistralTokenizer."))
    with pytest.raises(ValueError, match="MistralTokenizer"):
        VllmTurnParser(magistral_tokenizer, reasoning="mistral", tool=None)


def test_a_worker_names_the_runs_parsers_when_a_class_refuses_its_tokenizer(monkeypatch, magistral_tokenizer):
    from targets.turn_parsers import ParserUnavailable, load_turn_parser

    refuse_reasoning_parsers(monkeypatch, ValueError("this parser needs a model config"))
    with pytest.raises(ParserUnavailable, match=r"cannot build the run's parsers .*'mistral'.*ValueError: this parser"):
        load_turn_parser(magistral_tokenizer, reasoning="mistral", tool="mistral")
