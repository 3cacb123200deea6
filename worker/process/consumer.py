"""One worker process: one engine, a threads pool of batches in flight, one Celery consumer.

Started by ``regen worker`` (worker/process/launcher.py) once per GPU group with
``CUDA_VISIBLE_DEVICES`` already set; run it by hand as
``python -m worker.process.consumer --name gpu0@host``.

Why the threads pool: prefork children are daemonic and cannot start vLLM's engine
processes; solo runs one batch at a time (the engine drains at every boundary) and
loses the batch on a cold shutdown. Threads feed one shared engine, and on SIGTERM
each in-flight batch is handed back to the broker within a second.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading

from celery import signals

from ledger.dispatch import make_celery
from ledger.settings import Settings
from worker.batches.task import register_tasks
from worker.engine.args import parse_engine_args
from worker.engine.build_errors import EXIT_ENGINE_NEVER_BUILDS
from worker.engine.host import expected_max_num_seqs
from worker.measure import ledger_timing
from worker.process import log_urls
from worker.process.options import WorkerOptions
from worker.process.orphans import LAUNCHER_PID_ENV
from worker.process.runtime import EngineUnavailable, WorkerRuntime

log = logging.getLogger("regen.worker")


def build_parser() -> argparse.ArgumentParser:
    d = WorkerOptions(name=f"cpu0@{socket.gethostname()}")  # the defaults, declared once
    p = argparse.ArgumentParser(prog="python -m worker.process.consumer")
    p.add_argument("--name", default=d.name)
    p.add_argument("--queues", default=",".join(d.queues))
    p.add_argument("--concurrency", type=int, default=d.concurrency,
                   help="batches held (Celery threads); 0: derived from the engine's max_num_seqs")
    p.add_argument("--model", default=d.model, help="load this model at start instead of on the first batch")
    p.add_argument("--engine-arg", action="append", default=[])
    p.add_argument("--lease-s", type=float, default=d.lease_s)
    p.add_argument("--heartbeat-s", type=float, default=d.heartbeat_s)
    p.add_argument("--max-attempts", type=int, default=d.max_attempts)
    p.add_argument("--reconcile-s", type=float, default=d.reconcile_s)
    p.add_argument("--requeue-grace-s", type=float, default=d.requeue_grace_s)
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve vLLM's engine metrics and the batches in flight on this port (0: off)")
    p.add_argument("--fake-engine", default=None, metavar="tok_s=10000,seqs=1024,mean=1500,sigma=1,gpus=1",
                   help="BENCHMARK/TEST DEVICE: no vLLM, random token ids at this rate (worker/engine/fake.py); "
                        "it serves benchmark runs only (regen submit --benchmark); its output is marked fake")
    p.add_argument("--stop-taking-at", type=float, default=d.stop_taking_at, metavar="EPOCH_S",
                   help="take no new batch after this time (a SLURM job's end less its drain; "
                        "worker/process/deadline.py)")
    p.add_argument("--loglevel", default="INFO")
    return p


def _exit_with_launcher(runtime: WorkerRuntime) -> None:
    """Stop (handing batches back) when the launcher that started us is gone.

    The launcher also sets PR_SET_PDEATHSIG; this watch covers a launcher that died
    before that took effect. Run by hand (no launcher), the process watches nothing.
    """
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher:
        return

    def watch() -> None:
        while not runtime.shutting_down.wait(1.0):
            if os.getppid() != int(launcher):
                runtime.request_exit(f"the launcher (pid {launcher}) is gone")
                return

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _occupancy_gauges(runtime: WorkerRuntime, name: str) -> None:
    """worker/engine/occupancy.py's figures since the engine started (0 before it has)."""
    from prometheus_client import Gauge

    def read(key: str):
        def value() -> float:
            engine = runtime.engine
            return engine.occupancy.figures()[key] if engine is not None and engine.occupancy else 0.0
        return value

    for key, doc in (
            ("short_with_work_seconds",
             "Seconds the engine held fewer than max_num_seqs requests while conversations waited at the gate"),
            ("short_without_work_seconds",
             "Seconds the engine held fewer than max_num_seqs requests and no conversation waited"),
            ("loop_lag_max_seconds", "Longest delay of the engine's event loop the occupancy sampler saw")):
        Gauge(f"regen_worker_engine_{key}", doc, ["worker"]).labels(name).set_function(read(key))


def _hold_adaptively(app, runtime: WorkerRuntime, start: int) -> int:
    """Start with ``start`` held batches, grow when the engine starves (worker/batches/holding.py); the pool size."""
    from worker.batches.holding import HoldingController, HoldingPolicy, consumer_step

    def window():
        engine = runtime.engine
        return engine.occupancy.take() if engine is not None and engine.occupancy is not None else None

    policy = HoldingPolicy.derived(start)
    # Bounded by the backlog too: near a run's end no worker holds much more than its share.
    controller = HoldingController(policy, window=window, held_peak=runtime.held.take_peak,
                                   stop=runtime.shutting_down, sharing=runtime.sharing(floor_fallback=start))
    app.steps["consumer"].add(consumer_step(controller))
    controller.start()
    return policy.ceiling


#: Test only (tests/faults/test_unclaimed_deliveries.py): messages reserved per thread with a
#: fixed --concurrency, so a worker holds deliveries it has not claimed, as a thread pool
#: busier than its prefetch does. Never set it on a farm: the extra messages only wait.
TEST_PREFETCH_ENV = "REGEN_TEST_PREFETCH_MULTIPLIER"


def _prefetch_multiplier() -> str:
    value = os.environ.get(TEST_PREFETCH_ENV, "1")
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"{TEST_PREFETCH_ENV} must be a positive whole number, got {value!r}")
    if value != "1":
        log.warning("%s=%s: reserving %s messages per thread (a test setting)", TEST_PREFETCH_ENV, value, value)
    return value


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    engine_args = parse_engine_args(args.engine_arg)
    if args.metrics_port:
        # vLLM records its engine figures (running requests, KV use) only with stats on.
        engine_args.setdefault("disable_log_stats", False)
    options = WorkerOptions(name=args.name, queues=tuple(q for q in args.queues.split(",") if q),
                            concurrency=args.concurrency, model=args.model, engine_args=engine_args, lease_s=args.lease_s,
                            heartbeat_s=args.heartbeat_s, max_attempts=args.max_attempts,
                            reconcile_s=args.reconcile_s, requeue_grace_s=args.requeue_grace_s,
                            fake_engine=args.fake_engine, stop_taking_at=args.stop_taking_at)
    settings = Settings.from_env()
    runtime = WorkerRuntime(settings, options)
    app = make_celery(settings)
    register_tasks(app, runtime)
    if args.metrics_port:
        from prometheus_client import Gauge, start_http_server

        Gauge("regen_worker_batches_in_flight", "Batches this worker process holds", ["worker"]).labels(
            args.name).set_function(runtime.held.count)
        Gauge("regen_worker_fake_refusals", "Deliveries this fake-engine process refused: their runs were not "
              "submitted with --benchmark", ["worker"]).labels(args.name).set_function(lambda: runtime.fake_refusals)
        _occupancy_gauges(runtime, args.name)
        start_http_server(args.metrics_port)

    @signals.worker_shutting_down.connect(weak=False)
    def _on_shutting_down(**_):
        # Warm shutdown waits for running tasks: make them hand their batches back now.
        log.info("%s: shutting down, handing back its %d held batches within %.0f s", options.name,
                 runtime.held.count(), options.hand_back_s)
        runtime.begin_shutdown()

    @signals.worker_shutdown.connect(weak=False)
    def _on_shutdown(**_):
        runtime.close()

    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log_urls.install(settings.redis_url)  # kombu logs redis://:**@ for a Redis without a password

    @signals.after_setup_logger.connect(weak=False)
    def _on_celery_logging(logger=None, **_):
        log_urls.install(settings.redis_url, logger)  # Celery's own handlers, set up after ours

    _exit_with_launcher(runtime)
    ledger_timing.install_from_env()  # a benchmark switch (bench/farm.py); off unless REGEN_LEDGER_TIMING is set
    runtime.start_heartbeats()
    if options.reconcile_s > 0:
        runtime.start_reconciler(app)
    if options.stop_taking_at is not None:
        from worker.process.deadline import celery_cancel, watch_deadline

        watch_deadline(options.stop_taking_at, stop_taking=runtime.stop_taking, stopping=runtime.shutting_down,
                       cancel=celery_cancel(app, options.name, options.queues), held=runtime.held.count,
                       name=options.name)
    if options.fake_engine:
        from worker.engine.fake import FakeEngineSpec

        max_num_seqs = FakeEngineSpec.parse(options.fake_engine).max_num_seqs
        log.warning("%s runs the FAKE ENGINE: a benchmark and test device, its output is not generated data; it "
                    "serves runs submitted with --benchmark only and hands back every other batch", options.name)
    elif options.model:
        try:
            max_num_seqs = runtime.engine_for(options.model)[0].max_num_seqs
        except EngineUnavailable:
            if runtime.engine_never_builds is not None:
                runtime.close()  # Celery never started: nothing else closes it
            _stop_if_engine_never_builds(runtime, options.name)
            raise
    else:
        max_num_seqs = expected_max_num_seqs(engine_args)
    held = options.held_batches(max_num_seqs)
    threads = _hold_adaptively(app, runtime, held) if options.concurrency <= 0 else held
    log.info("%s: holding up to %d batches (max_num_seqs %d%s)", options.name, held, max_num_seqs,
             f"; grown up to {threads} when the engine runs short of work" if threads > held else ", fixed")
    app.worker_main([
        "worker", "--pool", "threads", "--concurrency", str(threads), "--hostname", options.name,
        "--queues", ",".join(options.queues), "--prefetch-multiplier", _prefetch_multiplier(), "--without-gossip",
        "--without-mingle", "--task-events", "--loglevel", args.loglevel,
    ])
    _stop_if_engine_never_builds(runtime, options.name)


def _stop_if_engine_never_builds(runtime: WorkerRuntime, name: str) -> None:
    """Exit with ``EXIT_ENGINE_NEVER_BUILDS`` and one line of why, where no retry could build the engine.

    Its batches were handed back already (worker/batches/delivery.py); the launcher, seeing the status,
    does not restart this process (worker/process/launcher.py, worker/engine/build_errors.py).
    """
    if runtime.engine_never_builds is None:
        return
    log.error("%s stopped for good: its engine can never be built: %s", name, runtime.engine_never_builds)
    sys.exit(EXIT_ENGINE_NEVER_BUILDS)


if __name__ == "__main__":
    main()
