"""The engine half of ``regen estimate``: generate a drawn sample exactly as the workers would.

    python -m worker.engine.pilot --samples SAMPLE.jsonl --run RUN.json --out RESULTS.json [--engine-arg k=v ...]
                           [--in-flight N] [--settled-share S] [--lengths-only]

``SAMPLE.jsonl`` holds normalised conversations (docs/CONTRACTS.md), ``RUN.json``
the run as the ledger would hand it to a worker (``model``, ``sampling`` record,
``provenance``). Every conversation goes through :func:`worker.conversation.generation.generate_batch`
on an :class:`worker.engine.host.EngineHost` with the workers' default engine arguments,
so the chat template, thinking mode, per-sample seeds, turn-by-turn on-policy
generation and token counting are the workers' own.

Throughput is measured with the engine as full as in a long run: ``--in-flight``
conversations (default the engine's ``max_num_seqs``) are kept in it, topped up with
repeats of finished samples once every sample has started, until the last sample
ends (see :func:`probe_samples`). A small sample all submitted at once would spend
most of its time draining, which a 1M-row run never does.

``--lengths-only`` (``regen estimate --lengths-only``) generates the samples and nothing
else: no repeats, no settled phase, no drain, so no throughput (``tokens_per_s`` is None and
``rate_measured`` false). The settled phase lasts as long as the longest sample (times
``--settled-share``, 1 by default), so this halves the probe where the lengths are all that
is asked for (with 32K-token thinking traces on a 32B target, ~40 minutes of an H200).

The results file holds one record per conversation (tokens, finish reason, whether
it was cut at max_tokens, when it finished) and the engine's throughput, both over
the full-engine window (``tokens_per_s``) and as the sample's own output tokens from
the first submit to the last completion (``first_to_last_tokens_per_s``).

The producer runs this as a subprocess: it never imports vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledger.errors import ConfigError
from worker.conversation.generation import generate_batch
from worker.conversation.rendering import Renderer
from worker.engine.admission import HandedBack
from worker.engine.args import parse_engine_args
from worker.engine.host import EngineHost
from worker.engine.mtp import AcceptanceRecorder, mtp_engine_args
from worker.engine.probe_progress import ProbeProgress, announce
from worker.engine.probe_timeline import POLL_S, drain_phase, full_engine_window, start_phase, window_rate
from worker.engine.stats import attach

log = logging.getLogger("regen.probe")

#: The settled phase's length over the samples' phase. As long again by default. bench/probe_mix.py
#: (a renewal simulation of a long-tailed workload) has the engine's mix a long run's already at
#: the samples' end, so a shorter window should only be noisier; the one GPU probe that measured
#: both ran its first half 2.6% faster than the whole (docs/estimate.md, --probe-settled).
SETTLED_SHARE = 1.0
MAX_SETTLED_SHARE = 4.0
#: vLLM's Prometheus counter of generated tokens (filled when the engine logs stats).
GENERATED_TOKENS_METRIC = "vllm:generation_tokens"


def sample_record(row: dict[str, Any], finished_s: float, started_s: float = 0.0) -> dict[str, Any]:
    """What the estimate needs of one generated conversation (an output row of generate_sample)."""
    usage = row["usage"]
    events = row.get("events") or []
    return {
        "sample_id": row["sample_id"],
        "status": row["status"],
        "turns": row.get("turns") or 0,
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        # None when the tokenizer has no </think>: then every token counts as answer.
        "reasoning_tokens": usage.get("reasoning_tokens") or 0,
        "answer_tokens": (usage["answer_tokens"] if usage.get("answer_tokens") is not None
                          else usage["completion_tokens"]),
        "finish_reasons": [e["finish_reason"] for e in events],
        "truncated": any(e["finish_reason"] == "length" for e in events),
        "error": row["error"]["reason"] if row.get("error") else None,
        "finished_s": round(finished_s, 4),
        # Its own time in the engine, queueing behind other samples excluded.
        "duration_s": round(finished_s - started_s, 4),
    }


def repeat_of(sample: dict[str, Any], n: int) -> dict[str, Any]:
    """Sample ``sample`` again as repeat ``n``: another id (so another seed), and a prompt the
    engine's prefix cache has not seen.

    A run's prompts are all different; a repeat's would be the very prompt of a sample
    already in the engine, prefilled for free from the prefix cache, and a probe of repeats
    measured an engine without prefill: 20,292 tok/s on an H200 where the run it estimated
    made 15,932 (docs/estimate.md). A marker at the start of the first user message makes
    every block after it new, as a fresh prompt's are, while the system prompt and tool
    definitions before it stay shared, as they are across a run's conversations.
    """
    marker = f"({n}) "
    messages, marked = [], False
    for message in sample["messages"]:
        if not marked and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                message, marked = {**message, "content": marker + content}, True
            elif isinstance(content, list):
                message, marked = {**message, "content": [{"type": "text", "text": marker}, *content]}, True
        messages.append(message)
    return {**sample, "sample_id": f"{sample['sample_id']}#repeat{n}", "messages": messages}


def generated_tokens_reader() -> Callable[[], float | None]:
    """The engine's own count of generated tokens (vLLM's Prometheus counter), or None without it.

    It counts tokens as they are generated, so a throughput window can start and end
    mid-conversation; counting finished conversations instead would miss the tokens
    of those still running at the end.
    """
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return lambda: None

    def read() -> float | None:
        values = [sample.value for metric in REGISTRY.collect() if metric.name == GENERATED_TOKENS_METRIC
                  for sample in metric.samples if sample.name.endswith("_total")]
        return sum(values) if values else None

    return read


async def probe_samples(engine: EngineHost, renderer: Renderer, samples: list[dict], run: dict, *,
                        in_flight: int, measure_rate: bool = True,
                        settled_share: float = SETTLED_SHARE) -> dict[str, Any]:
    """Generate every sample, keeping ``in_flight`` conversations in the engine, and time it.

    All samples start at once (up to ``in_flight``); whenever a conversation ends another
    starts, and once every sample has started, *repeats* of samples (with another id, so
    other seeds; never of one that failed) take the free places until the last sample finishes.
    The engine is thus as full as in a long run, where the queue never runs dry. Then:

    * settled: repeats keep it full for as long again (the time the last sample took, times
      ``settled_share``), the engine holding a long run's mix of lengths and ages; the
      throughput is measured over this phase only;
    * drain: nothing more starts, the repeats not yet started are dropped, and those
      still running finish, as a run's last conversations do when its queue is empty,
      and that is measured (``drain_s``, ``drain_tokens``, ``drain_loss_s``: see
      :func:`~worker.engine.probe_timeline.drain_phase`).

    The probe thus takes about 1 + ``settled_share`` times its longest conversation plus one tail. Repeats'
    results are not kept: per-sample records are the samples' own. Without
    ``measure_rate`` only the samples run (no repeats, so neither phase), and the rate
    and its start-up and drain figures are None.

    Returns:
        ``{"samples": [...], "output_tokens", "wall_s", "tokens_per_s",
        "first_to_last_tokens_per_s", "peak_in_engine", "repeats", "throughput_window_s",
        "settled_share", "samples_phase_s", "settled_phase_s", "settled_first_half_tokens_per_s",
        "drain_s", "drain_tokens", "drain_loss_s", "drain_unstarted_aborted"}``.
        ``tokens_per_s`` is the engine's generated tokens over the settled phase; without
        vLLM's token counter it falls back to the tokens of the conversations finished by
        the last sample's end over that time.

    Raises:
        EngineDead: the engine failed (the probe has no result then).
    """
    read_generated = generated_tokens_reader()
    t0 = time.monotonic()
    finished: dict[int, float] = {}
    started: dict[int, float] = {}
    rows: dict[int, dict] = {}
    timeline: list[tuple[float, float | None]] = [(0.0, read_generated())]
    repeat_tokens = 0
    repeats = 0
    peak = 0
    pending = list(range(len(samples)))[::-1]  # popped from the end: sample order
    failed: set[int] = set()  # samples that failed (template error...): never repeated
    rng = random.Random(0)
    running: dict[asyncio.Future, int | None] = {}
    progress = ProbeProgress(len(samples))
    progress.phase("samples", f"{len(samples)} samples generating, {in_flight} conversations at a time")

    def start_next() -> bool:
        nonlocal repeats
        if pending:
            index = pending.pop()
            sample, key = samples[index], index
            started[index] = time.monotonic() - t0
        elif measure_rate and len(failed) < len(samples):
            repeats += 1
            original = samples[rng.choice([i for i in range(len(samples)) if i not in failed])]
            sample, key = repeat_of(original, repeats), None
        else:
            return False
        # One sample per generate_batch call: the workers' code path, and each
        # conversation's end is known.
        running[asyncio.ensure_future(generate_batch(engine, renderer, [sample], run))] = key
        return True

    while len(running) < in_flight and start_next():
        pass
    try:
        while len(finished) < len(samples):
            done, _ = await asyncio.wait(list(running), timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
            now = time.monotonic() - t0
            timeline.append((now, read_generated()))
            peak = max(peak, engine.num_unfinished())
            progress.tick(len(finished), len(running))
            for future in done:
                key = running.pop(future)
                (row,) = future.result()
                if key is None:
                    repeat_tokens += row["usage"]["completion_tokens"]
                else:
                    rows[key], finished[key] = row, now
                    if row["status"] != "done" or row["usage"]["completion_tokens"] == 0:
                        failed.add(key)
            while len(running) < in_flight and len(finished) < len(samples) and start_next():
                pass
        # Settled: the samples started together, so until the last of them ends the engine
        # holds younger (shorter) conversations than a long run's, whose steps read less KV
        # cache. Kept full with repeats for as long again, the mix in the engine is a long
        # run's (length-biased, every age), and that is the phase measured. (Nothing runs
        # here when every sample failed: there is nothing to repeat.)
        settled_from = time.monotonic() - t0
        tokens_by_last_sample = repeat_tokens + sum(r["usage"]["completion_tokens"] for r in rows.values())
        settled_until = (1 + settled_share) * settled_from
        if running:
            progress.phase("settled", f"every sample done; repeats keep the engine full until {settled_until:.0f} s, "
                                      "the throughput measured meanwhile")
        while running and time.monotonic() - t0 < settled_until:
            done, _ = await asyncio.wait(list(running), timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
            timeline.append((time.monotonic() - t0, read_generated()))
            peak = max(peak, engine.num_unfinished())
            progress.tick(len(finished), len(running))
            for future in done:
                running.pop(future)
                (row,) = future.result()
                repeat_tokens += row["usage"]["completion_tokens"]
            while len(running) < in_flight and start_next():
                pass
        # The drain: nothing more starts, the repeats still running finish, as a run's last
        # conversations do when its queue is empty. What that costs against a full engine is
        # measured here rather than guessed (see drain_phase). The repeats still waiting, at the gate
        # or in vLLM's queue, never started, are dropped first: at a run's end that queue is
        # worked through at the full engine's rate, time that loses nothing, and where the cache
        # holds fewer than ``in_flight`` it is most of the drain (for the 32B shape on an H200,
        # ~1,250 of 1,536 wait: ~8 minutes at the full rate, by arithmetic). The conversations
        # still running when it empties are as these are now, every age of a full engine, so the
        # tail measured is the same one (bench/probe_drain.py compares the two).
        drain_started = time.monotonic() - t0
        drain_aborted = await engine.abort_unstarted() if measure_rate and running else 0
        if running:
            progress.phase("drain", f"nothing more starts; {len(running)} conversations finishing")
        while running:
            done, _ = await asyncio.wait(list(running), timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
            timeline.append((time.monotonic() - t0, read_generated()))
            for future in done:
                running.pop(future)
                if not isinstance(future.exception(), HandedBack):  # dropped unstarted at the gate
                    future.result()
    finally:
        for future in running:
            future.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    wall_s = max(finished.values()) if finished else 0.0
    records = [sample_record(rows[i], finished[i], started[i]) for i in range(len(samples))]
    output_tokens = sum(r["completion_tokens"] for r in records)
    window = full_engine_window(timeline, settled_from, drain_started) if measure_rate else None
    if not measure_rate:
        # No repeats ran, so nothing was measured with the engine full: no rate rather than
        # the sample's first-to-last one, which understates a full engine.
        tokens_per_s, window_s = None, None
    elif window is not None:
        tokens_per_s, window_s = window_rate(window), window[1][0] - window[0][0]
    else:
        tokens_per_s = tokens_by_last_sample / wall_s if wall_s > 0 else None
        window_s = wall_s
    # The rate over the settled phase's first half alone: what a probe run with half the share would
    # have measured, from the same engine (docs/estimate.md, --probe-settled).
    half = (full_engine_window(timeline, settled_from, (settled_from + drain_started) / 2)
            if window is not None else None)
    return {
        **drain_phase(timeline, drain_started, tokens_per_s if window is not None else None),
        **start_phase(timeline, settled_from, tokens_per_s if window is not None else None),
        "samples": records,
        "output_tokens": output_tokens,
        "wall_s": round(wall_s, 4),
        "tokens_per_s": round(tokens_per_s, 3) if tokens_per_s else None,
        "first_to_last_tokens_per_s": round(output_tokens / wall_s, 3) if wall_s > 0 else None,
        "throughput_window_s": round(window_s, 3) if window_s is not None else None,
        "rate_measured": measure_rate,
        "in_flight": in_flight,
        "peak_in_engine": peak,
        "repeats": repeats,
        "settled_share": settled_share if measure_rate else None,
        # The phases' lengths as run: the samples' (until the last ended) and the settled one's.
        "samples_phase_s": round(settled_from, 3),
        "settled_phase_s": round(drain_started - settled_from, 3) if measure_rate else None,
        "settled_first_half_tokens_per_s": round(window_rate(half), 3) if half is not None else None,
        "repeat_tokens": repeat_tokens,
        # Repeats dropped unstarted when the drain began (None: this vLLM cannot tell; the
        # drain then worked through them, which takes longer and measures the same loss).
        "drain_unstarted_aborted": drain_aborted,
    }


def check_settled_share(share: float) -> float:
    """``share`` if a settled phase can be that long against the samples' phase, else ValueError."""
    if not 0 < share <= MAX_SETTLED_SHARE:
        raise ValueError(f"the settled share must be above 0 and at most {MAX_SETTLED_SHARE:g}, not {share:g}")
    return share


def read_samples(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_probe(samples: list[dict], run: dict, engine_args: dict[str, Any], in_flight: int | None = None,
              *, measure_rate: bool = True, settled_share: float = SETTLED_SHARE, mtp: int = 0) -> dict[str, Any]:
    """Load the run's model in an engine, generate ``samples``, return the results (see module doc).

    ``in_flight`` conversations are kept in the engine (default: its ``max_num_seqs``,
    a full engine). Stats are on so the engine's generated-token counter can be read.
    ``measure_rate=False``: the samples only, no throughput (``--lengths-only``). ``mtp``: tokens the
    model's MTP head drafts a step (worker/engine/mtp.py), its acceptance recorded; 0: none.
    """
    engine_args = {**engine_args, **mtp_engine_args(mtp), "disable_log_stats": False}
    if in_flight is not None and in_flight < 1:
        raise ValueError("in_flight must be at least 1")
    check_settled_share(settled_share)
    engine = EngineHost(model=run["model"], engine_args=engine_args)
    load_start = time.monotonic()
    announce(f"loading {run['model']} in the engine (minutes for a large model)")
    engine.start()
    announce(f"engine ready in {time.monotonic() - load_start:.0f} s")
    acceptance = attach(engine._llm, AcceptanceRecorder()) if mtp else None
    try:
        load_s = time.monotonic() - load_start
        # As full as a worker keeps it: its admission level (worker/engine/admission.py).
        in_flight = in_flight or engine.admission.level
        renderer = Renderer(engine.tokenizer, engine.max_model_len)
        result = engine.submit(probe_samples(engine, renderer, samples, run, in_flight=in_flight,
                                             measure_rate=measure_rate, settled_share=settled_share)).result()
    finally:
        engine.shutdown()
    return {
        **result,
        "model": run["model"],
        "engine_version": engine.engine_version,
        "max_model_len": engine.max_model_len,
        "engine_args": {**engine.chosen_args, "max_num_seqs": engine.max_num_seqs},
        "load_s": round(load_s, 2),
        "sampling": run["sampling"],
        **({"mtp": {"tokens": mtp, **acceptance.as_record()}} if acceptance is not None else {}),
    }


def write_json_atomically(path: str | Path, data: dict) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m worker.engine.pilot", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", required=True, help="normalised conversations, JSON lines")
    p.add_argument("--run", required=True, help="the run as JSON: model, sampling, provenance")
    p.add_argument("--out", required=True, help="where to write the results (JSON)")
    p.add_argument("--engine-arg", action="append", default=[], help="vLLM engine argument key=value")
    p.add_argument("--in-flight", type=int, default=None,
                   help="conversations kept in the engine (default: its max_num_seqs)")
    p.add_argument("--lengths-only", action="store_true",
                   help="generate the samples only: no repeats, no settled phase, no throughput")
    p.add_argument("--settled-share", type=float, default=SETTLED_SHARE,
                   help="the settled phase's length over the samples' phase (default: as long again)")
    p.add_argument("--mtp", type=int, default=0, help="tokens the model's MTP head drafts a step (0: off)")
    p.add_argument("--loglevel", default="WARNING")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    samples = read_samples(args.samples)
    run = json.loads(Path(args.run).read_text())
    if not samples:
        print("probe: no samples to generate", file=sys.stderr)
        return 2
    try:
        engine_args = parse_engine_args(args.engine_arg)
    except ConfigError as e:
        print(f"probe: {e}", file=sys.stderr)
        return 2
    try:
        check_settled_share(args.settled_share)
    except ValueError as e:
        print(f"probe: --settled-share: {e}", file=sys.stderr)
        return 2
    result = run_probe(samples, run, engine_args, in_flight=args.in_flight, measure_rate=not args.lengths_only,
                       settled_share=args.settled_share, mtp=args.mtp)
    write_json_atomically(args.out, result)
    log.info("probe: %d samples, %d output tokens in %.1f s (%.0f tok/s)", len(samples),
             result["output_tokens"], result["wall_s"], result["tokens_per_s"] or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
