"""One root exception type, and the split that matters to a long-running farm.

A *per-sample* problem (a bad row, a prompt longer than the context) is data: it
is recorded with its reason and the rest goes on. An *infrastructure* problem
(S3 down, Postgres restarting) is retried and, if it persists, fails the batch
loudly. Permanent configuration problems (access denied, missing bucket) must
never be retried in a loop.
"""


class RegenError(Exception):
    """Root of every error regen raises on purpose."""


class ConfigError(RegenError):
    """The user's configuration or command line cannot work (wrong URL, refused run config)."""


class RunNotFound(ConfigError):
    """No run has this name (the one place "no run named" is written)."""

    def __init__(self, name: str):
        super().__init__(f"no run named {name!r}")
        self.name = name


class InputRowError(RegenError):
    """One input row cannot become a sample. ``reason`` is a short stable code, ``detail`` says why."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class StoreError(RegenError):
    """An object-store operation failed. ``transient`` says whether retrying can help."""

    def __init__(self, message: str, *, transient: bool, code: str = ""):
        super().__init__(message)
        self.transient = transient
        self.code = code


class ObjectExists(StoreError):
    """A conditional write found the key already written (HTTP 412)."""

    def __init__(self, key: str):
        super().__init__(f"object already exists: {key}", transient=False, code="PreconditionFailed")
        self.key = key


class UnsafeKey(RegenError):
    """A key built from user data would escape its prefix."""


class ChecksumMismatch(StoreError):
    """The store holds (or reported) bytes whose SHA-256 differs from what was written or expected.

    Never transient: a stored object that fails verification stays wrong however often it is
    read, and an operator has to look at it.
    """

    def __init__(self, message: str):
        super().__init__(message, transient=False, code="ChecksumMismatch")


class ShardError(RegenError):
    """A shard cannot be encoded or decoded (corrupt or truncated zstd frame, a line that is not a JSON object)."""
