"""``regen metrics``: what one scrape reports from a real ledger and a real Redis, over HTTP too."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import redis as redis_lib
import yaml
from sqlalchemy import text

from ledger.settings import Settings
from producer.monitoring.metrics import PRIORITY_SEP, RegenCollector, collect, start_exporter
from tests.integration.test_views import RUN, build_ledger
from tests.support.helpers import ROOT, wait_for

OPERATIONS_DOC = ROOT / "docs" / "operations.md"


def values(families) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape as {(name, labels): value}."""
    return {(s.name, frozenset(s.labels.items())): s.value for family in families for s in family.samples}


def value(scrape: dict, name: str, **labels: str) -> float:
    return scrape[(name, frozenset(labels.items()))]


@pytest.fixture
def farm(settings, sessions):
    """The finished run and the live run of test_views, and some messages on the broker."""
    build_ledger(sessions)
    client = redis_lib.Redis.from_url(settings.redis_url)
    client.rpush("regen", "m1", "m2", "m3")
    client.rpush(f"regen{PRIORITY_SEP}3", "m4")          # a message with priority 3 waits in its own list
    client.rpush("other", "m5", "m6")
    client.hset("unacked", mapping={"tag1": "x", "tag2": "y"})
    yield sessions
    client.close()


def test_a_scrape_reports_broker_and_ledger_figures(settings, farm):
    scrape = values(collect(settings, queues=["other"]))
    assert value(scrape, "regen_ledger_up") == 1 and value(scrape, "regen_broker_up") == 1
    assert value(scrape, "regen_queue_messages", queue="regen") == 4
    assert value(scrape, "regen_queue_messages", queue="other") == 2
    assert value(scrape, "regen_unacked_messages") == 2

    assert value(scrape, "regen_run_info", run=RUN, model="m", queue="regen", status="finished") == 1
    assert value(scrape, "regen_batches", run=RUN, status="done") == 3
    assert value(scrape, "regen_batches", run=RUN, status="dead") == 1
    assert value(scrape, "regen_batches", run=RUN, status="running") == 0      # zeros are reported, not absent
    assert value(scrape, "regen_samples", run=RUN, status="done") == 6
    assert value(scrape, "regen_samples", run=RUN, status="failed") == 2
    assert value(scrape, "regen_samples", run=RUN, status="pending") == 2
    assert value(scrape, "regen_samples_quality", run=RUN, quality="stub_answer") == 1
    assert value(scrape, "regen_completion_tokens_total", run=RUN) == 42000
    assert value(scrape, "regen_prompt_tokens_total", run=RUN) == 800
    assert value(scrape, "regen_samples_done_total", run=RUN) == 6
    assert value(scrape, "regen_batches_done_total", run=RUN) == 3
    assert value(scrape, "regen_batch_failures_total", run=RUN) == 4          # 1 on seq 3, 3 on the dead seq 4
    assert value(scrape, "regen_rejected_rows", run=RUN, reason="malformed_json") == 2
    assert value(scrape, "regen_rejected_rows", run=RUN, reason="duplicate_id") == 1
    assert value(scrape, "regen_last_commit_timestamp_seconds", run=RUN) == 1767265200  # 2026-01-01 11:00 UTC

    assert value(scrape, "regen_running_batches", run="live", worker="gpu4@n2") == 1
    assert 25 <= value(scrape, "regen_worker_heartbeat_age_seconds", worker="gpu4@n2") <= 120
    assert value(scrape, "regen_samples_done_total", run="live") == 1


def test_a_commit_between_scrapes_is_seen_by_the_same_exporter(settings, farm):
    collector = RegenCollector(settings)
    try:
        before = values(collector.collect())
        assert value(before, "regen_samples", run="live", status="pending") == 2
        # The live run's running batch commits: both its samples done, 700 tokens.
        with farm.begin() as s:
            s.execute(text("UPDATE batches SET status = 'done', finished_at = now(), completion_tokens = 700 "
                           "WHERE status = 'running'"))
            s.execute(text("UPDATE samples SET status = 'done', completion_tokens = 350, quality = 'ok' "
                           "WHERE status = 'pending' AND sample_id LIKE 'l%'"))
        after = values(collector.collect())
    finally:
        collector.close()
    assert value(after, "regen_samples", run="live", status="pending") == 0
    assert value(after, "regen_samples_done_total", run="live") == 3
    assert value(after, "regen_samples_quality", run="live", quality="ok") == 2
    assert value(after, "regen_completion_tokens_total", run="live") == 1300
    assert not any(name == "regen_running_batches" for name, _ in after)
    # The finished run is unchanged.
    assert value(after, "regen_samples", run=RUN, status="done") == 6


def test_a_broker_outage_still_reports_the_ledger(settings, farm):
    broken = Settings(database_url=settings.database_url, redis_url=f"redis://127.0.0.1:{_free_port()}/0")
    scrape = values(collect(broken))
    assert value(scrape, "regen_broker_up") == 0 and value(scrape, "regen_ledger_up") == 1
    assert not any(name == "regen_queue_messages" for name, _ in scrape)
    assert value(scrape, "regen_samples", run=RUN, status="done") == 6


def test_a_ledger_outage_still_reports_the_broker(settings, farm):
    broken = Settings(database_url=f"postgresql://127.0.0.1:{_free_port()}/nothing", redis_url=settings.redis_url)
    scrape = values(collect(broken))
    assert value(scrape, "regen_ledger_up") == 0 and value(scrape, "regen_broker_up") == 1
    assert value(scrape, "regen_queue_messages", queue="regen") == 4
    assert not any(name.startswith("regen_samples") for name, _ in scrape)


def test_the_http_endpoint_serves_the_scrape(settings, farm):
    server, collector = start_exporter(settings, port=0, addr="127.0.0.1")
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            body = response.read().decode()
            assert response.headers["Content-Type"].startswith("text/plain")
    finally:
        server.shutdown()
        collector.close()
    assert f'regen_samples{{run="{RUN}",status="done"}} 6.0' in body
    assert "# TYPE regen_completion_tokens_total counter" in body
    assert 'regen_queue_messages{queue="regen"} 4.0' in body


def test_regen_metrics_process_serves_and_stops_on_sigterm(settings, farm):
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    code = ("import sys; from ledger.settings import Settings; from producer.monitoring.metrics import serve; "
            f"sys.exit(serve(Settings.from_env(), port={port}, addr='127.0.0.1'))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        body = wait_for(lambda: _get(f"http://127.0.0.1:{port}/metrics"), timeout_s=60, what="the exporter",
                        interval_s=0.2)
        assert f'regen_samples_done_total{{run="{RUN}"}} 6.0' in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_alert_rules_in_the_docs_parse_and_use_only_exported_metrics(settings, farm):
    blocks = re.findall(r"```yaml\n(.*?)```", OPERATIONS_DOC.read_text(), flags=re.S)
    rules = [rule for block in blocks for group in (yaml.safe_load(block) or {}).get("groups", [])
             for rule in group["rules"]]
    assert len(rules) >= 6
    exported = {name for name, _ in values(collect(settings))}
    for rule in rules:
        assert rule["alert"] and rule["expr"] and rule["annotations"]["summary"], rule
        used = set(re.findall(r"\bregen_[a-z_]+\b", rule["expr"]))
        assert used, f"alert {rule['alert']} uses no regen metric"
        assert used <= exported, f"alert {rule['alert']} uses metrics the exporter lacks: {used - exported}"


def test_the_metrics_table_in_the_docs_lists_exactly_what_is_exported(settings, farm):
    doc = OPERATIONS_DOC.read_text()
    section = doc[doc.index("## Metrics and alerts"):doc.index("### Engine figures")]  # the exporter's, not the workers'
    table = [line for line in section.splitlines() if line.startswith("| `regen_")]
    documented = set(re.findall(r"`(regen_[a-z_]+)`", "\n".join(table)))
    exported = {name for name, _ in values(collect(settings))}
    assert documented == exported


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()
    except OSError:
        time.sleep(0.1)
        return None
