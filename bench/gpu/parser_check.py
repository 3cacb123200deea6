"""Which families' vLLM parsers this machine's vLLM builds, before the fidelity suites run (bench/gpu/fidelity.sh).

    python3 -m bench.gpu.parser_check

A line a family: ``parsers of FAMILY: build`` or what stops them. Each family's parsers are built as a
worker builds them (targets/turn_parsers.py ``load_turn_parser``), on that family's own tokenizer (the tiny
model's, trained in a fraction of a second; no model is built). Importing the classes is not enough:
vLLM 0.26's mistral reasoning parser imported fine and then refused the Hugging Face tokenizer regen's
worker holds, which only the suite's first Magistral turn showed (docs/results/h100-fidelity-2026-12-05b.txt).
gpt-oss is read by regen's Harmony parser, not vLLM's text parsers: its line says whether that loads.
Always exits 0: it informs, the suites decide.
"""

from __future__ import annotations

import sys


def family_line(name: str) -> str:
    """One family's line: its parsers built on its own tokenizer, or the first thing that stopped them."""
    from worker.tiny import family_model as fm
    from worker.tiny.families import SPECS

    spec = SPECS[name]
    try:
        if spec.reasoning_parser == "openai_gptoss":
            from targets.harmony import HarmonyTurnParser

            HarmonyTurnParser()
            return f"parsers of {name}: build (regen's Harmony parser)"
        from targets.turn_parsers import load_turn_parser

        tokenizer = fm.train_tokenizer(spec, fm.tokenizer_corpus(spec, 0))
        parser = load_turn_parser(tokenizer, reasoning=spec.reasoning_parser, tool=spec.tool_parser)
        return f"parsers of {name}: build ({spec.reasoning_parser}, {spec.tool_parser} by {parser.description['by']})"
    except Exception as e:  # noqa: BLE001 - every refusal is the line's news, whatever its type
        return f"parsers of {name}: do not build ({spec.reasoning_parser}, {spec.tool_parser}): {type(e).__name__}: {e}"


def main(argv: list[str] | None = None) -> int:
    from worker.tiny.families import SPECS

    for name in argv or list(SPECS):
        print(family_line(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
