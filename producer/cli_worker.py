"""``regen worker``: start one worker process per GPU group on this node and supervise them.

Its own module because it is the one command that starts processes (worker/process/launcher.py)
and reads SLURM's environment (worker/process/slurm.py); producer/cli.py registers it.
"""

from __future__ import annotations

import logging
import sys

import click

from worker.process.options import WorkerOptions

from .cli_common import settings as _settings
from .monitoring.service_wait import DEFAULT_SERVICES_WAIT_S, wait_for_services

log = logging.getLogger("regen.cli")

_W = WorkerOptions(name="")  # regen worker's defaults: declared once, in worker/process/options.py


@click.command()
@click.option("--gpus", default="none", show_default=True, help="none (one CPU engine) | all | 0,1,2,3")
@click.option("--tp", type=int, default=1, show_default=True, help="tensor-parallel size: GPUs per engine")
@click.option("--concurrency", type=int, default=_W.concurrency, show_default=True,
              help="batches each engine holds, fixed; 0: start from its max_num_seqs and hold more "
                   "while it runs short of work")
@click.option("--queue", "queues", default=",".join(_W.queues), show_default=True,
              help="queues to consume (comma-separated)")
@click.option("--model", default=None, help="load this model at start (default: the first batch's model)")
@click.option("--engine-arg", "engine_args", multiple=True, help="vLLM engine argument key=value (repeatable)")
@click.option("--mtp", type=click.IntRange(0, 8), default=0, show_default=True,
              help="build the engine with the model's own MTP head drafting this many tokens a step (0: off); it "
                   "then serves only runs submitted with the same --mtp (their config hash names it)")
@click.option("--lease-s", type=float, default=_W.lease_s, show_default=True,
              help="a running batch without heartbeat for this long may be taken over")
@click.option("--max-attempts", type=int, default=_W.max_attempts, show_default=True,
              help="failures before a batch is dead")
@click.option("--heartbeat-s", type=float, default=_W.heartbeat_s, show_default=True, help="lease refresh interval")
@click.option("--reconcile-s", type=float, default=_W.reconcile_s, show_default=True,
              help="how often this node offers to requeue lost batches (0: never)")
@click.option("--requeue-grace-s", type=float, default=_W.requeue_grace_s, show_default=True,
              help="a queued batch with no message waiting and none claimed this long after its last "
                   "one gets a new message from the reconciler")
@click.option("--metrics-port", type=int, default=0, show_default=True,
              help="engine and worker metrics on this port + process index (0: off)")
@click.option("--node-name", default=None, help="this node's name in worker names (default: the host name)")
@click.option("--fake-engine", default=None, metavar="tok_s=..,seqs=..,mean=..,sigma=..,gpus=..",
              help="BENCHMARK/TEST DEVICE, not a production mode: no vLLM, random token ids at this rate "
                   "(worker/engine/fake.py); serves only runs submitted with --benchmark, refuses (and counts) "
                   "every other run's batches; its output is marked fake and never exported")
@click.option("--drain-before-end-s", type=float, default=_W.drain_before_end_s, show_default=True,
              help="in a SLURM job with a time limit, take no new batch this long before its end (0: off)")
@click.option("--services-wait-s", type=float, default=DEFAULT_SERVICES_WAIT_S, show_default=True,
              help="wait this long for the ledger and the broker at start, then exit non-zero")
@click.option("--dry-run", is_flag=True, help="print the processes that would start, and exit")
def worker(gpus, tp, concurrency, queues, model, engine_args, mtp, lease_s, max_attempts, heartbeat_s, reconcile_s,
           requeue_grace_s, metrics_port, node_name, fake_engine, drain_before_end_s, services_wait_s,
           dry_run) -> None:
    """Start one worker process per GPU group on this node and supervise them.

    In a SLURM job (deploy/slurm/), ``--gpus all`` is the job's allocation, the node name is
    SLURM's node plus the job and step ids, and no batch is taken in the job's last
    ``--drain-before-end-s`` (worker/process/slurm.py).
    """
    import time

    from worker.engine.args import parse_engine_args
    from worker.engine.mtp import mtp_engine_arg_pairs
    from worker.process import slurm
    from worker.process.launcher import parse_gpus, plan_processes, run_launcher

    engine_args = (*engine_args, *mtp_engine_arg_pairs(mtp))  # worker/engine/mtp.py: lossless drafting
    parse_engine_args(list(engine_args))  # refuse a malformed pair here, before any process starts

    node = slurm.plan_node(gpus, node_name, drain_before_end_s, job=slurm.from_env(), now=time.time(),
                           parse_gpus=parse_gpus)
    deadline_args = ["--stop-taking-at", f"{node.stop_taking_at:.3f}"] if node.stop_taking_at is not None else []
    plans = plan_processes(node.gpus, tp=tp, host=node.node_name, queues=queues, metrics_port=metrics_port, concurrency=concurrency, model=model,
                           engine_args=list(engine_args),
                           extra_args=["--lease-s", str(lease_s), "--max-attempts", str(max_attempts),
                                       "--heartbeat-s", str(heartbeat_s), "--reconcile-s", str(reconcile_s),
                                       "--requeue-grace-s", str(requeue_grace_s),
                                       *(["--fake-engine", fake_engine] if fake_engine else []), *deadline_args])
    if dry_run:
        if node.context:
            click.echo(node.context)
        for p in plans:
            click.echo(f"{p.name}  CUDA_VISIBLE_DEVICES={p.env.get('CUDA_VISIBLE_DEVICES', '')!r}  "
                       + " ".join(p.argv[1:]))
        return
    wait_for_services(_settings(None), services_wait_s, lambda line: click.echo(line, err=True),
                      check_ledger=_require_ledger_schema)
    sys.exit(run_launcher(plans, context=node.context))


def _require_ledger_schema() -> None:
    """A worker of another migration than its ledger's is refused at start (ledger/migrate.py).

    wait_for_services has waited for the ledger; one lost again since is not refused: the
    workers wait for it, and check nothing more then.
    """
    from sqlalchemy.exc import OperationalError

    from ledger import migrate

    try:
        migrate.require_head(_settings(None))
    except OperationalError as e:
        log.warning("could not check the ledger's migration (%s); starting anyway", str(e).splitlines()[0])
