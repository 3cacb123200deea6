"""One worker process: one engine, a threads pool of batches in flight, one Celery consumer.

Started by ``regen worker`` (worker/launcher.py) once per GPU group with
``CUDA_VISIBLE_DEVICES`` already set; run it by hand as
``python -m worker.process --name gpu0@host``.

Why the threads pool: prefork children are daemonic and cannot start vLLM's engine
processes; solo runs one batch at a time (the engine drains at every boundary) and
loses the batch on a cold shutdown. Threads feed one shared engine, and on SIGTERM
each in-flight batch is handed back to the broker within a second.
"""

from __future__ import annotations

import argparse
import logging
import socket

from celery import signals

from ledger.dispatch import make_celery
from ledger.settings import Settings

from .engine_args import parse_engine_args
from .runtime import WorkerOptions, WorkerRuntime
from .tasks import register_tasks

log = logging.getLogger("regen.worker")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m worker.process")
    p.add_argument("--name", default=f"cpu0@{socket.gethostname()}")
    p.add_argument("--queues", default="regen")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--model", default=None, help="load this model at start instead of on the first batch")
    p.add_argument("--engine-arg", action="append", default=[])
    p.add_argument("--lease-s", type=float, default=90.0)
    p.add_argument("--heartbeat-s", type=float, default=15.0)
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--reconcile-s", type=float, default=60.0)
    p.add_argument("--requeue-grace-s", type=float, default=300.0)
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve vLLM's engine metrics and the batches in flight on this port (0: off)")
    p.add_argument("--loglevel", default="INFO")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    engine_args = parse_engine_args(args.engine_arg)
    if args.metrics_port:
        # vLLM records its engine figures (running requests, KV use) only with stats on.
        engine_args.setdefault("disable_log_stats", False)
    options = WorkerOptions(name=args.name, queues=tuple(q for q in args.queues.split(",") if q),
                            concurrency=args.concurrency, model=args.model, engine_args=engine_args, lease_s=args.lease_s,
                            heartbeat_s=args.heartbeat_s, max_attempts=args.max_attempts,
                            reconcile_s=args.reconcile_s, requeue_grace_s=args.requeue_grace_s)
    settings = Settings.from_env()
    runtime = WorkerRuntime(settings, options)
    app = make_celery(settings)
    register_tasks(app, runtime)
    if args.metrics_port:
        from prometheus_client import Gauge, start_http_server

        Gauge("regen_worker_batches_in_flight", "Batches this worker process holds", ["worker"]).labels(
            args.name).set_function(runtime.held_count)
        start_http_server(args.metrics_port)

    @signals.worker_shutting_down.connect(weak=False)
    def _on_shutting_down(**_):
        # Warm shutdown waits for running tasks: make them hand their batches back now.
        runtime.begin_shutdown()

    @signals.worker_shutdown.connect(weak=False)
    def _on_shutdown(**_):
        runtime.close()

    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runtime.start_heartbeats()
    if options.reconcile_s > 0:
        runtime.start_reconciler(app)
    if options.model:
        runtime.engine_for(options.model)
    app.worker_main([
        "worker", "--pool", "threads", "--concurrency", str(options.concurrency), "--hostname", options.name,
        "--queues", ",".join(options.queues), "--prefetch-multiplier", "1", "--without-gossip",
        "--without-mingle", "--task-events", "--loglevel", args.loglevel,
    ])


if __name__ == "__main__":
    main()
