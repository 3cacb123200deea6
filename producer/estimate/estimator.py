"""``regen estimate``: how many tokens, engine-hours and days a run will take, before it runs.

1. Stream the dataset once and draw a stratified random sample (producer/estimate/sample.py).
2. Generate the sample on the real engine with the run's exact config, in a subprocess
   (``python -m worker.engine.pilot``: the producer never imports vLLM), or reuse a probe's
   results file.
3. Extrapolate (producer/estimate/arithmetic.py): total output tokens = Σ over strata of
   population × mean tokens; engine-hours = tokens / tokens-per-s; wall-clock on G
   engines = work / G + drain and spread allowances; 95% stratified-bootstrap intervals.

The result is a JSON document (keys in docs/estimate.md), rendered as text by
producer/estimate/render.py. Saved as ``<output>/estimate.json`` in the run's S3
prefix, ``regen estimate --compare RUN`` later puts the actual figures beside it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ledger.errors import ConfigError, RegenError
from ledger.objects import ObjectStore, join_key
from worker.engine.cache_plan import card_capacity  # pure arithmetic, as is mtp: no vLLM import
from worker.engine.mtp import DEFAULT_MTP_TOKENS, choose_mtp, mtp_layers

from ..run_config import RunConfig
from . import arithmetic as em
from .assumptions import assumptions
from .options import EstimateOptions, ThroughputChoice
from .probe_run import run_streaming, say
from .sample import DrawnSample, draw_sample

log = logging.getLogger(__name__)

#: Name of the saved estimate under a run's output prefix.
ESTIMATE_OBJECT = "estimate.json"
#: Version of the estimate document; bump when a key changes meaning.
ESTIMATE_VERSION = 1
class ProbeError(RegenError):
    """The probe subprocess failed (engine could not load, crashed, or timed out)."""


def run_document(config: RunConfig) -> dict[str, Any]:
    """The run as claim_batch hands it to a worker (what generate_sample reads): its sampling record and the
    provenance submit would store, so the probe renders every prompt as the workers will (a gpt-oss run's
    Harmony system date included)."""
    return {"model": config.model, "sampling": config.as_record(), "provenance": config.provenance()}


def run_probe_subprocess(drawn: DrawnSample, config: RunConfig, options: EstimateOptions,
                         *, mtp: int = 0) -> dict[str, Any]:
    """Generate the drawn sample in ``python -m worker.engine.pilot``; return its results.

    ``mtp``: tokens the model's MTP head drafts a step (the estimate's second probe), its results kept
    beside the first's (``<probe results>.mtp.json``).

    Raises:
        ProbeError: the subprocess failed or timed out (its last output is in the message).
    """
    with tempfile.TemporaryDirectory(prefix="regen-estimate-") as tmp:
        samples_path, run_path = Path(tmp) / "samples.jsonl", Path(tmp) / "run.json"
        out_path = Path(options.probe_results) if options.probe_results else Path(tmp) / "probe.json"
        if mtp:
            out_path = mtp_results_path(options.probe_results) or Path(tmp) / "probe.mtp.json"
        drawn.write_jsonl(samples_path)
        run_path.write_text(json.dumps(run_document(config)))
        argv = [sys.executable, "-m", "worker.engine.pilot", "--samples", str(samples_path), "--run", str(run_path),
                "--out", str(out_path)]
        for pair in options.engine_args:
            argv += ["--engine-arg", pair]
        if options.in_flight is not None:
            argv += ["--in-flight", str(options.in_flight)]
        if mtp:
            argv += ["--mtp", str(mtp)]
        if options.settled_share is not None:
            argv += ["--settled-share", repr(options.settled_share)]
        if options.throughput.lengths_only:
            # The lengths need the samples only, not the repeats that keep the engine full for
            # a rate: half the probe's time (worker/engine/pilot.py).
            argv.append("--lengths-only")
        log.info("probe: %s", " ".join(argv))
        say(f"probe{' with MTP' if mtp else ''}: {drawn.size} conversations on the engine, "
            "as the workers run them")
        code, output = run_streaming(argv, timeout_s=options.probe_timeout_s,
                                     cwd=Path(__file__).resolve().parents[2], env=os.environ.copy())
        if code is None:
            raise ProbeError(f"the probe took longer than {options.probe_timeout_s:.0f} s")
        if code != 0 or not out_path.exists():
            raise ProbeError(f"the probe exited with {code}:\n{probe_failure(output)}")
        return json.loads(out_path.read_text())


def mtp_results_path(probe_results: str | None) -> Path | None:
    """Where the MTP probe's results are kept beside a ``--probe-results`` file (None: not kept)."""
    return Path(probe_results + ".mtp.json") if probe_results else None


def model_config(model: str) -> dict[str, Any] | None:
    """The model's config.json where it is a local directory, else None."""
    try:
        return json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None


def model_mtp_layers(model: str) -> int:
    """The MTP layers the model's config.json declares (0 where it has none, or no local config to read)."""
    return mtp_layers(model_config(model) or {})


def memory_on_cards(model: str, mean_tokens: float, mtp_tokens: int) -> dict[str, Any] | None:
    """What an H200 and an H100 hold of this model's sequences of the sample's mean length (prompt and
    output), by vLLM's own arithmetic (worker/engine/cache_plan.py): a hybrid's states included. None where
    the model's config cannot be read or is not one regen models."""
    config = model_config(model)
    if not config or mean_tokens <= 0:
        return None
    try:
        return card_capacity(config, max(1, round(mean_tokens)), speculative_tokens=mtp_tokens)
    except (KeyError, TypeError, ValueError):
        return None


def mtp_probe(drawn: DrawnSample, config: RunConfig, options: EstimateOptions) -> dict[str, Any] | None:
    """The second probe, with the model's MTP head drafting (issue 56): its results, ``{"error": ...}`` where
    its engine could not be built or run (the CPU build, a model without the head's weights), or None where
    none is wanted (off, no head, or no rate to compare: --lengths-only, --tokens-per-s, --gpu-type)."""
    choice = options.throughput
    if options.mtp == 0 or model_mtp_layers(config.model) < 1:
        return None
    if choice.lengths_only or choice.tokens_per_s is not None or choice.gpu_type is not None:
        return None
    kept = mtp_results_path(options.probe_results)
    if kept is not None and kept.exists():
        return load_probe_results(str(kept), drawn)
    try:
        return run_probe_subprocess(drawn, config, options, mtp=options.mtp or DEFAULT_MTP_TOKENS)
    except ProbeError as e:
        causes = [line.strip() for line in str(e).splitlines() if re.search(r"(Error|Exception): ", line)
                  and not re.search(r"EngineDeadError|Engine core initialization failed|Worker failed with error", line)]
        first = causes[0] if causes else str(e).splitlines()[0]
        cause = re.search(r"\b\w*(Error|Exception): .*", first)  # past vLLM's "(Worker pid=..) ERROR ..." prefix
        return {"error": (cause.group(0) if cause else first).strip()[:300]}


def probe_failure(output: str | None, *, tail_chars: int = 2000, max_causes: int = 8) -> str:
    """The root cause of a failed probe, then its last output.

    vLLM's engine process prints the real error (out of memory, a bad argument) well
    before the parent's chain of ``Engine core initialization failed`` tracebacks, so a
    plain tail of the output hides it: the distinct error lines come first.
    """
    output = output or ""
    causes: list[str] = []
    for line in output.splitlines():
        line = line.strip()
        if re.search(r"\b\w*(Error|Exception): ", line) and line not in causes:
            causes.append(line)
    head = "errors: " + "\n        ".join(causes[:max_causes]) + "\n" if causes else ""
    return f"{head}last output:\n{output[-tail_chars:]}"


def load_probe_results(path: str, drawn: DrawnSample) -> dict[str, Any]:
    """A probe results file written earlier for the same draw.

    Raises:
        ConfigError: it does not hold the conversations drawn now (other data, size or seed).
    """
    try:
        probe = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable probe results file: {e}") from e
    drawn_ids = sorted(c["sample_id"] for c in drawn.conversations())
    if sorted(s["sample_id"] for s in probe.get("samples", [])) != drawn_ids:
        raise ConfigError(f"{path} holds the results of another sample (other data, --sample or --draw-seed)")
    return probe


def _choose_throughput(probe: dict[str, Any], choice: ThroughputChoice) -> tuple[float | None, dict[str, Any]]:
    """The tokens/s to use and a record of where it came from."""
    measured = probe.get("tokens_per_s")
    record: dict[str, Any] = {"measured_tokens_per_s": measured, "probe_wall_s": probe.get("wall_s"),
                              "probe_output_tokens": probe.get("output_tokens"),
                              "first_to_last_tokens_per_s": probe.get("first_to_last_tokens_per_s"),
                              "throughput_window_s": probe.get("throughput_window_s"),
                              "in_flight": probe.get("in_flight"), "repeats": probe.get("repeats"),
                              "settled_share": probe.get("settled_share"),
                              "peak_in_engine": probe.get("peak_in_engine"),
                              "max_num_seqs": (probe.get("engine_args") or {}).get("max_num_seqs"),
                              "engine_version": probe.get("engine_version")}
    if choice.lengths_only:
        return None, {**record, "source": "none (--lengths-only)"}
    if choice.tokens_per_s is not None:
        return choice.tokens_per_s, {**record, "source": "given (--tokens-per-s)"}
    if choice.gpu_type is not None:
        tps = em.scaled_tokens_per_s(choice.reference_tokens_per_s, choice.reference_gpu, choice.gpu_type)
        return tps, {**record, "source": f"EXTRAPOLATED to {choice.gpu_type} by memory bandwidth",
                     "reference": {"tokens_per_s": choice.reference_tokens_per_s, "gpu": choice.reference_gpu,
                                   "gpu_tbps": em.GPU_BANDWIDTH_TBPS[choice.reference_gpu],
                                   "target_gpu": choice.gpu_type,
                                   "target_tbps": em.GPU_BANDWIDTH_TBPS[choice.gpu_type]}}
    if probe.get("rate_measured") is False:
        raise ConfigError("the probe's results were taken with --lengths-only: it generated the samples but "
                          "measured no throughput; give --tokens-per-s (or --gpu-type), or probe again "
                          "without --lengths-only (another --probe-results file)")
    if not measured:
        raise ProbeError("the probe generated no tokens, so it measured no throughput; "
                         "use --tokens-per-s or --lengths-only")
    return float(measured), {**record, "source": "measured by the probe"}


#: What of the MTP probe's results prices a run with MTP on: its rate and its start-up and drain.
_RATE_KEYS = ("tokens_per_s", "wall_s", "output_tokens", "first_to_last_tokens_per_s", "throughput_window_s",
              "peak_in_engine", "drain_loss_s", "start_loss_s", "engine_args")


def build_estimate(drawn: DrawnSample, probe: dict[str, Any], config: RunConfig, options: EstimateOptions,
                   *, inputs: list[str], mtp_results: dict[str, Any] | None = None) -> dict[str, Any]:
    """Extrapolate the probe's per-sample results to the whole dataset (the estimate document).

    ``mtp_results``: the MTP probe's (:func:`mtp_probe`). Where MTP is the choice, its rate prices the run;
    the lengths are the first probe's either way (MTP keeps the target's distribution).
    """
    mtp = choose_mtp(options.mtp, model_layers=model_mtp_layers(config.model), rate_without=probe.get("tokens_per_s"),
                     mtp_probe=mtp_results)
    if mtp.on and mtp_results and not mtp_results.get("error"):
        probe = {**probe, **{k: mtp_results[k] for k in _RATE_KEYS if k in mtp_results}}
    by_id = {s["sample_id"]: s for s in probe["samples"]}
    strata: dict[str, tuple[int, list[tuple[float, float, float, float]]]] = {}
    for key, stratum in drawn.strata.items():
        rows = []
        for c in stratum.drawn:
            r = by_id[c["sample_id"]]
            rows.append((float(r["completion_tokens"]), float(r["reasoning_tokens"]), float(r["answer_tokens"]),
                         1.0 if r["truncated"] else 0.0, float(r.get("prompt_tokens") or 0)))
        strata[key] = (stratum.population, rows)
    population = drawn.population
    points = [em.stratified_total({k: (n, [row[m] for row in rows]) for k, (n, rows) in strata.items()})
              for m in range(5)]
    replicates = em.stratified_bootstrap(strata, resamples=options.bootstrap_resamples)
    tokens, reasoning, answer, truncated, prompt = (em.interval_from(points[m], replicates[m] if replicates else [])
                                                    for m in range(5))
    per_row = 1.0 / population if population else 0.0
    tokens_per_s, throughput = _choose_throughput(probe, options.throughput)
    longest_s = max((s.get("duration_s", s["finished_s"]) for s in probe["samples"]), default=0.0)
    drain_loss_s = probe.get("drain_loss_s")  # None: a probe without the token counter, or an older one
    start_loss_s = probe.get("start_loss_s")  # None likewise (an older probe: no start-up allowance)
    measured = probe.get("tokens_per_s")
    if tokens_per_s and measured:
        # A faster engine finishes its last conversations sooner, in proportion.
        longest_s *= measured / tokens_per_s
        if drain_loss_s is not None:
            drain_loss_s *= measured / tokens_per_s
        if start_loss_s is not None:
            start_loss_s *= measured / tokens_per_s
    work_h = engine_h = wall_h = None
    if tokens_per_s:
        work_h = tokens.scaled(1.0 / tokens_per_s / 3600.0)
        engine_h, wall_h = em.run_hours(work_h, options.engines, longest_s, drain_loss_s, start_loss_s)
    failed = sum(1 for s in probe["samples"] if s["status"] != "done")
    return {
        "kind": "regen-estimate",
        "version": ESTIMATE_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "inputs": inputs,
        "model": config.model,
        "config": config.as_record(),
        "config_hash": config.hash,
        "rows": population,
        "rows_read": drawn.rows_read,
        "rejected": drawn.rejected,
        "duplicates": drawn.duplicates,
        "reject_reasons": dict(sorted(drawn.reject_reasons.items())),
        "sample_size": drawn.size,
        "draw_seed": options.draw_seed,
        "strata": [{"key": k, "population": s.population, "sample_size": len(s.drawn),
                    "weight": round(s.weight, 4),
                    "mean_output_tokens": round(em.stratified_total({k: (1, [r[0] for r in strata[k][1]])}), 1)}
                   for k, s in drawn.strata.items()],
        "mean_output_tokens": tokens.scaled(per_row).as_dict(1),
        "total_output_tokens": tokens.as_dict(0),
        "reasoning_tokens": reasoning.as_dict(0),
        "answer_tokens": answer.as_dict(0),
        "truncated_share": truncated.scaled(per_row).as_dict(4),
        # Prompt tokens as the workers render them (the probe runs their Renderer: the chat template, or Harmony
        # for gpt-oss), every turn's prompt counted: the prefill, and the prompt side of the exported rows.
        "total_prompt_tokens": prompt.as_dict(0),
        "mean_prompt_tokens": prompt.scaled(per_row).as_dict(1),
        "failed_share": round(failed / len(probe["samples"]), 4) if probe["samples"] else 0.0,
        "tokens_per_s": round(tokens_per_s, 3) if tokens_per_s else None,
        "throughput": throughput,
        "engines": options.engines,
        "longest_conversation_s": round(longest_s, 3),
        "drain_loss_s": round(drain_loss_s, 3) if drain_loss_s is not None else None,
        "drain_hours": em.drain_allowance_s(longest_s, drain_loss_s) / 3600.0,
        "start_loss_s": round(start_loss_s, 3) if start_loss_s is not None else None,
        "start_hours": max(0.0, start_loss_s or 0.0) / 3600.0,
        "spread_hours": em.spread_allowance_s(longest_s, options.engines) / 3600.0,
        "work_hours": work_h.as_dict() if work_h else None,
        "engine_hours": engine_h.as_dict() if engine_h else None,
        "wall_hours": wall_h.as_dict() if wall_h else None,
        "bootstrap": {"resamples": options.bootstrap_resamples, "seed": em.BOOTSTRAP_SEED,
                      "confidence": em.CONFIDENCE},
        "assumptions": assumptions(drawn, probe, throughput, options, failed),
        "mtp": {**mtp.as_record(), "line": mtp.line()},
        "memory": memory_on_cards(config.model, (points[0] + points[4]) / population if population else 0.0,
                                  mtp.tokens),
    }


def estimate(paths: list[str], config: RunConfig, options: EstimateOptions) -> dict[str, Any]:
    """Draw, probe (or reuse a probe), extrapolate: the estimate document.

    Raises:
        ConfigError: bad paths or options, or an empty dataset.
        ProbeError: the engine run failed.
    """
    options.throughput.check()
    if options.engines < 1:
        raise ConfigError("--gpus must be at least 1")
    started = time.monotonic()
    say(f"drawing a sample of {options.sample_size} from {', '.join(paths)}")
    drawn = draw_sample(paths, options.sample_size, seed=options.draw_seed)
    say(f"drew {drawn.size} conversations of {drawn.population:,} in {len(drawn.strata)} strata "
        f"({drawn.rows_read:,} rows read), {time.monotonic() - started:.0f} s")
    if drawn.population == 0:
        raise ConfigError(f"no valid rows in {', '.join(paths)} ({drawn.rejected} rejected)")
    if options.probe_results and Path(options.probe_results).exists():
        probe = load_probe_results(options.probe_results, drawn)
    else:
        probe = run_probe_subprocess(drawn, config, options)
    return build_estimate(drawn, probe, config, options, inputs=[str(p) for p in paths],
                          mtp_results=mtp_probe(drawn, config, options))


def hand_estimate(rows: int, mean_output_tokens: float, choice: ThroughputChoice, *, engines: int) -> dict[str, Any]:
    """The hand calculation (rows × mean tokens / tokens/s / engines) with the same keys, no data, no interval.

    Raises:
        ConfigError: bad numbers, or no throughput (needs --tokens-per-s, --gpu-type or --lengths-only).
    """
    choice.check()
    if rows < 1 or mean_output_tokens <= 0 or engines < 1:
        raise ConfigError("--rows, --mean-output-tokens and --gpus must be positive")
    if choice.tokens_per_s is None and choice.gpu_type is None and not choice.lengths_only:
        raise ConfigError("a hand calculation needs --tokens-per-s, --gpu-type or --lengths-only")
    tokens_per_s, throughput = _choose_throughput({}, choice)
    total = em.Interval(rows * mean_output_tokens, rows * mean_output_tokens, rows * mean_output_tokens)
    work_h = total.scaled(1.0 / tokens_per_s / 3600.0) if tokens_per_s else None
    engine_h, wall_h = em.run_hours(work_h, engines, 0.0) if work_h else (None, None)
    notes = [f"hand calculation: {rows:,} rows × {mean_output_tokens:,} output tokens per row, as given; no "
             "sample, so no interval and no drain allowance"]
    if throughput["source"].startswith("EXTRAPOLATED"):
        ref = throughput["reference"]
        notes.append(f"tokens/s EXTRAPOLATED by memory bandwidth: {ref['tokens_per_s']:,.0f} on {ref['gpu']} × "
                     f"{ref['target_tbps']} / {ref['gpu_tbps']} TB/s ({ref['target_gpu']})")
    return {
        "kind": "regen-estimate", "version": ESTIMATE_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "inputs": [], "model": None, "config": None, "config_hash": None,
        "rows": rows, "rows_read": rows, "rejected": 0, "duplicates": 0, "reject_reasons": {},
        "sample_size": 0, "strata": [],
        "mean_output_tokens": em.Interval(mean_output_tokens, mean_output_tokens, mean_output_tokens).as_dict(1),
        "total_output_tokens": total.as_dict(0), "reasoning_tokens": None, "answer_tokens": None,
        "truncated_share": None, "failed_share": None, "total_prompt_tokens": None, "mean_prompt_tokens": None,
        "tokens_per_s": tokens_per_s, "throughput": throughput, "engines": engines,
        "longest_conversation_s": 0.0, "drain_loss_s": None, "drain_hours": 0.0, "spread_hours": 0.0,
        "start_loss_s": None, "start_hours": 0.0,
        "work_hours": work_h.as_dict() if work_h else None,
        "engine_hours": engine_h.as_dict() if engine_h else None,
        "wall_hours": wall_h.as_dict() if wall_h else None,
        "bootstrap": None, "assumptions": notes,
    }


def estimate_url(output_url: str) -> str:
    return join_key(output_url.rstrip("/"), ESTIMATE_OBJECT)


def save_estimate(store: ObjectStore, output_url: str, document: dict[str, Any]) -> str:
    """Write the estimate to ``<output>/estimate.json`` (replacing an earlier one); returns its URL."""
    if not output_url.startswith("s3://"):
        raise ConfigError(f"--output must be an s3:// URL, got {output_url!r}")
    url = estimate_url(output_url)
    store.put(url, json.dumps(document, indent=1).encode())
    return url


def load_estimate(store: ObjectStore, output_url: str) -> dict[str, Any] | None:
    """The estimate saved under a run's output prefix, or None when there is none."""
    url = estimate_url(output_url)
    if not store.exists(url):
        return None
    return json.loads(store.get(url))
