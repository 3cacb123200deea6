"""Which of vLLM's reasoning and tool-call parsers read a target's output: named, or read off its chat template.

A drafter learns the target's own distribution, so a turn must be split into
thought, answer and tool calls the way the target's serving stack splits it:
regen uses vLLM's own parser classes, under the names ``vllm serve`` takes
(``--reasoning-parser qwen3 --tool-call-parser hermes``). ``regen submit`` takes
them as ``--reasoning-parser`` / ``--tool-parser``; without them the choice is
found by rendering the model's chat template (targets/template_probe.py: a probe
call's wire format, where the thought goes, what the generation prompt ends with).
A template regen cannot place is an error that names the choices: guessing a parser
would silently turn every tool call into answer text.

The names are checked against the list below (vLLM 0.26 to 0.33's registries), so
a typo fails at submit, on a machine without vLLM; the worker then loads the class
from the vLLM it runs and fails the batch loudly if that vLLM lacks it.
Nothing here imports vLLM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import ConfigError
from targets.template_probe import probe_template

#: "No parser": a family that does not think, or a run whose target calls no tools.
NONE = "none"
#: "The worker chooses from the template it loads": the model is not readable where the run is
#: submitted (a path on the GPU nodes only, a hub id). Each row then says what was chosen.
AUTO = "auto"

#: ``vllm serve --reasoning-parser`` names (vLLM 0.32's registry; 0.26-0.33 share these).
REASONING_PARSERS = frozenset({
    "cohere_command3", "cohere_command4", "deepseek_r1", "deepseek_v3", "deepseek_v4", "deepseek_v41", "ernie45",
    "gemma4", "glm45", "glm47", "granite", "granite_thinking_parser", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4",
    "inkling", "k2_horizon", "kimi_k2", "kimi_k3", "ling3", "mimo", "minicpmv", "minimax_m2",
    "minimax_m2_append_think", "minimax_m3", "mistral", "muse_glimmer", "nemotron_v3", "olmo3", "openai_gptoss",
    "plamo3", "poolside_v1", "qwen3", "seed_oss", "step3", "step3p5",
})
#: ``vllm serve --tool-call-parser`` names (vLLM 0.32's registry).
TOOL_PARSERS = frozenset({
    "apertus", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31", "deepseek_v32", "deepseek_v4",
    "deepseek_v41", "dots", "ernie45", "functiongemma", "gemma4", "gigachat3", "glm45", "glm47", "granite",
    "granite-20b-fc", "granite4", "hermes", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "internlm", "jamba",
    "k2_horizon", "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3_json", "llama4_json", "llama4_pythonic", "longcat",
    "mimo", "minicpm5", "minimax_m2", "minimax_m3", "mistral", "muse_glimmer", "olmo3", "openai", "phi4_mini_json",
    "plamo3", "poolside_v1", "pythonic", "qwen3_coder", "qwen3_json", "qwen3_xml", "seed_oss", "step3", "step3p5",
    "xlam",
})


@dataclass(frozen=True)
class ParserChoice:
    """The parsers of one run, as recorded in its config: vLLM names, None for "no parser", or AUTO."""

    reasoning: str | None
    tool: str | None
    #: How the choice was made: "named", "template: <family>" or "by the workers, from the template".
    chosen_by: str

    def as_record(self) -> dict:
        return {"reasoning_parser": self.reasoning or NONE, "tool_parser": self.tool or NONE}


def chat_template_of(model_dir: str | Path) -> str | None:
    """The chat template a local model directory ships (tokenizer_config.json or its own file); None if none."""
    root = Path(model_dir)
    if (root / "chat_template.jinja").is_file():  # transformers prefers it to tokenizer_config.json's
        return (root / "chat_template.jinja").read_text()
    config = root / "tokenizer_config.json"
    if config.is_file():
        try:
            template = json.loads(config.read_text()).get("chat_template")
        except ValueError as e:
            raise ConfigError(f"{config} is not readable JSON: {e}") from e
        if isinstance(template, list):  # several named templates: the default one renders chats
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str):
            return template
    if (root / "chat_template.json").is_file():
        try:
            return json.loads((root / "chat_template.json").read_text()).get("chat_template")
        except ValueError as e:
            raise ConfigError(f"{root / 'chat_template.json'} is not readable JSON: {e}") from e
    return None


def parsers_for_template(template: str) -> ParserChoice | None:
    """The parsers of the family the template renders (targets/template_probe.py); None if of no known format."""
    found = probe_template(template)
    if found is None:
        return None
    return ParserChoice(found.reasoning, found.tool, f"template: {found.family}")


def choose_parsers(model: str, *, reasoning: str | None = None, tool: str | None = None,
                   template: str | None = None) -> ParserChoice:
    """The run's parsers: the named ones, the rest read off the model's chat template.

    Args:
        model: A local model directory (its chat template is read when a name is missing).
        reasoning, tool: ``vllm serve`` names, or ``"none"``; None (or ``"auto"``) means "choose for me":
            from the template here, or AUTO (the workers choose) when the model is no local directory.
        template: The chat template, when the caller already has it (the worker's tokenizer).

    Raises:
        ConfigError: An unknown name, or a missing name that the template cannot decide.
    """
    reasoning = None if reasoning == AUTO else reasoning
    tool = None if tool == AUTO else tool
    _check_name(reasoning, REASONING_PARSERS, "--reasoning-parser")
    _check_name(tool, TOOL_PARSERS, "--tool-parser")
    if reasoning is not None and tool is not None:
        return ParserChoice(_none_to_null(reasoning), _none_to_null(tool), "named")
    if template is None:
        if not Path(model).is_dir():
            # Not readable here: the workers read the template they load (the same for all of them).
            return ParserChoice(_none_to_null(reasoning) if reasoning else AUTO,
                                _none_to_null(tool) if tool else AUTO, "by the workers, from the template")
        template = chat_template_of(model)
    detected = parsers_for_template(template) if template else None
    if detected is None:
        where = "has no chat template regen can read" if not template else "has a chat template of no family regen knows"
        raise ConfigError(
            f"model {model} {where}, so its parsers cannot be chosen for it: pass --reasoning-parser "
            f"(one of: none, {', '.join(sorted(REASONING_PARSERS))}) and --tool-parser "
            f"(one of: none, {', '.join(sorted(TOOL_PARSERS))}), the names `vllm serve` takes")
    return ParserChoice(
        _none_to_null(reasoning) if reasoning is not None else detected.reasoning,
        _none_to_null(tool) if tool is not None else detected.tool,
        "named and " + detected.chosen_by if (reasoning or tool) else detected.chosen_by,
    )


def recorded_parsers(sampling: dict) -> tuple[str | None, str | None]:
    """The parsers a run's record names; AUTO where the worker must choose (also every run recorded before
    regen named them)."""
    return (_none_to_null(sampling.get("reasoning_parser", AUTO)), _none_to_null(sampling.get("tool_parser", AUTO)))


def resolve_auto(recorded: tuple[str | None, str | None], model: str, template: str | None) -> ParserChoice:
    """The recorded names with AUTO replaced by the template's choice (the worker's side of AUTO).

    Raises:
        ConfigError: A name is AUTO and the template is of no family regen knows (names the choices).
    """
    reasoning, tool = recorded
    if AUTO not in recorded:
        return ParserChoice(reasoning, tool, "named")
    return choose_parsers(model, reasoning=None if reasoning == AUTO else reasoning or NONE,
                          tool=None if tool == AUTO else tool or NONE, template=template or "")


def _check_name(name: str | None, known: frozenset[str], option: str) -> None:
    if name is None or name == NONE or name in known:
        return
    raise ConfigError(f"{option} {name!r} is not a parser vLLM knows; choices: none, {', '.join(sorted(known))}")


def _none_to_null(name: str | None) -> str | None:
    return None if name in (None, NONE, "") else name
