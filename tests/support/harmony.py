"""Harmony's reference rendering of a gpt-oss conversation, written with openai_harmony's own message API.

The Harmony tests (tests/unit/test_harmony.py, tests/integration/test_harmony_fidelity.py) compare
regen's prompts with this, not with regen's conversion: the system message (the run's effort and
a fixed date) and the developer message (the first system message's text as instructions, and the
tools) that open every prompt, built here message by message.
"""

from __future__ import annotations

from typing import Any

#: The system messages' date in the Harmony tests (vLLM's VLLM_SYSTEM_START_DATE, as a run records it).
DATE = "2026-08-05"


def reference_head(*, effort: str = "medium", instructions: str | None = None, tools: list[dict] | None = None,
                   date: str = DATE) -> list[Any]:
    """The system message, and the developer message where there are instructions or tools."""
    from openai_harmony import (
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        ToolDescription,
    )

    system = SystemContent.new().with_reasoning_effort(ReasoningEffort(effort.capitalize()))
    head = [Message.from_role_and_content(Role.SYSTEM, system.with_conversation_start_date(date))]
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools([ToolDescription.new(
                t["function"]["name"], t["function"].get("description") or "",
                parameters=t["function"].get("parameters")) for t in tools])
        head.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    return head
