"""Object addresses: ``s3://bucket/key`` URLs, keys built from dataset values, and the digest every object carries.

Kept apart from the store (objects.py) because both sides build and check keys
without talking to S3: submit names the run's shards, export names its files.
"""

from __future__ import annotations

import hashlib
import unicodedata

from ledger.errors import ConfigError, UnsafeKey

#: S3 refuses keys longer than 1024 bytes of UTF-8.
MAX_KEY_BYTES = 1024


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data``: the digest the ledger, manifests and ``PutResult`` carry."""
    return hashlib.sha256(data).hexdigest()


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)``; the key may be empty.

    Raises:
        ConfigError: the URL is not an ``s3://`` URL with a plausible bucket name.
    """
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ConfigError(f"expected an s3://bucket/key URL, got {url!r}")
    bucket, _, key = url[len("s3://"):].partition("/")
    # Bucket rules (3-63 chars of a-z 0-9 . -) checked loosely: enough to catch
    # "s3:///key", upper case and stray spaces before boto3 gives a vaguer error.
    if not (3 <= len(bucket) <= 63) or not all(c.islower() or c.isdigit() or c in ".-" for c in bucket):
        raise ConfigError(f"{url!r} does not name a valid S3 bucket")
    return bucket, key


def join_key(prefix_url: str, *parts: str) -> str:
    """Append ``parts`` (each may hold ``/``-separated segments) to an ``s3://`` prefix.

    Parts often come from dataset values, so every segment is checked: a key must
    never leave the run's prefix or mean different things to different tools.

    Raises:
        ConfigError: ``prefix_url`` is not an s3 URL.
        UnsafeKey: a segment is empty, ``.`` or ``..``, or holds a backslash or a
            control character, or the whole key exceeds S3's 1024 bytes.
    """
    bucket, prefix = parse_s3_url(prefix_url)
    segments = [prefix.rstrip("/")] if prefix.rstrip("/") else []
    for part in parts:
        if not isinstance(part, str) or not part:
            raise UnsafeKey(f"empty or non-string key part {part!r}")
        for segment in part.split("/"):
            _check_segment(part, segment)
            segments.append(segment)
    key = "/".join(segments)
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise UnsafeKey(f"key longer than {MAX_KEY_BYTES} bytes: {key[:80]!r}...")
    return f"s3://{bucket}/{key}"


def _check_segment(part: str, segment: str) -> None:
    if segment in ("", ".", ".."):
        # "" catches a leading "/", "a//b" and a trailing "/"; "." and ".." are
        # resolved away by some S3 tools and local mirrors, so they could escape.
        raise UnsafeKey(f"key part {part!r} has an empty, '.' or '..' segment")
    if "\\" in segment:
        raise UnsafeKey(f"key part {part!r} contains a backslash")
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in segment):
        raise UnsafeKey(f"key part {part!r} contains a control character or lone surrogate")
