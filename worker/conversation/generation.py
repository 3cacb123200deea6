"""Generate one batch on the shared engine: each conversation as soon as it is admitted, each turn on policy.

Runs on the engine's event loop. Every conversation of the batch waits for a slot
at the engine's admission gate (worker/engine/admission.py: oldest batch first) and keeps
it for all its turns, so each next turn is submitted the moment the previous one
finishes (no per-batch barrier between turns) and the engine takes the next held
conversation whenever one ends. A sample that cannot be generated becomes a failed
row with its reason; only an engine failure fails the batch.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ledger.hashing import history_kept, sample_seed, thinking_enabled
from ledger.quality import Thresholds
from targets.harmony import stop_ids as harmony_stop_ids
from worker.conversation.dialogue import SampleError, regenerate_conversation
from worker.conversation.rendering import Renderer
from worker.engine.host import EngineDead, EngineHost
from worker.engine.isolation import Flight, isolation_lock
from worker.engine.loop_watch import LoopWatch

#: Sampling keys passed to vLLM's SamplingParams from the run's record. ``ignore_eos`` is
#: never in a run regen submit builds (no option sets it, build_run_config leaves it out):
#: only the benchmarks put it into their run's record, with ``--ignore-eos``, so a model
#: that ends early still generates the workload's lengths. Being in the record, it is in
#: the run's hash and in every output row's ``sampling``: such a run cannot pass for a real one.
ENGINE_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                        "frequency_penalty", "ignore_eos")
#: The keys a thinking mode's profile sets (producer/sampling_profiles.py PROFILE_KEYS).
PROFILE_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty")


def mode_sampling(sampling: dict, thinking: bool) -> dict:
    """The run's record as this sample's mode samples: a ``--thinking mix`` run's samples without thinking take the
    values of its ``sampling_no_thinking`` profile (all of them: a key it lacks is vLLM's default there)."""
    other = sampling.get("sampling_no_thinking")
    out = {k: v for k, v in sampling.items() if k != "sampling_no_thinking"}
    if thinking or not other:
        return out
    return {**{k: v for k, v in out.items() if k not in PROFILE_KEYS}, **other}


def engine_sampling(run_sampling: dict, *, seed: int, max_tokens: int) -> dict[str, Any]:
    params = {k: run_sampling[k] for k in ENGINE_SAMPLING_KEYS if k in run_sampling}
    # generation_config.json and the run record use 0 for "no top-k"; so does vLLM.
    params["top_k"] = max(0, int(params.get("top_k") or 0))
    # No incremental detokenization in vLLM's frontend: regen's parsers decode each
    # completion once from its ids (targets/turn_parsers.py), while vLLM's per-token
    # decoding ran on the engine's event loop (11% of that thread's CPU on the CPU
    # benchmark, docs/performance.md). Nothing regen asks of vLLM needs text: its stops
    # are token ids.
    params.update(seed=seed, max_tokens=max_tokens, detokenize=False)
    return params


async def generate_sample(engine: EngineHost, renderer: Renderer, sample: dict, run: dict) -> dict:
    sampling = run["sampling"]
    sid = sample["sample_id"]
    thinking = thinking_enabled(sampling.get("thinking", "on"), float(sampling.get("thinking_off_share", 0.0)), sid)
    run_seed = int(sampling.get("seed", 0))

    parser = renderer.parser_for(sampling)
    thinking_arg = renderer.thinking_arg_for(sampling)
    # gpt-oss (targets/harmony.py): its actions end with <|call|> or <|return|>, whatever generation_config says.
    stops = {"stop_token_ids": harmony_stop_ids()} if renderer.is_harmony(sampling) else {}
    # Earlier turns keep their thoughts (Qwen3.6's preserve_thinking): the model's own, regenerated ones, since
    # the context holds only what it generated (worker/conversation/dialogue.py).
    history_arg = renderer.history_arg_for(sampling)
    preserve = (history_kept(str(sampling.get("preserve_thinking") or "off"),
                             float(sampling.get("preserve_thinking_share", 0.0)), sid) if history_arg else None)
    template_kwargs = {history_arg: preserve} if history_arg else None

    def render(messages: list[dict], tools: list[dict] | None) -> list[int]:
        return renderer.render(messages, tools, thinking=thinking, thinking_arg=thinking_arg,
                               harmony_options=renderer.harmony_options(run), template_kwargs=template_kwargs)

    # An optional per-sample budget (bench/throughput.py's long-tailed lengths) can only
    # lower the run's max_tokens, never raise it.
    budget = min(int(sampling["max_tokens"]), int(sample.get("max_tokens") or sampling["max_tokens"]))

    used = mode_sampling(sampling, thinking)   # the profile of this sample's thinking mode
    # Loops stopped while generated (worker/engine/loop_watch.py), by the run's own repetition thresholds: on
    # unless the run says --stop-loops off; only an engine that streams ids to a watch (EngineHost) takes one.
    thresholds = Thresholds.from_json(run.get("quality_thresholds")) if sampling.get("stop_loops", "on") != "off" \
        and getattr(engine, "watches_loops", False) else None

    async def generate(prompt_ids: list[int], turn: int):
        room = renderer.max_model_len - len(prompt_ids)
        params = engine_sampling(used, seed=sample_seed(run_seed, sid, turn),
                                 max_tokens=max(1, min(budget, room)))
        if thresholds is None:
            return await engine.generate(prompt_ids, {**params, **stops})
        watch = LoopWatch(thresholds.repetition_ngram, thresholds.repetition_min_tokens,
                          thresholds.repetition_max_share)
        return await engine.generate(prompt_ids, {**params, **stops}, loop_watch=watch)

    row: dict[str, Any] = {
        # Whose row it is, beside provenance.config_hash: checked before a shard found at a batch's key is
        # committed (ledger/output_check.py).
        "run": run.get("name"),
        "sample_id": sid,
        "source": sample.get("source"),
        "input_messages": sample["messages"],
        "tools": sample.get("tools"),
        "thinking": thinking,
        "preserve_thinking": preserve,
        "model": run["model"],
        "sampling": {**used, "seed": sample_seed(run_seed, sid, 0)},
        "provenance": run["provenance"],
        "parser": parser.description,
    }
    try:
        result = await regenerate_conversation(sample, thinking=thinking, render=render, generate=generate,
                                               think_end_id=parser.think_end_id, parser=parser,
                                               on_tool_mismatch=sampling.get("on_tool_mismatch", "splice"))
    except SampleError as e:
        row.update(status="failed", error={"reason": e.reason, "detail": e.detail}, messages=None, events=[],
                   finish_reason=None, stop_reason=None, turns=0,
                   usage={"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "answer_tokens": 0},
                   tool_calls=0, tool_args_differ=0)
        return row
    row.update(
        status="done",
        error=None,
        messages=result.messages,
        events=result.events,
        finish_reason=result.finish_reason,
        stop_reason=result.stop_reason,
        turns=result.turns,
        tool_calls=result.tool_calls,
        # Calls followed by a source result that answers other arguments (ledger/quality.py tool_args_differ).
        tool_args_differ=sum(d["spliced"] for e in result.events for d in e.get("tool_args_differ", [])),
        usage={"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
               "reasoning_tokens": result.reasoning_tokens, "answer_tokens": result.answer_tokens},
    )
    return row


def engine_crash_row(sample: dict, run: dict, crashes: int, *, fake: bool = False) -> dict:
    """The failed row of a sample found to kill the engine (ledger/crash_suspects.py): not run again."""
    from ledger.crash_suspects import ENGINE_CRASH, ISOLATED_CRASHES_TO_FAIL

    detail = (f"the engine died with this sample in flight {crashes} times, {ISOLATED_CRASHES_TO_FAIL} of them "
              "as the only suspect in flight on its engine")
    row = {"run": run.get("name"), "sample_id": sample["sample_id"], "source": sample.get("source"),
           "input_messages": sample["messages"], "tools": sample.get("tools"), "thinking": False,
           "model": run["model"], "sampling": run["sampling"], "provenance": run["provenance"], "parser": None,
           "status": "failed", "error": {"reason": ENGINE_CRASH, "detail": detail}, "messages": None, "events": [],
           "finish_reason": None, "stop_reason": None, "turns": 0, "tool_calls": 0, "tool_args_differ": 0,
           "usage": {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "answer_tokens": 0}}
    if fake:
        from worker.engine.fake import FAKE_ENGINE_VERSION

        row["fake_engine"] = FAKE_ENGINE_VERSION
    return row


async def generate_batch(engine: EngineHost, renderer: Renderer, samples: list[dict], run: dict,
                         flight: Flight | None = None) -> list[dict]:
    """All samples of one batch, each once admitted. Raises EngineDead if the engine fails.

    ``flight`` (worker/engine/isolation.py): its condemned samples become failed rows, its
    suspects run isolated, and it says which conversations were in flight should the engine die.
    """
    ticket = engine.new_batch_ticket()
    flight = flight if flight is not None else Flight()

    fake = getattr(engine, "fake", False)  # worker/engine/fake.py: a benchmark device, no vLLM

    async def on_engine(index: int, sample: dict, *, isolated: bool) -> dict:
        sid = sample["sample_id"]
        async with engine.admission.slot((ticket, index)):
            flight.started.add(sid)
            if isolated:
                flight.isolated.add(sid)
            if fake:
                from worker.engine.fake import fake_sample

                row = await fake_sample(engine, sample, run)
            else:
                row = await generate_sample(engine, renderer, sample, run)
            # Only once it ended: a conversation an engine death unwinds stays in flight, a suspect.
            flight.started.discard(sid)
            flight.isolated.discard(sid)
            return row

    async def admitted(index: int, sample: dict) -> dict:
        sid = sample["sample_id"]
        if sid in flight.condemned:
            return engine_crash_row(sample, run, flight.condemned[sid], fake=fake)
        if sid in flight.isolate:
            async with isolation_lock(engine):
                return await on_engine(index, sample, isolated=True)
        return await on_engine(index, sample, isolated=False)

    tasks = [asyncio.ensure_future(admitted(i, s)) for i, s in enumerate(samples)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # Cancellation (shutdown, fencing), an engine failure or a hand-back (HandedBack:
        # withdrawn before it started): abort every request of the batch, so the engine's
        # slots go to batches that will be kept.
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        engine.admission.forget(ticket)


__all__ = ["generate_batch", "generate_sample", "EngineDead"]
