"""ObjectStore against a real moto S3 server over HTTP, with faults injected by a proxy."""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Iterator

import boto3
import pytest

from ledger.errors import ChecksumMismatch, StoreError, UnsafeKey
from ledger.objects import ObjectStore, join_key
from ledger.shards import decode_shard, encode_shard, output_shard_url, sha256_hex
from local.s3 import start_local_s3
from tests.support.s3_fault_proxy import FaultProxy

#: Fast backoff so retry tests take milliseconds, not the production seconds.
FAST = {"base_delay_s": 0.01, "max_delay_s": 0.05}


@pytest.fixture
def store(s3_env: dict[str, str]) -> ObjectStore:
    return ObjectStore(max_attempts=4, **FAST)


@pytest.fixture
def raw(s3_env: dict[str, str]):
    """A plain boto3 client for setting up what ObjectStore would refuse to write."""
    return boto3.session.Session().client("s3")


@pytest.fixture
def proxied_store(s3_bucket, s3_fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    # Depends on s3_bucket so the bucket is created straight on moto, before the proxy sees anything.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_fault_proxy.endpoint_url)
    return ObjectStore(max_attempts=4, read_timeout_s=1.0, connect_timeout_s=1.0, **FAST)


def count_sends(store: ObjectStore, operation: str) -> list[int]:
    """Count HTTP requests botocore sends for ``operation`` (a list so the hook can mutate it)."""
    sent = [0]

    def hook(**_: object) -> None:
        sent[0] += 1

    store.client.meta.events.register(f"before-send.s3.{operation}", hook)
    return sent


# -- conditional writes -----------------------------------------------------------------------------


def test_put_if_absent_creates_once_then_reports_the_existing_digest(store, s3_bucket):
    url = join_key(s3_bucket, "outputs/batch-000001.jsonl.zst")
    first = store.put_if_absent(url, b"first")
    second = store.put_if_absent(url, b"first")
    third = store.put_if_absent(url, b"other bytes")

    assert (first.created, first.sha256, first.size, first.matches) == (True, sha256_hex(b"first"), 5, True)
    assert (second.created, second.sha256, second.matches) == (False, sha256_hex(b"first"), True)
    assert (third.created, third.sha256, third.matches) == (False, sha256_hex(b"first"), False)
    assert store.get(url) == b"first"


def test_only_one_of_many_racing_writers_creates_the_object(store, s3_bucket):
    url = join_key(s3_bucket, "race/key")
    writers = 8
    barrier = threading.Barrier(writers)
    results = [None] * writers

    def write(i: int) -> None:
        barrier.wait()
        results[i] = store.put_if_absent(url, f"writer {i}".encode())

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    winners = [i for i, r in enumerate(results) if r.created]
    assert len(winners) == 1
    stored = store.get(url)
    assert stored == f"writer {winners[0]}".encode()
    assert all(r.sha256 == sha256_hex(stored) for r in results)


def test_put_overwrites_and_reports_the_new_digest(store, s3_bucket):
    url = join_key(s3_bucket, "inputs/batch-000000.jsonl.zst")
    store.put(url, b"v1")
    result = store.put(url, b"version 2")
    assert (result.created, result.sha256, result.size) == (True, sha256_hex(b"version 2"), 9)
    assert store.get(url) == b"version 2"


def test_a_shard_survives_the_trip_through_s3(store, s3_bucket):
    rows = [{"sample_id": str(i), "completion": "réponse ✓ " * 20, "token_ids": list(range(300))}
            for i in range(64)]
    url = output_shard_url(s3_bucket + "/runs/r1", 3)
    result = store.put_if_absent(url, encode_shard(rows))
    info = store.head(url)
    assert info is not None and info.sha256 == result.sha256 and info.size == result.size
    assert list(decode_shard(store.get(url))) == rows


def test_a_range_is_read_alone_and_checked_against_its_own_digest(store, s3_bucket):
    url = join_key(s3_bucket, "inputs/group-000001.jsonl.zst")
    store.put(url, b"first|second|third")
    assert store.get_range(url, 6, 6, sha256=sha256_hex(b"second")) == b"second"
    with pytest.raises(ChecksumMismatch, match="read sha256="):
        store.get_range(url, 6, 6, sha256=sha256_hex(b"SECOND"))
    with pytest.raises(ChecksumMismatch, match="expected 10"):
        store.get_range(url, 13, 10, sha256=sha256_hex(b"third"))   # past the end: fewer bytes


# -- verification ---------------------------------------------------------------------------------


def test_get_refuses_bytes_that_do_not_match_the_stored_checksum(store, raw, s3_bucket):
    # moto stores a client-supplied ChecksumSHA256 without checking it against the body
    # (real S3 would answer BadDigest), which lets us plant a corrupt object.
    bucket = s3_bucket.removeprefix("s3://")
    raw.put_object(Bucket=bucket, Key="bad", Body=b"payload",
                   ChecksumAlgorithm="SHA256", ChecksumSHA256=base64.b64encode(b"\0" * 32).decode())
    with pytest.raises(ChecksumMismatch):
        store.get(f"{s3_bucket}/bad")


def test_get_accepts_objects_stored_without_a_sha256(store, raw, s3_bucket):
    raw.put_object(Bucket=s3_bucket.removeprefix("s3://"), Key="plain", Body=b"no sha256 here")
    assert store.get(f"{s3_bucket}/plain") == b"no sha256 here"
    assert store.head(f"{s3_bucket}/plain").sha256 is None  # moto keeps the SDK's CRC32 instead


def test_put_fails_when_the_store_reports_another_checksum(proxied_store, s3_fault_proxy, s3_bucket):
    s3_fault_proxy.rewrite_header_next(1, "x-amz-checksum-sha256", base64.b64encode(b"\1" * 32).decode(),
                                       method="HEAD")
    with pytest.raises(ChecksumMismatch, match="stored size=4"):
        proxied_store.put(f"{s3_bucket}/k", b"data")


# -- missing things and permanent errors -------------------------------------------------------------


def test_head_and_exists_of_a_missing_key_say_none_and_false(store, s3_bucket):
    assert store.head(f"{s3_bucket}/nope") is None
    assert store.exists(f"{s3_bucket}/nope") is False


def test_get_of_a_missing_key_is_a_permanent_no_such_key(store, s3_bucket):
    sends = count_sends(store, "GetObject")
    with pytest.raises(StoreError) as caught:
        store.get(f"{s3_bucket}/nope")
    assert (caught.value.transient, caught.value.code, sends[0]) == (False, "NoSuchKey", 1)


def test_a_missing_bucket_fails_at_once_without_retrying_or_leaking_credentials(
        store, monkeypatch, caplog):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSHOULDNOTAPPEAR")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-should-not-appear")
    sends = count_sends(store, "PutObject")
    url = "s3://regen-no-such-bucket/outputs/x"
    with caplog.at_level(logging.DEBUG, logger="ledger"), pytest.raises(StoreError) as caught:
        store.put_if_absent(url, b"x")
    error = caught.value
    assert (error.transient, error.code, sends[0]) == (False, "NoSuchBucket", 1)
    assert "put_if_absent" in str(error) and url in str(error)
    for text in (str(error), repr(error.__cause__), caplog.text):
        assert "should-not-appear" not in text.lower() and "SHOULDNOTAPPEAR" not in text


# -- access control (a second moto server that enforces IAM) ------------------------------------------


@pytest.fixture(scope="module")
def iam_moto() -> Iterator[dict[str, str]]:
    """moto with IAM enforced after 3 setup calls: a bucket, a user without policies, its key."""
    server = start_local_s3({"INITIAL_NO_AUTH_ACTION_COUNT": "3"})
    try:
        admin = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                      region_name="us-east-1")
        admin.client("s3", endpoint_url=server.endpoint_url).create_bucket(Bucket="locked")
        iam = admin.client("iam", endpoint_url=server.endpoint_url)
        iam.create_user(UserName="nobody")
        key = iam.create_access_key(UserName="nobody")["AccessKey"]
        yield {"endpoint": server.endpoint_url, "key_id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    finally:
        server.stop()


@pytest.mark.parametrize("who, code", [("user", "AccessDenied"), ("stranger", "InvalidAccessKeyId")])
def test_access_problems_are_permanent_and_not_retried(iam_moto, s3_env, monkeypatch, who, code):
    key_id, secret = (iam_moto["key_id"], iam_moto["secret"]) if who == "user" else ("AKIDUNKNOWN", "nope")
    monkeypatch.setenv("AWS_ENDPOINT_URL", iam_moto["endpoint"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    store = ObjectStore(max_attempts=4, **FAST)
    sends = count_sends(store, "*")
    with pytest.raises(StoreError) as caught:
        store.put_if_absent("s3://locked/k", b"x")
    assert (caught.value.transient, caught.value.code, sends[0]) == (False, code, 1)
    assert secret not in str(caught.value)
    with pytest.raises(StoreError) as caught:
        store.head("s3://locked/k")  # HEAD has no body: the code is the bare status
    assert (caught.value.transient, caught.value.code) == (False, "403")


# -- transient errors through the fault proxy -----------------------------------------------------


def test_slow_down_and_internal_errors_are_retried_until_the_write_succeeds(
        proxied_store, s3_fault_proxy, s3_bucket, caplog):
    s3_fault_proxy.fail_next(1, status=503, code="SlowDown", method="PUT")
    s3_fault_proxy.fail_next(1, status=500, code="InternalError", method="PUT")
    with caplog.at_level(logging.WARNING, logger="ledger.objects"):
        result = proxied_store.put_if_absent(f"{s3_bucket}/k", b"data")
    assert result.created
    assert s3_fault_proxy.count("PUT") == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "SlowDown" in warnings[0] and "attempt 1/4" in warnings[0]
    assert "InternalError" in warnings[1] and "attempt 2/4" in warnings[1]


def test_a_503_on_head_is_retried(proxied_store, s3_fault_proxy, s3_bucket):
    s3_fault_proxy.fail_next(2, status=503, method="HEAD")
    assert proxied_store.exists(f"{s3_bucket}/nope") is False
    assert s3_fault_proxy.count("HEAD") == 3


def test_a_read_timeout_is_retried(proxied_store, s3_fault_proxy, s3_bucket):
    proxied_store.put(f"{s3_bucket}/k", b"data")
    s3_fault_proxy.delay_next(1, seconds=1.5, method="GET")
    assert proxied_store.get(f"{s3_bucket}/k") == b"data"
    assert s3_fault_proxy.count("GET") == 2


def test_a_dropped_connection_is_retried(proxied_store, s3_fault_proxy, s3_bucket):
    proxied_store.put(f"{s3_bucket}/k", b"data")
    s3_fault_proxy.drop_next(1, method="GET")
    assert proxied_store.get(f"{s3_bucket}/k") == b"data"
    assert s3_fault_proxy.count("GET", outcome="drop") == 1


def test_a_conditional_write_whose_answer_was_lost_reads_as_existing_with_our_digest(
        proxied_store, s3_fault_proxy, s3_bucket):
    # The PUT reaches S3 and lands, but its answer comes after the read timeout: the retry
    # then meets 412. The caller must be able to tell this from a twin's different output.
    s3_fault_proxy.delay_next(1, seconds=1.5, when="after", method="PUT")
    result = proxied_store.put_if_absent(f"{s3_bucket}/k", b"data")
    assert (result.created, result.matches, result.sha256) == (False, True, sha256_hex(b"data"))
    assert s3_fault_proxy.count("PUT") == 2


def test_exhausted_retries_raise_a_transient_store_error(proxied_store, s3_fault_proxy, s3_bucket):
    s3_fault_proxy.fail_next(100, status=503, code="SlowDown", method="GET")
    with pytest.raises(StoreError) as caught:
        proxied_store.get(f"{s3_bucket}/k")
    assert (caught.value.transient, caught.value.code) == (True, "SlowDown")
    assert "after 4 attempts" in str(caught.value)
    assert s3_fault_proxy.count("GET") == 4


# -- listing and deleting ------------------------------------------------------------------------------


def test_list_pages_through_a_folder_and_delete_prefix_removes_only_it(store, s3_bucket):
    inside = [join_key(s3_bucket, f"run1/outputs/batch-{i:06d}.jsonl.zst") for i in range(7)]
    neighbour = join_key(s3_bucket, "run10/run.json")  # shares the string prefix "run1"
    for url in [*inside, neighbour]:
        store.put(url, b"x")

    assert sorted(store.list(f"{s3_bucket}/run1", page_size=3)) == inside
    assert store.delete_prefix(f"{s3_bucket}/run1/") == 7
    assert list(store.list(f"{s3_bucket}/run1")) == []
    assert store.exists(neighbour)


def test_delete_prefix_refuses_a_whole_bucket(store, s3_bucket):
    with pytest.raises(UnsafeKey):
        store.delete_prefix(s3_bucket + "/")


# -- the client -----------------------------------------------------------------------------------------


def test_the_client_is_created_lazily_and_once_across_threads(s3_env, monkeypatch):
    store = ObjectStore()
    assert store._client is None  # nothing happens at construction
    made = []
    real = store._make_client

    def slow_make():
        made.append(1)
        threading.Event().wait(0.05)  # widen the window a racing thread would slip through
        return real()

    monkeypatch.setattr(store, "_make_client", slow_make)
    barrier = threading.Barrier(16)
    clients = []

    def grab() -> None:
        barrier.wait()
        clients.append(store.client)

    threads = [threading.Thread(target=grab) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(made) == 1 and len({id(c) for c in clients}) == 1
