"""The chat families of the tiny model: their tokens, templates, turn ends and vLLM parsers.

``qwen3`` is the original tiny model (built by ``worker/tiny/model.py``, unchanged).
The others are built by ``worker/tiny/family_model.py`` with the same small Qwen3
decoder (vLLM's CPU build needs head_dim >= 32; the architecture does not change the
wire format) and a tokenizer, template and training data of their own. Every
template is regen's own writing, in the family's real wire format; each model
directory carries it in tokenizer_config.json, so the family can be recognised from
the template's markers, as with real models.

"Special" below means ``special=True`` in the tokenizer: skipped when decoding with
``skip_special_tokens=True``. Every token listed is a single id in either case. The
engine decodes completions with ``skip_special_tokens=False`` and hands the text,
less the end-of-turn token, to the family's vLLM parsers.

llama3 (Llama 3.1/3.2, JSON tool calling; parsers: tool ``llama3_json``, no reasoning)
    Special: all of ``<|begin_of_text|>``, ``<|end_of_text|>``, ``<|start_header_id|>``,
    ``<|end_header_id|>``, ``<|eot_id|>``, ``<|eom_id|>``, ``<|python_tag|>``,
    ``<|finetune_right_pad_id|>`` (as in Llama 3). No format tokens: a call is plain
    JSON text, ``{"name": ..., "parameters": {...}}``, several joined by ``"; "``.
    ``<|python_tag|>`` is never written; it is there because vLLM's llama3_json
    parser refuses a tokenizer without it. Turns end with ``<|eot_id|>``. No thinking:
    ``enable_thinking`` and ``reasoning_content`` are ignored. Tools go in the first
    user message; tool results in role ``ipython``.

deepseek_r1 (DeepSeek-R1 / V3; parsers: reasoning ``deepseek_r1``, tool ``deepseek_v3``)
    Special: ``<｜begin▁of▁sentence｜>``, ``<｜end▁of▁sentence｜>``, ``<｜▁pad▁｜>``. Not
    special (as in DeepSeek's tokenizer): ``<｜User｜>``, ``<｜Assistant｜>``, ``<think>``,
    ``</think>`` and the ``<｜tool▁...｜>`` tokens. Turns end with ``<｜end▁of▁sentence｜>``.
    Always thinks, as R1: the generation prompt ends ``<｜Assistant｜><think>\\n``, so the
    output is ``THOUGHT\\n</think>\\n\\nANSWER`` with no opening tag, which the
    deepseek_r1 parser splits on ``</think>`` alone; ``enable_thinking`` is ignored
    (R1 has no switch; the parser could not tell a thinking-off answer from a thought).
    The template keeps the thoughts of the turns after the last user message and drops
    earlier ones (R1's own template drops them all).

glm45 (GLM-4.5/4.6; parsers: reasoning ``glm45``, tool ``glm45``)
    Special: ``[gMASK]``, ``<sop>``, ``<|endoftext|>``, ``<|system|>``, ``<|user|>``,
    ``<|assistant|>``, ``<|observation|>`` (as in GLM-4.5). Not special: ``<think>``,
    ``</think>``, ``<tool_call>``, ``</tool_call>``, ``<arg_key>``, ``</arg_key>``,
    ``<arg_value>``, ``</arg_value>``, ``<tool_response>``, ``</tool_response>``. A turn
    has no end token: the model ends it with the next role token, ``<|user|>`` after an
    answer and ``<|observation|>`` after tool calls; both, and ``<|endoftext|>``, stop
    generation. Thinking on: the prompt ends ``<|assistant|>`` and the model writes
    ``\\n<think>THOUGHT</think>\\nANSWER``; off: the prompt ends
    ``<|assistant|>\\n<think></think>`` and the model writes ``\\nANSWER``. vLLM's glm45
    parser must then be told ``enable_thinking=False`` (``chat_template_kwargs``), as
    with the real model. Thoughts before the last user message are dropped (rendered as
    the empty block), as GLM-4.5's template does.

kimi_k2 (Kimi-K2-Thinking; parsers: reasoning ``kimi_k2``, tool ``kimi_k2``)
    Special (as in Kimi's tokenizer): ``[BOS]``, ``[EOS]``, ``[PAD]``, ``<|im_end|>``,
    ``<|im_user|>``, ``<|im_assistant|>``, ``<|im_system|>``, ``<|im_middle|>`` and the
    ``<|tool_call...|>`` tokens. Not special: ``<think>``, ``</think>``. Turns end with
    ``<|im_end|>``. Always thinks, as K2-Thinking: the prompt ends
    ``<|im_assistant|>assistant<|im_middle|>`` and the model writes
    ``<think>THOUGHT</think>ANSWER``; no argument switches it. A call's id is Kimi's
    ``functions.NAME:N`` (N counts the conversation's calls), which vLLM's parser reads the
    name from; results are ``## Return of ID``. Tool results carry no ``name`` (Kimi's
    template would write it in place of the role ``tool``), as an OpenAI request sends them.

mistral (Mistral Small 3.1, tokenizer v7; parser: tool ``mistral``, no reasoning)
    Special: ``<unk>``, ``<s>``, ``</s>``, ``<pad>``, ``[INST]``, ``[/INST]``,
    ``[SYSTEM_PROMPT]``, ``[/SYSTEM_PROMPT]``, ``[AVAILABLE_TOOLS]``, ``[/AVAILABLE_TOOLS]``,
    ``[TOOL_CALLS]``, ``[TOOL_RESULTS]``, ``[/TOOL_RESULTS]`` (no ``[ARGS]``: vLLM's
    parser then reads v3-v7 JSON calls). Turns end with ``</s>``. Calls are
    ``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": "ID"}]`` with ids of exactly
    9 alphanumerics (the template raises on any other), written by the model; no thinking.

magistral (Magistral Small 1.2, Tekken tokenizer v13; parsers: reasoning ``mistral``, tool ``mistral``)
    Mistral's tokens plus v13's ``[THINK]``, ``[/THINK]``, ``[ARGS]``, ``[CALL_ID]`` (all special, as in
    Tekken v13; with ``[ARGS]`` in the vocabulary vLLM's parser reads v11+ calls). Its template is
    ``templates/magistral_chat.jinja``, byte for byte the one mistral-common 1.13.1 generates for Magistral
    Small 2509 (``tests/data/templates/magistral_small2509.jinja``; no Jinja template is published): without
    a system message of the row's, the card's system prompt states the protocol. Always thinks, as the
    model does: the prompt ends ``[/INST]`` and the model writes ``[THINK]THOUGHT[/THINK]ANSWER</s>``, or
    ``[THINK]THOUGHT[/THINK][TOOL_CALLS]NAME[ARGS]{...}</s>`` (one ``[TOOL_CALLS]`` per call, no id: regen
    gives each the 9 alphanumerics Mistral's parser takes); results are ``[TOOL_RESULTS]...[/TOOL_RESULTS]``.

gpt_oss (gpt-oss; vLLM names ``openai_gptoss`` / ``openai``, but regen renders and reads it with Harmony)
    Harmony's own vocabulary (o200k_harmony, 201,088 ids) and gpt-oss's published template
    (``templates/gpt_oss_chat.jinja``, byte for byte ``openai/gpt-oss-20b``'s), built by
    ``worker/tiny/harmony_model.py``. Special: every Harmony special token at its own id
    (``<|start|>``, ``<|channel|>``, ``<|message|>``, ``<|end|>``, ``<|call|>``, ``<|return|>``,
    ``<|constrain|>``, ...). A turn is Harmony messages: an ``analysis`` thought, then a ``final``
    answer ending ``<|return|>`` or one call to ``functions.NAME`` ending ``<|call|>``; both stop
    generation. Always reasons, at the run's effort (low, medium, high).

qwen36 (Qwen3.5/3.6; parsers: reasoning ``qwen3``, tool ``qwen3_coder``, as vLLM's Qwen3.6 recipe serves it)
    The one family on the hybrid architecture of its target, ``Qwen3_5ForCausalLM`` (one Gated-DeltaNet
    and one full-attention layer: worker/tiny/hybrid.py), and rendered with Qwen3.6's published template,
    byte for byte (``templates/qwen36_chat.jinja`` = ``tests/data/templates/qwen36.jinja``, its source and
    sha256 in tests/data/templates/SOURCES.md). Qwen3's tokens: special ``<|endoftext|>``,
    ``<|im_start|>``, ``<|im_end|>``; not special ``<think>``, ``</think>``, ``<tool_call>``,
    ``</tool_call>``, ``<tool_response>``, ``</tool_response>``. Turns end with ``<|im_end|>``. Thinking
    on: the prompt ends ``<think>\n`` and the model writes ``THOUGHT\n</think>\n\nANSWER``; off
    (``enable_thinking`` false): the prompt ends ``<think>\n\n</think>\n\n``. Calls are XML,
    ``<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>``;
    results ``<tool_response>`` in a user turn. ``regen submit`` reads it as a qwen3 template.

qwen3 (parsers: reasoning ``qwen3``, tool ``hermes``): see ``worker/tiny/model.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

TEMPLATES_DIR = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Family:
    """What a tiny model of one chat family is made of."""

    name: str
    #: File name of the chat template in ``templates/``.
    template: str
    #: ``special=True`` tokens (the BPE never splits them; decoding can skip them).
    special_tokens: tuple[str, ...]
    #: ``special=False`` added tokens: single ids that stay in decoded text.
    format_tokens: tuple[str, ...]
    bos_token: str | None
    eos_token: str
    pad_token: str
    #: The tokens that stop generation (generation_config's eos_token_id), eos first.
    stop_tokens: tuple[str, ...]
    reasoning_parser: str | None
    tool_parser: str
    #: "switch" (enable_thinking), "always", "never" or "effort" (Harmony's reasoning effort).
    thinking: str
    #: Whether the template writes the end of an assistant turn (``eos_token``); if not,
    #: the model ends its turn with the next role token (``turn_end``).
    template_ends_turn: bool = True
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.6, "top_p": 0.95})
    #: The form of the training conversations' call ids: "call" (``call_N``), "kimi"
    #: (``functions.NAME:N``) or "alnum9" (``callNNNNN``, Mistral's 9 alphanumerics).
    call_ids: str = "call"
    #: Whether the training conversations' tool results name their tool (Kimi's do not).
    tool_result_names: bool = True
    #: The family ``regen submit`` reads off the template (targets/template_probe.py), where it is not ``name``'s
    #: first word (Magistral is a Mistral template that thinks).
    detected_as: str | None = None
    #: The decoder: "qwen3" (dense, worker/tiny/architecture.py) or "qwen3_5" (the hybrid, worker/tiny/hybrid.py).
    architecture: str = "qwen3"

    def call_id(self, name: str, n: int) -> str:
        """The id of the conversation's ``n``-th call (0-based), to ``name``."""
        return {"call": f"call_{n}", "kimi": f"functions.{name}:{n}", "alnum9": f"call{n:05d}"}[self.call_ids]

    @property
    def template_path(self) -> Path:
        return TEMPLATES_DIR / self.template

    @property
    def all_tokens(self) -> tuple[str, ...]:
        return self.special_tokens + self.format_tokens

    def turn_end(self, message: dict[str, Any]) -> str:
        """The token that ends a generated assistant ``message``."""
        if self.template_ends_turn:
            return self.eos_token
        return "<|observation|>" if message.get("tool_calls") else "<|user|>"


# As built by worker/tiny/model.py; listed so all the families answer the same questions.
_QWEN3 = Family(
    name="qwen3", template="qwen3_chat.jinja",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    format_tokens=("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                   "</tool_response>"),
    bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    reasoning_parser="qwen3", tool_parser="hermes", thinking="switch",
    sampling={"temperature": 0.6, "top_p": 0.95, "top_k": 20},
)

SPECS: dict[str, Family] = {
    "qwen3": _QWEN3,
    "llama3": Family(
        name="llama3", template="llama3_chat.jinja",
        special_tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"),
        format_tokens=(),
        bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|finetune_right_pad_id|>",
        stop_tokens=("<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"),
        reasoning_parser=None, tool_parser="llama3_json", thinking="never",
        sampling={"temperature": 0.6, "top_p": 0.9},
    ),
    "deepseek_r1": Family(
        name="deepseek_r1", template="deepseek_r1_chat.jinja",
        special_tokens=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"),
        format_tokens=("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
                       "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                       "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
                       "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
        bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>", pad_token="<｜▁pad▁｜>",
        stop_tokens=("<｜end▁of▁sentence｜>",),
        reasoning_parser="deepseek_r1", tool_parser="deepseek_v3", thinking="always",
    ),
    "glm45": Family(
        name="glm45", template="glm45_chat.jinja",
        special_tokens=("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                        "<|observation|>"),
        format_tokens=("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                       "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>"),
        bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        stop_tokens=("<|endoftext|>", "<|user|>", "<|observation|>"),
        reasoning_parser="glm45", tool_parser="glm45", thinking="switch", template_ends_turn=False,
    ),
    "kimi_k2": Family(
        name="kimi_k2", template="kimi_k2_chat.jinja",
        special_tokens=("[BOS]", "[EOS]", "[PAD]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                        "<|im_system|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
                        "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                        "<|tool_call_end|>"),
        format_tokens=("<think>", "</think>"),
        bos_token="[BOS]", eos_token="<|im_end|>", pad_token="[PAD]", stop_tokens=("<|im_end|>", "[EOS]"),
        reasoning_parser="kimi_k2", tool_parser="kimi_k2", thinking="always",
        call_ids="kimi", tool_result_names=False,
    ),
    "mistral": Family(
        name="mistral", template="mistral_chat.jinja",
        special_tokens=("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                        "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
                        "[/TOOL_RESULTS]"),
        format_tokens=(),
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", stop_tokens=("</s>",),
        reasoning_parser=None, tool_parser="mistral", thinking="never",
        sampling={"temperature": 0.15, "top_p": 1.0}, call_ids="alnum9",
    ),
    "magistral": Family(
        name="magistral", template="magistral_chat.jinja",
        special_tokens=("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                        "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
                        "[/TOOL_RESULTS]", "[THINK]", "[/THINK]", "[ARGS]", "[CALL_ID]"),
        format_tokens=(),
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", stop_tokens=("</s>",),
        reasoning_parser="mistral", tool_parser="mistral", thinking="always",
        # Magistral's card: temperature 0.7, top_p 0.95.
        sampling={"temperature": 0.7, "top_p": 0.95}, call_ids="alnum9", detected_as="mistral",
    ),
    "gpt_oss": Family(
        name="gpt_oss", template="gpt_oss_chat.jinja",
        special_tokens=("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                        "<|start|>", "<|end|>", "<|message|>", "<|call|>"),
        format_tokens=(),
        bos_token="<|startoftext|>", eos_token="<|return|>", pad_token="<|endoftext|>",
        stop_tokens=("<|return|>", "<|call|>", "<|endoftext|>"),
        reasoning_parser="openai_gptoss", tool_parser="openai", thinking="effort",
        sampling={"temperature": 0.6, "top_p": 0.95},
    ),
    # Qwen3's spec with what Qwen3.6 does otherwise: its tokenizer's tokens, turn ends, stops, reasoning parser
    # and thinking switch are Qwen3's, so that the two cannot drift (tests/unit/test_tiny_qwen36.py).
    "qwen36": replace(
        _QWEN3, name="qwen36", template="qwen36_chat.jinja", tool_parser="qwen3_coder",
        # Qwen3.6's card, thinking mode: temperature 0.6, top_p 0.95, top_k 20.
        sampling={"temperature": 0.6, "top_p": 0.95, "top_k": 20}, detected_as="qwen3", architecture="qwen3_5",
    ),
}

#: The vLLM parsers (``--reasoning-parser``, ``--tool-call-parser``) each tiny family is made for.
FAMILIES: dict[str, dict[str, str | None]] = {
    name: {"reasoning_parser": spec.reasoning_parser, "tool_parser": spec.tool_parser}
    for name, spec in SPECS.items()
}

DEFAULT_FAMILY = "qwen3"


def family_spec(name: str) -> Family:
    """The spec of family ``name``; ValueError for an unknown one."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown tiny-model family {name!r}; choose one of {', '.join(SPECS)}") from None
