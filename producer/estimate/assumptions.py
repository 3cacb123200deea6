"""What an estimate's numbers rest on, in words: the ``assumptions`` list of its text and JSON alike.

Each line names where a figure came from (measured by the probe, given, extrapolated) and what it
leaves out, so a reader can tell a measured rate from a guessed one without the code
(docs/estimate.md, "Reading the output").
"""

from __future__ import annotations

from typing import Any

from . import arithmetic as em
from .options import EstimateOptions
from .sample import DrawnSample

#: Below this many engine-fulls of rows per engine (rows / engines / the probe's conversations in flight), a
#: run's queue empties before its engines settle and the estimate says its drain is likely overstated: on an
#: H100, a run of 1.3 engine-fulls lost about half the drain a long run's end costs (docs/estimate.md).
SHORT_RUN_ENGINE_FULLS = 4.0


def short_run(rows: int, engines: int, probe: dict[str, Any]) -> float | None:
    """Engine-fulls of rows per engine when fewer than :data:`SHORT_RUN_ENGINE_FULLS`, else None.

    None too where the probe measured no drain (the allowance is then a stated bound, not a long run's
    measured end) or recorded no count in flight (an older probe).
    """
    in_flight = probe.get("in_flight")
    if not in_flight or probe.get("drain_loss_s") is None or engines < 1:
        return None
    fulls = rows / engines / in_flight
    return fulls if fulls < SHORT_RUN_ENGINE_FULLS else None


def _settled_words(share: float | None) -> str:
    """How long the probe's settled phase ran, against its samples' phase (None: a probe from before the
    share was recorded, which ran as long again)."""
    if share is None or share == 1:
        return "as long again"
    return f"{share:g} times as long again (--probe-settled)"


def assumptions(drawn: DrawnSample, probe: dict[str, Any], throughput: dict[str, Any], options: EstimateOptions,
                failed: int) -> list[str]:
    """What the numbers rest on, in words, for the text and the JSON alike."""
    out = [f"sample: {drawn.size:,} of {drawn.population:,} conversations, stratified by source file × "
           f"turn count × prompt length ({len(drawn.strata)} strata), draw seed {options.draw_seed}; each "
           "was generated on the real engine with the run's template, sampling, seeds and thinking mode"]
    source = throughput["source"]
    if source.startswith("measured"):
        peak, seqs = throughput.get("peak_in_engine"), throughput.get("max_num_seqs")
        out.append(f"tokens/s measured by the probe on this machine's engine, kept full with "
                   f"{throughput.get('in_flight')} conversations (max_num_seqs {seqs}; at most {peak} requests seen "
                   f"in it; {throughput.get('repeats') or 0} repeats of sampled conversations topped it up), over the "
                   f"{throughput.get('throughput_window_s') or 0:.1f} s once it had settled (after the last sampled "
                   f"conversation ended, {_settled_words(throughput.get('settled_share'))}: the engine then holds a "
                   "long run's mix of lengths). "
                   "It is the bare engine's rate: the workers' own work around it (S3, ledger, Celery) is not in "
                   "it. Match the workers' conversations in flight with --probe-in-flight; for another fleet, "
                   "or the rate a finished run reached (--compare), pass --tokens-per-s")
    elif source.startswith("EXTRAPOLATED"):
        ref = throughput["reference"]
        out.append(f"tokens/s EXTRAPOLATED, not measured: {ref['tokens_per_s']:,.0f} tok/s on {ref['gpu']} × "
                   f"{ref['target_tbps']} / {ref['gpu_tbps']} TB/s memory bandwidth of {ref['target_gpu']}; "
                   "decode is bandwidth-bound to first order, but HBM size (concurrency), FP8/FP4 support "
                   "and kernels are not in the ratio")
    elif source.startswith("given"):
        out.append("tokens/s given with --tokens-per-s (one engine, at full load), not measured by this probe")
    else:
        out.append("no throughput: token totals only (--lengths-only)")
    if not options.throughput.lengths_only:
        out.append("engine-hours assume engines kept full (continuous feeding, as regen's workers do); "
                   "GPU-hours = engine-hours × GPUs per engine (tensor parallel)")
        if probe.get("drain_loss_s") is not None:
            count = probe.get("drain_unstarted_aborted")
            dropped = (f" (the {count:,} repeats still waiting unstarted dropped first: a run works through "
                       "those at the full engine's rate)" if count else "")
            drain = (f"measured by the probe, which let its engine drain as a run's end does{dropped}: "
                     f"{probe['drain_s']:.1f} s to empty, {probe['drain_tokens']:,} tokens generated meanwhile, "
                     f"{probe['drain_loss_s']:.1f} s lost against a full engine; engine-hours add that loss per "
                     "engine")
        else:
            drain = "engine-hours add half the longest sampled conversation's time per engine (not measured)"
        out.append("at the end of a run each engine drains (its last conversations finish one by one): "
                   f"{drain}, and the wall-clock on {options.engines} engine(s) adds that drain plus (1 - 1/G) × "
                   "the longest conversation for engines finishing unevenly; negligible for a long run, not for "
                   "a short one")
        if (short := short_run(drawn.population, options.engines, probe)) is not None:
            out.append(f"a SHORT run: {short:.1f} engine-fulls per engine ({drawn.population:,} rows over "
                       f"{options.engines} engine(s), {probe['in_flight']:,} conversations in flight in each). Its "
                       "queue empties before its engines settle, so the drain added here, a long run's end "
                       "(the probe's engine topped up to its last moment), likely overstates what it loses: "
                       "the engine-hours are then high, by up to that drain (docs/estimate.md, \"On an H100\")")
        if probe.get("start_loss_s") is not None:
            out.append("at the start of a run each engine fills (every conversation young at once; a KV-limited "
                       f"engine preempts as they grow): measured by the probe's first phase, {probe['start_s']:.1f} s "
                       f"for {probe['start_tokens']:,} tokens, {probe['start_loss_s']:.1f} s lost against its "
                       "settled rate; engine-hours add that loss per engine, the wall-clock once")
    out.append(f"{em.CONFIDENCE:.0%} intervals: stratified bootstrap of the sample ({options.bootstrap_resamples:,} "
               "resamples); they cover the sampling error of the lengths, not the noise of a throughput "
               "measurement")
    if failed:
        out.append(f"{failed} sampled conversation(s) failed in the probe (template error, prompt too long): "
                   "counted as generating nothing, as in a run")
    if drawn.rejected or drawn.duplicates:
        out.append(f"{drawn.rejected:,} rejected rows and {drawn.duplicates:,} duplicates are left out, as "
                   "submit leaves them out")
    return out
