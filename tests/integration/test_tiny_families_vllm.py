"""The trained tiny llama3, deepseek_r1 and glm45 models in vLLM's CPU build: their output parses.

One engine per family. As in test_tiny_model_vllm.py the engine runs in a child
Python executing this file (the ``__main__`` block), so pytest's process never
imports vLLM. The child also parses every completion as vLLM's OpenAI server
does: the family's parsers composed by ``ParserManager.get_parser``, built with the
request's tools and ``chat_template_kwargs``, on the text decoded with
``skip_special_tokens=False`` less the end-of-turn token.

The bars are loose (the models are tiny and briefly trained; measured rates are
printed) but each can fail: a model or template that broke the format would not
reach them. As a control the child first parses the completions the model was
trained on: those must parse exactly.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

ENGINE_TIMEOUT_S = 900
MAX_MODEL_LEN = 4096
#: Held-out conversations: the training data uses the build seed (0), these another.
EVAL_SEED = 4321
#: Prompts per kind: tools offered and a call wanted; a tool result to answer; plain chat.
N_CALL, N_AFTER_CALL, N_CHAT = 12, 4, 8


def run_child(request: dict) -> dict:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, __file__], input=json.dumps(request), capture_output=True, text=True,
                          env=env, timeout=ENGINE_TIMEOUT_S)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"engine child failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])


def _parse(parser_cls, tokenizer, text: str, tools, thinking: bool) -> dict:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "-"}], tools=tools or None)
    parser = parser_cls(tokenizer, request.tools, chat_template_kwargs={"enable_thinking": thinking})
    reasoning, content, calls = parser.parse(text, request, enable_auto_tools=True)
    return {"reasoning": reasoning, "content": content,
            "calls": [{"name": c.name, "arguments": c.arguments} for c in calls or []]}


def engine_main() -> None:
    """The child: parse the controls, generate, parse the generations; print one JSON line."""
    request = json.loads(sys.stdin.read())
    from vllm import LLM, SamplingParams
    from vllm.parser import ParserManager

    start = time.monotonic()
    llm = LLM(model=request["model"], max_model_len=MAX_MODEL_LEN, dtype="bfloat16", enforce_eager=True,
              enable_chunked_prefill=False, seed=0)
    load_s = time.monotonic() - start
    tokenizer = llm.get_tokenizer()
    parser_cls = ParserManager.get_parser(tool_parser_name=request["tool_parser"],
                                          reasoning_parser_name=request["reasoning_parser"],
                                          enable_auto_tools=True, tokenizer=tokenizer)
    controls = [_parse(parser_cls, tokenizer, c["text"], c["tools"], c["thinking"]) for c in request["controls"]]

    prompts = [p["prompt_token_ids"] for p in request["prompts"]]
    sampling = [SamplingParams(temperature=0.6, top_p=0.95, max_tokens=600, seed=i, skip_special_tokens=False)
                for i in range(len(prompts))]
    start = time.monotonic()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], sampling, use_tqdm=False)
    generate_s = time.monotonic() - start
    results = []
    for prompt, out in zip(request["prompts"], outputs, strict=True):
        completion = out.outputs[0]
        text = completion.text
        for end in request["turn_ends"]:  # the end-of-turn token, if the detokenizer kept it
            text = text.removesuffix(end)
        results.append({"text": text, "finish_reason": completion.finish_reason,
                        "tokens": len(completion.token_ids),
                        "last_token": tokenizer.convert_ids_to_tokens(completion.token_ids[-1]),
                        **_parse(parser_cls, tokenizer, text, prompt["tools"], prompt["thinking"])})
    print(json.dumps({"load_s": load_s, "generate_s": generate_s, "controls": controls, "outputs": results}),
          flush=True)


def eval_examples(spec):
    """Held-out conversations of each kind: (kind, example)."""
    from worker.tiny import family_model

    rng = random.Random(EVAL_SEED)
    wanted = {"call": N_CALL, "after_call": N_AFTER_CALL, "chat": N_CHAT}
    out = []
    while any(wanted.values()):
        example = family_model.family_example(spec, rng)
        if example.tools is None:
            kind = "chat"
        else:
            kind = "call" if example.messages[-2]["role"] == "user" else "after_call"
        if wanted[kind]:
            wanted[kind] -= 1
            out.append((kind, example))
    return out


@pytest.mark.parametrize("family", ["llama3", "deepseek_r1", "glm45"])
def test_the_trained_family_model_writes_what_its_vllm_parsers_parse(tiny_family_model, family):
    from transformers import AutoTokenizer

    from worker.tiny import family_model
    from worker.tiny.families import SPECS

    spec = SPECS[family]
    start = time.monotonic()
    model = tiny_family_model(family, "trained")
    print(f"\n{family}: trained model ready in {time.monotonic() - start:.1f} s (cached after the first build)")
    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    examples = eval_examples(spec)
    ends = sorted(set(spec.stop_tokens), key=len, reverse=True)

    controls = []
    for _, example in examples:
        _, completion = family_model.completion_text(spec, tok, example)
        controls.append({"text": completion.removesuffix(spec.turn_end(example.messages[-1])),
                         "tools": example.tools, "thinking": example.enable_thinking})
    prompts = [{"prompt_token_ids": list(tok.apply_chat_template(
                    example.messages[:-1], tools=example.tools, add_generation_prompt=True, tokenize=True,
                    return_dict=True, enable_thinking=example.enable_thinking)["input_ids"]),
                "tools": example.tools, "thinking": example.enable_thinking} for _, example in examples]
    report = run_child({"model": str(model), "tool_parser": spec.tool_parser, "reasoning_parser": spec.reasoning_parser,
                        "controls": controls, "prompts": prompts, "turn_ends": ends})

    # The control: what the model was trained to write parses exactly.
    for (_, example), parsed in zip(examples, report["controls"], strict=True):
        last = example.messages[-1]
        assert [(c["name"], json.loads(c["arguments"])) for c in parsed["calls"]] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in last.get("tool_calls") or []], parsed
        if spec.thinking == "never" or not example.enable_thinking:
            assert not parsed["reasoning"], parsed
        elif last.get("reasoning_content"):
            assert parsed["reasoning"].strip() == last["reasoning_content"], parsed
        if last["content"]:
            assert parsed["content"].strip() == last["content"], parsed

    outputs = report["outputs"]
    stops = sum(o["finish_reason"] == "stop" and o["last_token"] in spec.stop_tokens for o in outputs)
    thinks = [(ex, o) for (_, ex), o in zip(examples, outputs, strict=True)
              if spec.thinking == "always" or (spec.thinking == "switch" and ex.enable_thinking)]
    # A thought that is closed (a thought never closed is all reasoning to the parsers, content lost).
    reasoned = sum("</think>" in o["text"] and bool((o["reasoning"] or "").strip()) for _, o in thinks)
    leaked = sum("<think>" in (o["content"] or "") or "</think>" in (o["content"] or "") for o in outputs)
    if spec.thinking == "never":
        assert all(o["reasoning"] is None for o in outputs)
    calls = [(ex, o) for (kind, ex), o in zip(examples, outputs, strict=True) if kind == "call"]
    called_offered = sum(bool(o["calls"]) and all(c["name"] in {t["function"]["name"] for t in ex.tools}
                                                  for c in o["calls"]) for ex, o in calls)
    invented = sum(c["name"] not in {t["function"]["name"] for t in ex.tools or []}
                   for (_, ex), o in zip(examples, outputs, strict=True) for c in o["calls"])
    chats_with_calls = sum(bool(o["calls"]) for (kind, _), o in zip(examples, outputs, strict=True) if kind == "chat")
    tokens = sum(o["tokens"] for o in outputs)
    print(f"{family}: vLLM load {report['load_s']:.1f} s, {tokens} tokens in {report['generate_s']:.1f} s; "
          f"stops {stops}/{len(outputs)}, reasoning split {reasoned}/{len(thinks)}, think tags in content "
          f"{leaked}, calls of offered tools {called_offered}/{len(calls)}, invented names {invented}, "
          f"chats with calls {chats_with_calls}/{N_CHAT}")
    for (kind, _), o in list(zip(examples, outputs, strict=True))[:: max(1, len(outputs) // 6)]:
        print(f"  [{kind}] {o['text'][:160]!r}")
    for (kind, ex), o in zip(examples, outputs, strict=True):
        offered = {t["function"]["name"] for t in ex.tools or []}
        if kind == "call" and not (o["calls"] and all(c["name"] in offered for c in o["calls"])):
            print(f"  bad call (offered {sorted(offered)}, asked {ex.messages[-2]['content']!r}): {o['text'][-160:]!r}")
        if o["finish_reason"] != "stop" or o["last_token"] not in spec.stop_tokens:
            print(f"  no stop [{kind}] {o['tokens']} tokens, {o['finish_reason']}, last {o['last_token']!r}: "
                  f"{o['text'][-120:]!r}")

    assert stops >= 0.8 * len(outputs)
    if thinks:
        assert reasoned >= 0.7 * len(thinks)
    assert leaked <= 0.2 * len(outputs)
    assert called_offered >= 0.5 * len(calls)
    assert chats_with_calls <= N_CHAT // 4


if __name__ == "__main__":
    engine_main()
