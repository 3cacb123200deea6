"""``regen metrics``: a Prometheus exporter for the farm, computed from the ledger and Redis on each scrape.

Every figure is read when Prometheus scrapes, never counted in the exporter, so
the exporter holds no state worth keeping: restart it, run two, scrape it from two
Prometheus servers, and the numbers agree. The "counters" (tokens, samples done)
are the ledger's running totals, so ``rate()`` works across exporter restarts.

Cost per scrape: what the runs and their open batches hold, not their history. The
ledger's figures come from counters that triggers keep (batches, tokens, samples,
rejected rows) and from the batches that are queued, running, ever failed or fake,
through indexes of those alone (producer/monitoring/metrics_ledger.py says which); then
one pipelined round trip to Redis. No cache: the done history is never read, so a
whole scrape took 12 ms at 1M samples and 22 ms at 100M on the shared 2-core machine
(20,000 batches running; 460 ms before migration 0015): bench/metrics_scale.py,
docs/performance.md. What it grows with is the running batches and their workers.

Engine figures (requests running and waiting, KV-cache use) live in the worker
processes; see docs/operations.md, "Metrics".
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis as redis_lib
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from ledger.db import make_engine
from ledger.dispatch import DEFAULT_QUEUE
from ledger.settings import Settings
from ledger.states import BatchStatus, SampleStatus

from .metrics_ledger import LedgerFigures, read_ledger

log = logging.getLogger(__name__)

DEFAULT_PORT = 9464
#: kombu's Redis transport keeps a message of priority p > 0 in the list "<queue>\x06\x16<p>"
#: (its default priority steps are 0, 3, 6, 9); counting them all is what Flower does too.
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
#: The hash of delivered, unacknowledged messages (kombu's Redis transport, no key prefix).
UNACKED_KEY = "unacked"
#: A scrape must answer in seconds even when Postgres is slow: Prometheus times out at 10 s by default.
STATEMENT_TIMEOUT_MS = 8000
REDIS_TIMEOUT_S = 5.0


@dataclass
class BrokerFigures:
    queues: dict[str, int]
    unacked: int


def read_broker(client: redis_lib.Redis, queues: Sequence[str]) -> BrokerFigures:
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue)
        for step in PRIORITY_STEPS:
            pipe.llen(f"{queue}{PRIORITY_SEP}{step}")
    pipe.hlen(UNACKED_KEY)
    replies = pipe.execute()
    per_queue = 1 + len(PRIORITY_STEPS)
    depth = {q: int(sum(replies[i * per_queue:(i + 1) * per_queue])) for i, q in enumerate(queues)}
    return BrokerFigures(queues=depth, unacked=int(replies[-1]))


def build_metrics(ledger: LedgerFigures | None, broker: BrokerFigures | None, *, scrape_s: float) -> list[Metric]:
    """The metric families for one scrape; a None source is reported as down and left out."""
    out: list[Metric] = []
    up = GaugeMetricFamily("regen_ledger_up", "1 if the ledger (Postgres) answered this scrape")
    up.add_metric([], 1.0 if ledger is not None else 0.0)
    out.append(up)
    up = GaugeMetricFamily("regen_broker_up", "1 if the broker (Redis) answered this scrape")
    up.add_metric([], 1.0 if broker is not None else 0.0)
    out.append(up)
    if broker is not None:
        depth = GaugeMetricFamily("regen_queue_messages", "Messages waiting in a broker queue (LLEN, every "
                                  "priority level)", labels=["queue"])
        for queue, n in sorted(broker.queues.items()):
            depth.add_metric([queue], n)
        unacked = GaugeMetricFamily("regen_unacked_messages", "Messages delivered to workers and not acknowledged "
                                    "yet (HLEN unacked): batches in flight plus those reserved by busy workers")
        unacked.add_metric([], broker.unacked)
        out += [depth, unacked]
    if ledger is not None:
        out += _ledger_metrics(ledger)
    duration = GaugeMetricFamily("regen_scrape_duration_seconds", "Time this scrape spent querying the ledger and "
                                 "the broker")
    duration.add_metric([], scrape_s)
    out.append(duration)
    return out


def _ledger_metrics(ledger: LedgerFigures) -> list[Metric]:
    names = {r["id"]: r["name"] for r in ledger.runs}
    info = GaugeMetricFamily("regen_run_info", "Always 1; the run's model, queue and status (active, paused, "
                             "finished) as labels", labels=["run", "model", "queue", "status"])
    batches = GaugeMetricFamily("regen_batches", "Batches of a run by status", labels=["run", "status"])
    samples = GaugeMetricFamily("regen_samples", "Samples of a run by status", labels=["run", "status"])
    quality = GaugeMetricFamily("regen_samples_quality", "Committed samples of a run by quality class "
                                "(ledger/quality.py)", labels=["run", "quality"])
    completion = CounterMetricFamily("regen_completion_tokens", "Completion tokens of a run's committed batches",
                                     labels=["run"])
    prompt = CounterMetricFamily("regen_prompt_tokens", "Prompt tokens of a run's committed batches", labels=["run"])
    done = CounterMetricFamily("regen_samples_done", "Samples of a run regenerated and committed", labels=["run"])
    batches_done = CounterMetricFamily("regen_batches_done", "Batches of a run committed", labels=["run"])
    failures = CounterMetricFamily("regen_batch_failures", "Failed batch attempts of a run (errors, lost leases); "
                                   "`regen retry --dead` resets those of dead batches", labels=["run"])
    last = GaugeMetricFamily("regen_last_commit_timestamp_seconds", "When the run's last batch was committed "
                             "(Unix time)", labels=["run"])
    fake = GaugeMetricFamily("regen_fake_batches", "Done batches of a run made by the fake engine (benchmark "
                             "device: random token ids; export leaves them out)", labels=["run"])
    refusals = CounterMetricFamily("regen_fake_refusals", "Deliveries of a run refused by fake-engine workers: "
                                   "the run was not submitted with --benchmark", labels=["run"])
    refused = GaugeMetricFamily("regen_refused_batches", "Queued batches of a run whose last attempt a worker "
                                "refused (another model's worker, or parsers its vLLM cannot build): no failure "
                                "counted, so a run no worker can serve only waits; alert on it", labels=["run"])
    for run in ledger.runs:
        rid, name = run["id"], run["name"]
        info.add_metric([name, run["model"], run["queue"], run["status"]], 1.0)
        figures = ledger.per_run[rid]
        for status, n in figures.batches.items():
            batches.add_metric([name, status], n)
        for status, n in figures.samples.by_status.items():
            samples.add_metric([name, status], n)
        for quality_class, n in sorted(figures.samples.by_quality.items()):
            quality.add_metric([name, quality_class], n)
        completion.add_metric([name], float(figures.completion_tokens))
        prompt.add_metric([name], float(figures.prompt_tokens))
        batches_done.add_metric([name], figures.batches[BatchStatus.DONE.value])
        done.add_metric([name], figures.samples.by_status.get(SampleStatus.DONE.value, 0))
        failures.add_metric([name], float(figures.failures))
        fake.add_metric([name], figures.fake_batches)
        refusals.add_metric([name], float(figures.fake_refusals))
        refused.add_metric([name], figures.refused)
        if figures.last_commit_s is not None:
            last.add_metric([name], figures.last_commit_s)
    rejected = GaugeMetricFamily("regen_rejected_rows", "Input rows that never became samples, by reason "
                                 "(duplicate_id included)", labels=["run", "reason"])
    for rid, reason, n in ledger.rejected:
        if rid in names:
            rejected.add_metric([names[rid], reason], n)
    running = GaugeMetricFamily("regen_running_batches", "Batches a worker holds right now", labels=["run", "worker"])
    heartbeat = GaugeMetricFamily("regen_worker_heartbeat_age_seconds", "Age of the oldest lease heartbeat among "
                                  "the batches a worker holds; beyond the workers' --lease-s it is presumed dead",
                                  labels=["worker"])
    ages: dict[str, float] = {}
    for rid, worker, n, age_s in ledger.running:
        if rid in names:
            running.add_metric([names[rid], worker], n)
        ages[worker] = max(age_s, ages.get(worker, 0.0))
    for worker, age_s in sorted(ages.items()):
        heartbeat.add_metric([worker], age_s)
    return [info, batches, samples, quality, completion, prompt, done, batches_done, failures, last, rejected, running,
            heartbeat, fake, refusals, refused]


def _queues(ledger: LedgerFigures | None, extra: Sequence[str]) -> list[str]:
    names = {DEFAULT_QUEUE, *extra}
    if ledger is not None:
        names |= {r["queue"] for r in ledger.runs}
    return sorted(names)


def collect(settings: Settings, *, db: Engine | None = None, redis_client: redis_lib.Redis | None = None,
            queues: Sequence[str] = ()) -> list[Metric]:
    """Query the ledger and the broker once; return the metric families of one scrape.

    Args:
        settings: where the ledger and the broker are.
        db, redis_client: connections to reuse across scrapes (made and closed here when None).
        queues: broker queues to measure besides the default one and every run's queue.
    """
    started = time.monotonic()
    own_db = db is None
    own_redis = redis_client is None
    db = db if db is not None else ledger_engine(settings)
    redis_client = redis_client if redis_client is not None else broker_client(settings)
    try:
        ledger = None
        try:
            ledger = read_ledger(db)
        except SQLAlchemyError as e:
            log.warning("ledger unavailable for this scrape: %s", str(e).splitlines()[0])
        broker = None
        try:
            broker = read_broker(redis_client, _queues(ledger, queues))
        except redis_lib.RedisError as e:
            log.warning("broker unavailable for this scrape: %s", e)
        return build_metrics(ledger, broker, scrape_s=time.monotonic() - started)
    finally:
        if own_db:
            db.dispose()
        if own_redis:
            redis_client.close()


def ledger_engine(settings: Settings) -> Engine:
    engine = make_engine(settings, pool_size=2, max_overflow=2, connect_args={"connect_timeout": 5})

    # The timeout is set in each transaction, not as a startup option (``-c statement_timeout``):
    # PgBouncer refuses that ("unsupported startup parameter: options"), and a session setting
    # would stay behind on a pooled server connection for its next client.
    @event.listens_for(engine, "begin")
    def _bounded(conn) -> None:
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")

    return engine


def broker_client(settings: Settings) -> redis_lib.Redis:
    return redis_lib.Redis.from_url(settings.redis_url, socket_timeout=REDIS_TIMEOUT_S,
                                    socket_connect_timeout=REDIS_TIMEOUT_S)


class RegenCollector(Collector):
    """A prometheus_client collector that calls :func:`collect` on each scrape, with kept connections."""

    def __init__(self, settings: Settings, queues: Sequence[str] = ()):
        self.settings = settings
        self.queues = tuple(queues)
        self.db = ledger_engine(settings)
        self.redis = broker_client(settings)

    def collect(self) -> Iterable[Metric]:
        return collect(self.settings, db=self.db, redis_client=self.redis, queues=self.queues)

    def close(self) -> None:
        self.db.dispose()
        self.redis.close()


def start_exporter(settings: Settings, *, port: int = DEFAULT_PORT, addr: str = "0.0.0.0",
                   queues: Sequence[str] = ()) -> tuple[object, RegenCollector]:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread; return (HTTP server, collector).

    Call ``server.shutdown()`` then ``collector.close()`` to stop.
    """
    registry = CollectorRegistry(auto_describe=False)
    collector = RegenCollector(settings, queues)
    registry.register(collector)
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server, collector


def serve(settings: Settings, *, port: int = DEFAULT_PORT, addr: str = "0.0.0.0", queues: Sequence[str] = ()) -> int:
    """``regen metrics``: serve until SIGTERM or Ctrl-C; return the exit code."""
    server, collector = start_exporter(settings, port=port, addr=addr, queues=queues)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log.info("regen metrics on http://%s:%d/metrics", addr, port)
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        collector.close()
    return 0
