"""The ``regen`` command. Each subcommand builds Settings, then calls plain functions.

Heavy imports (vLLM, torch, transformers) happen only inside the subcommands that
need them (``tiny-model``; ``worker`` starts them in child processes).
"""

from __future__ import annotations

import json
import logging
import sys

import click

from ledger.defaults import DEFAULT_BATCH_SIZE, DEFAULT_LEASE_S, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from ledger.errors import RegenError, RunNotFound, StoreError
from ledger.settings import redact

from .cli_common import (
    ERROR_EXIT,
    db_option,
    ledger,
    redis_option,
    run_config_from,
    run_config_options,
    store,
)
from .cli_common import settings as _settings
from .cli_worker import worker

log = logging.getLogger("regen.cli")


class _Group(click.Group):
    """Every RegenError a command raises, and every ledger, broker or S3 failure (producer/cli_errors.py),
    is reported here, once: one ``error: ...`` line and ERROR_EXIT; ``--debug`` keeps the traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            from . import cli_common
            from .cli_errors import describe

            if ctx.params.get("debug"):
                raise
            # regen's own refusals say what they mean; the store's get the endpoint and the fix too.
            said = isinstance(e, RegenError) and not isinstance(e, StoreError)
            line = None if said else describe(e, cli_common.current_settings)
            if line is None and not isinstance(e, RegenError):
                raise  # not the user's setup: a bug keeps its traceback
            click.echo(f"error: {line or e}", err=True)
            sys.exit(ERROR_EXIT)


@click.group(cls=_Group)
@click.option("-v", "--verbose", is_flag=True)
@click.option("--debug", is_flag=True, help="show the traceback of a ledger, broker or S3 failure")
def main(verbose: bool, debug: bool) -> None:
    """regen: regenerate a dataset's completions with one target model, on a fault-tolerant farm."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# The one command that starts processes, in a module of its own (producer/cli_worker.py).
main.add_command(worker)


@main.group()
def db() -> None:
    """The Postgres ledger's schema."""


@db.command("upgrade")
@db_option
@click.option("--revision", default="head")
def db_upgrade(database_url: str | None, revision: str) -> None:
    """Apply the Alembic migrations (idempotent)."""
    from ledger import migrate

    settings = _settings(database_url)
    migrate.upgrade(settings, revision)
    click.echo(f"ledger at revision {migrate.current(settings)} on {redact(settings.database_url)}")


@db.command("current")
@db_option
def db_current(database_url: str | None) -> None:
    from ledger import migrate

    click.echo(migrate.current(_settings(database_url)) or "empty")


@main.command("tiny-model")
@click.argument("out_dir")
@click.option("--variant", type=click.Choice(["random", "trained", "stub"]), default="trained", show_default=True,
              help="random weights; trained to follow the chat format; or trained to answer with stubs")
@click.option("--seed", type=int, default=0, show_default=True)
# The families worker/tiny/families.py builds (SPECS' keys), written out: importing worker.tiny costs 0.4 s.
@click.option("--family", type=click.Choice(["qwen3", "llama3", "deepseek_r1", "glm45", "kimi_k2", "mistral",
                                            "magistral", "gpt_oss", "qwen36"]),
              default="qwen3",
              show_default=True, help="chat family: its tokens, chat template and output format")
@click.option("--force", is_flag=True, help="rebuild even if OUT_DIR holds a model")
def tiny_model(out_dir: str, variant: str, seed: int, family: str, force: bool) -> None:
    """Write a small offline model of a chat family (for the demo, tests and smoke tests)."""
    from worker.tiny import build_tiny_model

    path = build_tiny_model(out_dir, variant=variant, seed=seed, force=force, family=family)
    click.echo(f"tiny model ({variant}) in {path}" if family == "qwen3" else f"tiny {family} model ({variant}) in {path}")


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--run", "run_name", required=True, help="run name: unique; a resubmit with it resumes")
@click.option("--model", required=True, help="model directory (or hub id) the workers load")
@click.option("--output", "output_url", required=True, help="s3://bucket/prefix for the run's shards")
@click.option("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, show_default=True)
@run_config_options
@click.option("--queue", default=DEFAULT_QUEUE, show_default=True, help="broker queue the workers of this model consume")
@click.option("--quality-thresholds", default=None,
              help='JSON overrides of the quality gate, e.g. \'{"gate_min_samples": 100}\' (docs/quality.md)')
@click.option("--benchmark", is_flag=True,
              help="a benchmark run: fake-engine workers (--fake-engine) may serve it, and its model is not "
                   "checked; fake workers refuse every other run")
@click.option("--json", "as_json", is_flag=True)
@db_option
@redis_option
def submit(paths, run_name, model, output_url, batch_size, queue, quality_thresholds, benchmark, as_json, database_url,
           redis_url, **run_config) -> None:
    """Register PATHS (JSONL/Parquet files or folders) as a run and enqueue its batches.

    Everything that can be checked is checked before anything is written (producer/submit_checks.py).
    """
    from dataclasses import asdict

    from ledger.dispatch import make_celery

    from .submit import submit_run
    from .submit_checks import check_submit

    thresholds = None
    if quality_thresholds is not None:
        from ledger.quality import Thresholds

        try:
            raw = json.loads(quality_thresholds)
        except ValueError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint="--quality-thresholds") from e
        thresholds = Thresholds.from_json(raw).to_json()
    if batch_size <= 0:
        raise click.BadParameter("must be positive", param_hint="--batch-size")
    settings = _settings(database_url, redis_url)
    check_submit(settings, list(paths), model=model, output_url=output_url, benchmark=benchmark)
    config = run_config_from(model, run_config)
    app = make_celery(settings)
    with ledger(settings) as sessions:
        report = submit_run(sessions, app, store(settings), list(paths), run_name=run_name, config=config,
                            output_url=output_url, batch_size=batch_size, queue=queue,
                            quality_thresholds=thresholds, window=settings.queue_window, benchmark=benchmark)
    if as_json:
        click.echo(json.dumps(asdict(report), indent=2))
        return
    if benchmark:
        click.echo(f"run {report.run} is a benchmark run: fake-engine workers may serve it")
    click.echo(f"run {report.run} ({'created' if report.created else 'resumed'}): {report.rows_read:,} rows read, "
               f"{report.samples_new:,} new samples in {report.batches_new:,} batches, "
               f"{report.samples_known:,} already registered, {report.rejected:,} rejected, "
               f"{report.duplicates:,} duplicates")
    if config.parsers is not None:
        click.echo(f"parsers: reasoning {config.parsers.reasoning or 'none'}, tool {config.parsers.tool or 'none'} "
                   f"({config.parsers.chosen_by})")
    if config.chat_format == "harmony":
        click.echo(f"rendered with Harmony (gpt-oss, as vLLM serves it): reasoning effort {config.reasoning_effort}, "
                   f"system date {config.harmony_start_date}")
    if report.batches_republished:
        click.echo(f"published {report.batches_republished} batches left unpublished by an earlier submit")
    if report.batches_planned:
        click.echo(f"{report.batches_published:,} batches published, {report.batches_planned:,} planned: the queue "
                   f"holds {settings.queue_window:,} messages at most, and the workers' reconciler publishes the rest "
                   "as it drains")
    for reason, n in sorted(report.reject_reasons.items()):
        click.echo(f"  {reason}: {n}")
    from .monitoring.rejected import first_rejects_lines

    for line in first_rejects_lines(report):
        click.echo(line)


@main.command()
@click.option("--run", "run_name", default=None, help="one run (default: all)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable, see docs/formats.md")
@click.option("--watch", is_flag=True, help="live view, redrawn every --interval seconds until Ctrl-C")
@click.option("--interval", type=float, default=5.0, show_default=True, help="seconds between redraws (--watch)")
@click.option("--rejected", is_flag=True, help="list the rejected input rows (file:row reason detail)")
@click.option("--reason", default=None, help="with --rejected: only this reason (e.g. malformed_json)")
@click.option("--limit", type=int, default=100, show_default=True, help="with --rejected: rows listed at most")
@db_option
def status(run_name: str | None, as_json: bool, watch: bool, interval: float, rejected: bool, reason: str | None,
           limit: int, database_url: str | None) -> None:
    """Samples by status, rejected rows and why, tokens, throughput, ETA."""
    if rejected or reason:
        from .monitoring.rejected import rejected_text

        click.echo(rejected_text(_settings(database_url), run_name, reason, limit, as_json=as_json))
        return
    if watch:
        if as_json:
            raise click.UsageError("--watch and --json do not mix")
        from .monitoring.watch import watch_status

        sys.exit(watch_status(_settings(database_url), run_name, interval_s=interval))
    # psycopg alone, no SQLAlchemy engine: importing SQLAlchemy would cost this command
    # more than its queries (ledger/reads.py); tests/integration/test_status_imports.py keeps it so.
    from ledger.reads import connect

    from .monitoring.status import render_status, run_status

    settings = _settings(database_url)
    with connect(settings) as conn:
        runs = run_status(conn, run_name, broker_url=settings.redis_url)
    if run_name and not runs:
        raise RunNotFound(run_name)
    if as_json:
        click.echo(json.dumps({"runs": runs}, indent=2, default=str))
    else:
        click.echo(render_status(runs))


@main.command()
@click.option("--run", "run_name", default=None, help="one run (default: all)")
@click.option("--lease-s", type=float, default=DEFAULT_LEASE_S, show_default=True,
              help="running batches without a heartbeat for this long are presumed lost")
@click.option("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, show_default=True)
@db_option
@redis_option
def requeue(run_name, lease_s, max_attempts, database_url, redis_url) -> None:
    """Rebuild the queue from the ledger (after Redis was flushed or restarted empty)."""
    from ledger.dispatch import make_celery
    from ledger.reconcile import requeue as do_requeue

    settings = _settings(database_url, redis_url)
    with ledger(settings) as sessions:
        report = do_requeue(sessions, make_celery(settings), run=run_name, lease_s=lease_s,
                            max_attempts=max_attempts, window=settings.queue_window)
    click.echo(f"{report.republished} batches published, {report.expired} lost leases expired "
               f"({report.dead} of them now dead, {report.handed_back} hand-backs with no failure counted), "
               f"{report.topped_up} planned batches published to fill the queue")


@main.command()
@click.option("--run", "run_name", required=True)
@click.option("--failed", is_flag=True, help="failed samples: into new batches")
@click.option("--dead", is_flag=True, help="dead batches: queued again with their failures reset")
@db_option
@redis_option
def retry(run_name, failed, dead, database_url, redis_url) -> None:
    """Queue again, on request, what failed (never automatic)."""
    from ledger.dispatch import make_celery

    from .retry import retry_dead, retry_failed

    if not (failed or dead):
        raise click.UsageError("say what to retry: --failed and/or --dead")
    settings = _settings(database_url, redis_url)
    app = make_celery(settings)
    with ledger(settings) as sessions:
        if dead:
            d = retry_dead(sessions, app, store(settings), run_name)
            click.echo(f"{d.queued} dead batches queued again")
            for line in d.kept_dead:
                click.echo(line, err=True)
        if failed:
            r = retry_failed(sessions, app, store(settings), run_name)
            click.echo(f"{r.failed_samples} failed samples queued again in {r.new_batches} new batches")


@main.command()
@click.option("--port", type=int, default=9464, show_default=True, help="HTTP port of /metrics")
@click.option("--address", default="0.0.0.0", show_default=True, help="address to listen on")
@click.option("--queue", "queues", multiple=True, help="a broker queue to measure besides every run's (repeatable)")
@db_option
@redis_option
def metrics(port: int, address: str, queues: tuple[str, ...], database_url: str | None, redis_url: str | None) -> None:
    """Serve Prometheus metrics computed from the ledger and the broker on each scrape."""
    from .monitoring.metrics import serve

    click.echo(f"regen metrics on http://{address}:{port}/metrics")
    sys.exit(serve(_settings(database_url, redis_url), port=port, addr=address, queues=queues))


@main.command()
@click.option("--run", "run_name", required=True)
@click.option("--ledger", "delete_ledger", is_flag=True,
              help="also delete the run's rows (runs, batches, samples, rejected_rows)")
@click.option("--yes", is_flag=True, help="delete; without it, only show what would be deleted")
@click.option("--force", is_flag=True, help="even if batches are still waiting or running")
@db_option
def clean(run_name: str, delete_ledger: bool, yes: bool, force: bool, database_url: str | None) -> None:
    """Delete a run's objects (its whole output prefix) and, with --ledger, its ledger rows."""
    from .clean import clean_run, describe_plan, plan_clean

    settings = _settings(database_url)
    with ledger(settings) as sessions:
        objects = store(settings)
        if not yes:
            click.echo(describe_plan(plan_clean(sessions, objects, run_name), delete_ledger=delete_ledger))
            click.echo("nothing deleted: add --yes to delete")
            return
        report = clean_run(sessions, objects, run_name, delete_ledger=delete_ledger, force=force)
    click.echo(f"run {run_name}: {report.objects_deleted:,} objects deleted, ledger rows "
               + ("deleted" if report.ledger_deleted else "kept"))


@main.command()
@click.option("--run", "run_name", required=True)
@click.option("--force", is_flag=True, help="continue even though the quality gate would pause the run again")
@click.option("--lease-s", type=float, default=DEFAULT_LEASE_S, show_default=True)
@db_option
@redis_option
def resume(run_name: str, force: bool, lease_s: float, database_url: str | None, redis_url: str | None) -> None:
    """Continue a run paused by the quality gate (after a human looked at `regen report`)."""
    from ledger.dispatch import make_celery
    from ledger.quality import resume_run
    from ledger.reconcile import requeue as do_requeue

    settings = _settings(database_url, redis_url)
    with ledger(settings) as sessions:
        with sessions.begin() as s:
            result = resume_run(s, run_name, force)
        click.echo(result.message)
        if result.status == "active":
            report = do_requeue(sessions, make_celery(settings), run=run_name, lease_s=lease_s,
                                window=settings.queue_window)
            click.echo(f"{report.republished} queued batches published again, {report.topped_up} planned ones "
                       "published")


@main.command()
@click.option("--run", "run_name", required=True)
@click.option("--out", "out_dir", required=True, help="folder for index.html, the PNG plots and summary.txt")
@click.option("--max-shards", type=int, default=200, show_default=True,
              help="output shards read for per-generation figures (0: all)")
@db_option
def report(run_name: str, out_dir: str, max_shards: int, database_url: str | None) -> None:
    """An HTML report with plots: lengths, finish reasons, quality classes, loss-mask token counts."""
    from .results.report import write_report

    settings = _settings(database_url)
    with ledger(settings) as sessions:
        path = write_report(sessions, store(settings), run_name, out_dir, max_shards=max_shards or None)
    click.echo(f"report: {path}")


@main.command()
@click.option("--run", "run_names", multiple=True, required=True, help="run to export (repeatable: same config)")
@click.option("--format", "fmt", type=click.Choice(["messages", "tokens"]), required=True)
@click.option("--out", "out_dir", required=True)
@click.option("--include-all", is_flag=True, help="keep every quality class")
@click.option("--include", "include", multiple=True, help="also keep this bad quality class (repeatable)")
@click.option("--shard-size", type=int, default=None, help="rows per output file")
@click.option("--tokenizer", default=None,
              help="folder of the model's tokenizer.json (tokens format's text) and config.json (--draft-vocab's "
                   "target vocab size); default: the model")
@click.option("--eval-share", type=float, default=0.0, show_default=True,
              help="share of the samples held out in eval/ by a hash of sample id and seed (0: no split)")
@click.option("--split-seed", type=int, default=None, help="seed of the split's hash (default: the run's seed)")
@click.option("--draft-vocab", type=int, default=None,
              help="write SpecForge's and speculators' d2t/t2d mappings for a draft vocabulary of N tokens")
@db_option
def export(run_names, fmt, out_dir, include_all, include, shard_size, tokenizer, eval_share, split_seed, draft_vocab,
           database_url) -> None:
    """Training-ready data: messages (Parquet) or tokens (speculators/SpecForge JSONL), with a manifest."""
    from .results.export import export_run

    settings = _settings(database_url)
    with ledger(settings) as sessions:
        manifest = export_run(sessions, store(settings), list(run_names), fmt, out_dir, include_all=include_all,
                              include=tuple(include), shard_rows=shard_size, tokenizer=tokenizer,
                              eval_share=eval_share, split_seed=split_seed, draft_vocab=draft_vocab,
                              progress=lambda line: click.echo(f"export: {line}", err=True))
    fake = manifest.data.get("fake_rows_left_out") or 0
    if fake:
        click.echo(f"warning: {fake:,} samples made by the fake engine were left out (manifest: left_out.samples."
                   "fake_engine); `regen status` names the run's fake batches", err=True)
    counts = manifest.data["counts"]
    click.echo(f"exported {counts['samples']:,} samples as {counts['rows']:,} rows in {counts['shards']:,} files")
    left = {reason: entry["count"] for group in manifest.data["left_out"].values() for reason, entry in group.items()
            if entry["count"]}
    if left:
        click.echo("left out: " + ", ".join(f"{reason} {n:,}" for reason, n in left.items())
                   + " (the manifest's left_out says why, and which --include keeps a class)")
    click.echo(f"export: {manifest.path}")


def _register_estimate() -> None:
    from .estimate.command import estimate_command

    main.add_command(estimate_command, "estimate")


_register_estimate()

if __name__ == "__main__":
    main()
