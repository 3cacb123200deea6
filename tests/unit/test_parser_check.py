"""bench/gpu/parser_check.py: fidelity.sh's first lines say which families' parsers this vLLM builds, as a worker does."""

from __future__ import annotations

import pytest

from tests.fixtures.model import VLLM_HINT
from tests.support.helpers import refuse_reasoning_parsers, require

require("vllm", VLLM_HINT, module_level=True)


def test_every_family_builds_on_this_vllm_and_its_line_says_by_which(capsys):
    from bench.gpu.parser_check import main
    from worker.tiny.families import SPECS

    assert main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"parsers of {name}" for name in SPECS]
    assert all(": build (" in line for line in lines), lines
    assert "parsers of magistral: build (mistral, mistral by vllm " in "\n".join(lines)


def test_a_class_that_imports_but_refuses_the_tokenizer_is_named_up_front(monkeypatch):
    # What importing the classes alone missed on the GPU's vLLM 0.26 (docs/results/h100-fidelity-2026-12-05b.txt).
    from bench.gpu.parser_check import family_line

    refuse_reasoning_parsers(monkeypatch, RuntimeError("no think tokens in this vocabulary"))
    line = family_line("deepseek_r1")
    assert line.startswith("parsers of deepseek_r1: do not build (deepseek_r1, deepseek_v3): ParserUnavailable: ")
    assert line.endswith("RuntimeError: no think tokens in this vocabulary")


@pytest.mark.parametrize("family", ["llama3"])
def test_a_family_without_a_reasoning_parser_is_not_refused_for_it(family):
    from bench.gpu.parser_check import family_line

    assert family_line(family).startswith(f"parsers of {family}: build (None, llama3_json by vllm ")
