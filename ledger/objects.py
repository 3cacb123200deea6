"""The object store: verified, idempotent reads and writes of whole objects in S3.

Objects are addressed by full URLs (``s3://bucket/key``), the form the ledger
stores. boto3 is configured only by its own environment (``AWS_ENDPOINT_URL``,
credentials, region, ``AWS_CONFIG_FILE``): nothing here reads or logs a secret.

Retries are ours, not botocore's, so the policy is visible and testable:
transient failures (5xx, throttling, timeouts, dropped connections) are retried
with exponential backoff and full jitter; permanent ones (access denied, missing
bucket, any other 4xx) raise at once, because retrying them only hides a broken
configuration for minutes.

Size limit: objects travel as ``bytes`` in memory with a single PUT. That suits
our shards (an output shard of 64 samples x 32K token ids is ~25 MB before
compression) and keeps ``IfNoneMatch`` usable (boto3's managed transfers drop
it). Objects over ``MAX_PUT_BYTES`` are refused; bigger ones would need a manual
multipart upload with ``complete_multipart_upload(IfNoneMatch="*")``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from ledger.errors import ChecksumMismatch, StoreError, UnsafeKey

# The addresses (URLs, keys, digests) live in object_keys.py; importers of this module keep reaching them here.
from ledger.object_keys import MAX_KEY_BYTES, join_key, parse_s3_url, sha256_hex  # noqa: F401

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Largest object ``put``/``put_if_absent`` accept, in bytes. Far above our
#: shards, far below S3's 5 GiB single-PUT limit; past this, use multipart.
MAX_PUT_BYTES = 1 << 30
#: Keys per DeleteObjects call: the S3 maximum.
_DELETE_BATCH = 1000

#: Error codes worth retrying even though some come with a 4xx status.
#: ConditionalRequestConflict (409) means another conditional write to the key is
#: in flight; AWS says retry, and the retry then sees 412 or wins. BadDigest and
#: XAmzContentSHA256Mismatch mean the body was damaged in transit: our bytes in
#: memory are still right, so sending them again can succeed.
_TRANSIENT_CODES = frozenset({
    "SlowDown", "RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "TooManyRequestsException",
    "PriorRequestNotComplete", "ConditionalRequestConflict", "BadDigest",
    "XAmzContentSHA256Mismatch", "IncompleteBody",
})
#: Network-level failures: can't connect, connect/read timeout, connection closed
#: mid-response, body cut short. BotoConnectionError covers EndpointConnectionError
#: and ConnectTimeoutError; HTTPClientError covers ConnectionClosedError,
#: ReadTimeoutError and ResponseStreamingError.
_TRANSIENT_EXCEPTIONS = (BotoConnectionError, HTTPClientError, IncompleteReadError)


@dataclass(frozen=True)
class ObjectInfo:
    """What a HEAD says about an object. ``sha256`` is hex, or None when the store keeps no
    full-object SHA-256 for it (written without one, or a multipart composite checksum)."""

    url: str
    size: int
    sha256: str | None
    etag: str


@dataclass(frozen=True)
class PutResult:
    """The outcome of a write.

    ``created`` is False when ``put_if_absent`` found the key taken; then ``sha256``
    and ``size`` describe the object already there and ``matches`` says whether it
    holds the very bytes we tried to write. ``created=False, matches=True`` is also
    what our own earlier attempt looks like when its response was lost.
    """

    url: str
    created: bool
    sha256: str | None
    size: int
    matches: bool


class ObjectStore:
    """S3 access with our retry policy and end-to-end SHA-256 verification.

    Safe to share between threads: the boto3 client is created once, lazily, under
    a lock (boto3 clients are thread-safe; sessions are not).

    Args:
        max_attempts: tries per S3 call on transient errors before giving up.
        client: an S3 client to use instead of one built from the environment.
        base_delay_s: backoff before the 2nd attempt; doubles each attempt (full jitter).
        max_delay_s: cap on one backoff sleep.
        connect_timeout_s: TCP connect timeout.
        read_timeout_s: longest wait for response bytes; a stalled node is a transient failure.
    """

    def __init__(
        self,
        max_attempts: int = 8,
        *,
        client: Any = None,
        base_delay_s: float = 0.5,
        max_delay_s: float = 20.0,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
    ):
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._client = client
        self._injected = client is not None
        self._client_pid = os.getpid()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any) -> ObjectStore:
        return cls(max_attempts=settings.s3_max_attempts)

    @property
    def client(self) -> Any:
        # A client built before a fork (Celery prefork) would share pooled sockets
        # with the parent, so a child builds its own.
        if self._client is None or (not self._injected and self._client_pid != os.getpid()):
            with self._lock:
                if self._client is None or (not self._injected and self._client_pid != os.getpid()):
                    self._client = self._make_client()
                    self._client_pid = os.getpid()
        return self._client

    def _make_client(self) -> Any:
        config = Config(
            # One botocore attempt per call: the retry policy is _call's.
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            # Upload threads share the client; botocore's default pool of 10 would queue them.
            max_pool_connections=32,
        )
        return boto3.session.Session().client("s3", config=config)

    # -- writes ---------------------------------------------------------------------------------

    def put_if_absent(self, url: str, data: bytes) -> PutResult:
        """Write ``data`` only if ``url`` does not exist yet (``IfNoneMatch="*"``), then verify.

        Returns:
            ``created=True`` after a verified write; ``created=False`` with the existing
            object's digest when the key was already taken (an idempotent twin, or our
            own attempt whose response was lost).
        Raises:
            StoreError: permanent failure, or transient failures past ``max_attempts``.
            ChecksumMismatch: the stored object does not hold our bytes.
        """
        bucket, key = parse_s3_url(url)
        digest = self._check_size_and_digest(url, data)

        def attempt() -> bool:
            try:
                self.client.put_object(
                    Bucket=bucket, Key=key, Body=data, IfNoneMatch="*",
                    ChecksumAlgorithm="SHA256", ChecksumSHA256=_b64(digest),
                )
            except ClientError as e:
                if _status(e) == 412 or _code(e) == "PreconditionFailed":
                    return False
                raise
            return True

        if self._call("put_if_absent", url, attempt):
            self._verify(url, digest, len(data))
            return PutResult(url=url, created=True, sha256=digest.hex(), size=len(data), matches=True)
        existing = self.head(url)
        if existing is None:
            # Taken a moment ago, gone now: someone deleted it. Let the caller retry the batch.
            raise StoreError(f"s3 put_if_absent {url}: key reported as existing but HEAD finds nothing",
                             transient=True, code="PreconditionFailed")
        return PutResult(url=url, created=False, sha256=existing.sha256, size=existing.size,
                         matches=existing.sha256 == digest.hex() and existing.size == len(data))

    def put(self, url: str, data: bytes) -> PutResult:
        """Write ``data`` to ``url`` unconditionally (overwriting), then verify it.

        For producer input shards, which are rewritten freely until the ledger
        references them. Raises like ``put_if_absent``.
        """
        bucket, key = parse_s3_url(url)
        digest = self._check_size_and_digest(url, data)
        self._call("put", url, lambda: self.client.put_object(
            Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256", ChecksumSHA256=_b64(digest),
        ))
        self._verify(url, digest, len(data))
        return PutResult(url=url, created=True, sha256=digest.hex(), size=len(data), matches=True)

    def _check_size_and_digest(self, url: str, data: bytes) -> bytes:
        if len(data) > MAX_PUT_BYTES:
            raise StoreError(f"s3 put {url}: {len(data)} bytes exceed MAX_PUT_BYTES={MAX_PUT_BYTES}",
                             transient=False, code="EntityTooLarge")
        return hashlib.sha256(data).digest()

    def _verify(self, url: str, digest: bytes, size: int) -> None:
        # The PUT's own response could come from a confused proxy or a store that
        # ignores checksum headers; a fresh HEAD asks what is actually stored.
        info = self.head(url)
        if info is None:
            raise StoreError(f"s3 verify {url}: object missing right after a successful PUT",
                             transient=False, code="NoSuchKey")
        if info.size != size or info.sha256 != digest.hex():
            raise ChecksumMismatch(f"s3 verify {url}: stored size={info.size} sha256={info.sha256}, "
                                   f"wrote size={size} sha256={digest.hex()}")

    # -- reads ----------------------------------------------------------------------------------

    def get(self, url: str) -> bytes:
        """Read a whole object, checking its stored SHA-256 when it has one.

        Raises:
            StoreError: ``code="NoSuchKey"`` (permanent) when missing, other failures as classified.
            ChecksumMismatch: the bytes read do not match the stored checksum.
        """
        bucket, key = parse_s3_url(url)

        def attempt() -> tuple[dict[str, Any], bytes]:
            response = self.client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
            # Read inside the attempt: a connection cut mid-body is retried like any other.
            return response, response["Body"].read()

        # botocore already raises (and we retry) when the body is shorter than Content-Length.
        response, body = self._call("get", url, attempt)
        expected = _sha256_from_response(response)
        actual = hashlib.sha256(body).hexdigest()
        if expected is not None and expected != actual:
            raise ChecksumMismatch(f"s3 get {url}: stored sha256={expected}, read sha256={actual}")
        return body

    def get_range(self, url: str, offset: int, length: int, *, sha256: str) -> bytes:
        """Read ``length`` bytes at ``offset`` of an object and check them against ``sha256`` (hex).

        For one batch's shard in a packed input object (ledger/shards.py): the store's
        checksum covers the whole object, not a range, so the caller's digest (the
        ledger's) is what proves these bytes.

        Raises:
            StoreError: as ``get``; ``code="InvalidRange"`` (permanent) past the object's end.
            ChecksumMismatch: fewer bytes than asked for, or bytes whose SHA-256 differs.
        """
        if offset < 0 or length <= 0:
            raise ValueError(f"s3 get_range {url}: bad range offset={offset} length={length}")
        bucket, key = parse_s3_url(url)

        def attempt() -> bytes:
            response = self.client.get_object(Bucket=bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}")
            return response["Body"].read()

        body = self._call("get_range", url, attempt)
        if len(body) != length:
            raise ChecksumMismatch(f"s3 get_range {url}: {len(body)} bytes at {offset}, expected {length}")
        actual = hashlib.sha256(body).hexdigest()
        if actual != sha256:
            raise ChecksumMismatch(f"s3 get_range {url} [{offset}, +{length}): stored sha256={sha256}, "
                                   f"read sha256={actual}")
        return body

    def head(self, url: str) -> ObjectInfo | None:
        """Describe the object at ``url``, or None if there is none.

        S3 answers HEAD with a bare 404 for a missing key *and* a missing bucket, so
        a missing bucket also reads as None here; writes and gets report it properly.
        """
        bucket, key = parse_s3_url(url)

        def attempt() -> ObjectInfo | None:
            try:
                response = self.client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
            except ClientError as e:
                if _status(e) == 404:
                    return None
                raise
            return ObjectInfo(url=url, size=response["ContentLength"],
                              sha256=_sha256_from_response(response), etag=response.get("ETag", ""))

        return self._call("head", url, attempt)

    def exists(self, url: str) -> bool:
        return self.head(url) is not None

    def delete(self, url: str) -> None:
        """Delete the one object ``url`` (one that is absent is no error: S3's DeleteObject is idempotent).

        Not :meth:`delete_prefix`, which takes its argument as a folder (``url + "/"``) and so
        would leave the object itself.
        """
        bucket, key = parse_s3_url(url)
        if not key or key.endswith("/"):
            raise UnsafeKey(f"not an object's key: {url!r}")
        self._call("delete", url, lambda: self.client.delete_object(Bucket=bucket, Key=key))

    def delete_prefix(self, prefix_url: str) -> int:
        """Delete every object under the folder ``prefix_url``; return how many.

        Raises:
            UnsafeKey: the prefix is a bucket root (deleting a whole bucket is never what a run means).
        """
        bucket, key = parse_s3_url(prefix_url)
        if not key.strip("/"):
            raise UnsafeKey(f"refusing to delete a whole bucket: {prefix_url!r}")
        deleted = 0
        batch: list[str] = []
        for url in self.list(prefix_url):
            batch.append(parse_s3_url(url)[1])
            if len(batch) == _DELETE_BATCH:
                deleted += self._delete_keys(prefix_url, bucket, batch)
                batch = []
        if batch:
            deleted += self._delete_keys(prefix_url, bucket, batch)
        return deleted

    def _delete_keys(self, prefix_url: str, bucket: str, keys: Sequence[str]) -> int:
        request = {"Objects": [{"Key": k} for k in keys], "Quiet": True}
        response = self._call("delete_prefix", prefix_url,
                              lambda: self.client.delete_objects(Bucket=bucket, Delete=request))
        errors = response.get("Errors", [])
        if errors:
            first = errors[0]
            raise StoreError(f"s3 delete_prefix {prefix_url}: {len(errors)} keys not deleted, first "
                             f"{first.get('Key')!r}: {first.get('Code')}", transient=False,
                             code=first.get("Code", ""))
        return len(keys)

    def list(self, prefix_url: str, *, page_size: int = 1000) -> Iterator[str]:
        """Yield the URL of every object under the folder ``prefix_url``, page by page.

        The prefix is taken as a folder: ``s3://b/run1`` lists ``run1/...`` but not
        ``run10/...``. A bucket root lists the whole bucket.
        """
        bucket, key = parse_s3_url(prefix_url)
        prefix = key if not key or key.endswith("/") else key + "/"
        request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
        while True:
            # Each page is its own retried call, so a long listing survives a blip.
            page = self._call("list", prefix_url, functools.partial(self.client.list_objects_v2, **request))
            for obj in page.get("Contents", []):
                yield f"s3://{bucket}/{obj['Key']}"
            if not page.get("IsTruncated"):
                return
            request["ContinuationToken"] = page["NextContinuationToken"]

    # -- the retry policy -----------------------------------------------------------------------

    def _call(self, operation: str, url: str, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` until it succeeds, a permanent error occurs, or attempts run out."""
        for number in range(1, self.max_attempts + 1):
            try:
                return attempt()
            except ClientError as e:
                code, status = _code(e), _status(e)
                if not _is_transient(code, status):
                    message = e.response.get("Error", {}).get("Message", "")[:200]
                    raise StoreError(f"s3 {operation} {url} failed: {code} (HTTP {status}) {message}".rstrip(),
                                     transient=False, code=code) from e
                failure: Exception = e
                reason = f"{code} (HTTP {status})"
            except FlexibleChecksumError as e:
                # botocore's streaming check of a GET body against the stored checksum.
                raise ChecksumMismatch(f"s3 {operation} {url}: {e}") from e
            except _TRANSIENT_EXCEPTIONS as e:
                failure, code, reason = e, type(e).__name__, type(e).__name__
            except BotoCoreError as e:
                # No credentials, invalid parameters, unknown endpoint scheme: retrying can't help.
                raise StoreError(f"s3 {operation} {url} failed: {type(e).__name__}: {e}",
                                 transient=False, code=type(e).__name__) from e
            if number == self.max_attempts:
                raise StoreError(f"s3 {operation} {url} failed after {number} attempts: {reason}",
                                 transient=True, code=code) from failure
            delay_s = random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** (number - 1)))
            log.warning("s3 %s %s: %s on attempt %d/%d, retrying in %.2fs",
                        operation, url, reason, number, self.max_attempts, delay_s)
            time.sleep(delay_s)
        raise AssertionError("unreachable")  # the loop returns or raises


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _is_transient(code: str, status: int) -> bool:
    return status >= 500 or status == 429 or code in _TRANSIENT_CODES or code.startswith("Throttl")


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _sha256_from_response(response: dict[str, Any]) -> str | None:
    """The full-object SHA-256 (hex) a HEAD/GET reported, or None if it has none.

    Multipart uploads report a composite "<b64>-<parts>" value, which is not a
    digest of the object's bytes and so cannot be compared.
    """
    value = response.get("ChecksumSHA256")
    if not value or "-" in value or response.get("ChecksumType") == "COMPOSITE":
        return None
    return base64.b64decode(value).hex()
