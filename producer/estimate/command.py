"""The ``regen estimate`` command (registered in producer/cli.py with ``main.add_command``)."""

from __future__ import annotations

import json

import click

from ledger.errors import ConfigError
from ledger.settings import Settings

from ..cli_common import ledger, run_config_from, run_config_options, store
from ..cli_common import settings as _settings
from .arithmetic import GPU_BANDWIDTH_TBPS

_GPU = click.Choice(sorted(GPU_BANDWIDTH_TBPS))


@click.command("estimate")
@click.argument("paths", nargs=-1)
@click.option("--model", default=None, help="model directory (or hub id), as for submit")
@click.option("--sample", "sample_size", type=int, default=1000, show_default=True,
              help="conversations to generate (stratified random sample)")
@click.option("--gpus", "engines", type=int, default=1, show_default=True,
              help="engines the run will have (one per GPU, or per tensor-parallel group)")
@run_config_options
@click.option("--tokens-per-s", type=float, default=None,
              help="what-if: output tokens/s of one engine measured elsewhere (replaces the probe's timing)")
@click.option("--gpu-type", type=_GPU, default=None,
              help="what-if: scale --reference-tokens-per-s to this GPU by memory bandwidth (extrapolated)")
@click.option("--reference-tokens-per-s", type=float, default=None, help="with --gpu-type: a measured tokens/s")
@click.option("--reference-gpu", type=_GPU, default=None, help="with --gpu-type: the GPU it was measured on")
@click.option("--lengths-only", is_flag=True, help="report token totals only, no hours")
@click.option("--engine-arg", "engine_args", multiple=True,
              help="vLLM engine argument key=value for the probe (repeatable): give the workers' own")
@click.option("--probe-in-flight", "in_flight", type=int, default=None,
              help="conversations the probe keeps in the engine (default: its max_num_seqs, a full engine); "
                   "match the workers' (about --concurrency × --batch-size)")
@click.option("--probe-settled", "settled_share", type=click.FloatRange(0, 4, min_open=True), default=None,
              help="the probe's settled phase, where its rate is measured, over its samples' phase "
                   "(default 1: as long again; 0.5 is shorter and noisier: docs/estimate.md)")
@click.option("--draw-seed", type=int, default=0, show_default=True, help="seed of the sample draw")
@click.option("--probe-results", default=None,
              help="JSON file: reused if it exists (no engine run), else the probe's results are kept there")
@click.option("--output", "output_url", default=None,
              help="s3:// prefix of the run to come (submit's --output): save the estimate as <output>/estimate.json")
@click.option("--save-as", "save_as", default=None, help="save into the output prefix of this submitted run")
@click.option("--compare", "compare_run", default=None, help="print the saved estimate of RUN against its actuals")
@click.option("--rows", type=int, default=None, help="hand calculation: rows (with --mean-output-tokens, no data)")
@click.option("--mean-output-tokens", type=float, default=None, help="hand calculation: output tokens per row")
@click.option("--json", "as_json", is_flag=True, help="machine-readable (keys in docs/estimate.md)")
@click.option("--database-url", envvar="DATABASE_URL", default=None, help="ledger, for --compare and --save-as")
def estimate_command(**opts) -> None:
    """Estimate output tokens, engine-hours and wall-clock of regenerating PATHS, before running it.

    Draws a stratified sample, generates it on the real engine with the run's exact
    config, and extrapolates with 95% bootstrap intervals. With --compare RUN, prints
    the estimate saved for RUN against what the run took.
    """
    _estimate(opts)


def _estimate(o: dict) -> None:
    from worker.engine.mtp import parse_mtp

    from .estimator import EstimateOptions, ThroughputChoice, estimate, hand_estimate
    from .render import render_estimate

    if o["compare_run"]:
        _compare(o["compare_run"], o["as_json"], o["database_url"])
        return
    choice = ThroughputChoice(tokens_per_s=o["tokens_per_s"], gpu_type=o["gpu_type"],
                              reference_tokens_per_s=o["reference_tokens_per_s"], reference_gpu=o["reference_gpu"],
                              lengths_only=o["lengths_only"])
    if o["rows"] is not None or o["mean_output_tokens"] is not None:
        if o["paths"] or o["rows"] is None or o["mean_output_tokens"] is None:
            raise click.UsageError("a hand calculation takes --rows and --mean-output-tokens, and no data")
        doc = hand_estimate(o["rows"], o["mean_output_tokens"], choice, engines=o["engines"])
    else:
        if not o["paths"] or not o["model"]:
            raise click.UsageError("give the data files and --model (or --compare RUN)")
        config = run_config_from(o["model"], o)
        options = EstimateOptions(sample_size=o["sample_size"], engines=o["engines"], draw_seed=o["draw_seed"],
                                  throughput=choice, engine_args=tuple(o["engine_args"]),
                                  in_flight=o["in_flight"], probe_results=o["probe_results"],
                                  settled_share=o["settled_share"], mtp=parse_mtp(o["mtp"]))
        doc = estimate(list(o["paths"]), config, options)
    saved = None
    if o["output_url"] or o["save_as"]:
        saved = _save(doc, o["output_url"], o["save_as"], o["database_url"])
    if o["as_json"]:
        click.echo(json.dumps({**doc, "saved_to": saved} if saved else doc, indent=2))
        return
    click.echo(render_estimate(doc))
    if saved:
        click.echo(f"\nsaved to {saved}: after the run, `regen estimate --compare RUN` puts the actuals beside it")


def _run_output(session, run_name: str) -> str:
    from ledger.runs import find_run

    return find_run(session, run_name).output_url


def _save(doc: dict, output_url: str | None, save_as: str | None, database_url: str | None) -> str:
    from .estimator import save_estimate

    settings = _settings(database_url)
    if save_as:
        with ledger(settings) as sessions, sessions() as session:
            run_output = _run_output(session, save_as)
        if output_url and output_url.rstrip("/") != run_output:
            raise ConfigError(f"run {save_as!r} writes to {run_output}, not {output_url}")
        output_url = run_output
    assert output_url is not None
    return save_estimate(store(settings), output_url, doc)


def compare_run(settings: Settings, run_name: str) -> dict:
    """The estimate saved for ``run_name`` beside what the ledger says the run took.

    Raises:
        RunNotFound: no such run.
        ConfigError: the run has no saved estimate.
    """
    from .compare import actual_from_ledger, compare
    from .estimator import estimate_url, load_estimate

    with ledger(settings) as sessions, sessions() as session:
        actual = actual_from_ledger(session, run_name)
    saved = load_estimate(store(settings), actual["output_url"])
    if saved is None:
        raise ConfigError(f"run {run_name!r} has no saved estimate at {estimate_url(actual['output_url'])}; "
                          "save one with `regen estimate ... --output <the run's output>` (or --save-as RUN)")
    return compare(saved, actual)


def _compare(run_name: str, as_json: bool, database_url: str | None) -> None:
    from .render import render_compare

    result = compare_run(_settings(database_url), run_name)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    else:
        click.echo(render_compare(result))

