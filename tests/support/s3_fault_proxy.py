"""A tiny HTTP proxy in front of the moto server that fails requests on demand.

moto's server mode has no fault injection, so tests point ``AWS_ENDPOINT_URL`` at
this proxy and tell it what to do to the next requests: answer 503 SlowDown or
500 InternalError, stall past the client's read timeout, drop the connection,
rewrite a response header, or hold a request until the test releases it. Everything
else is forwarded untouched (path-style requests, the client's Host header and
signature included).

    proxy.fail_next(2, status=503, code="SlowDown", method="PUT")
    proxy.delay_next(1, seconds=2.0, when="after")  # the write lands, the answer is late
    release = proxy.hold_next(1, method="PUT", path_contains="/outputs/")  # ... release.set()
"""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

#: Headers that describe one hop, not the message: never forwarded as they are.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
               "upgrade", "content-length", "server", "date"}


@dataclass
class Fault:
    """One rule: applies to the next ``count`` requests whose method matches (None = any)."""

    kind: str  # "fail" | "delay" | "drop" | "header" | "hold"
    count: int
    method: str | None = None
    path_contains: str | None = None
    status: int = 503
    code: str = "SlowDown"
    seconds: float = 0.0
    when: str = "before"  # delay: "before" forwarding, or "after" (the request took effect)
    header: str = ""
    value: str = ""
    release: threading.Event | None = None  # hold: forwarded once the test sets it


@dataclass
class Seen:
    """One request as the proxy saw it, and what it did (``forwarded`` or the fault kind)."""

    method: str
    path: str
    outcome: str
    at: float = field(default_factory=time.monotonic)


class FaultProxy:
    """Forward HTTP to ``upstream_url``, applying queued faults first. Use as a context manager."""

    def __init__(self, upstream_url: str, host: str = "127.0.0.1"):
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.seen: list[Seen] = []
        self._server = ThreadingHTTPServer((host, 0), _handler_for(self))
        self._server.daemon_threads = True  # a stalled handler must not keep pytest alive
        self.endpoint_url = f"http://{host}:{self._server.server_address[1]}"
        # A short poll interval: close() (every test's teardown) waits up to one interval.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="s3-fault-proxy", daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # wakes handlers sleeping in a delay
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what tests call --------------------------------------------------------------------------

    def fail_next(self, n: int, *, status: int = 503, code: str = "SlowDown", method: str | None = None) -> None:
        """Answer the next ``n`` matching requests with an S3 error document, without forwarding."""
        self._add(Fault("fail", n, method, status=status, code=code))

    def delay_next(self, n: int, *, seconds: float, when: str = "before", method: str | None = None) -> None:
        """Stall the next ``n`` matching requests ``seconds`` before (or after) forwarding them."""
        if when not in ("before", "after"):
            raise ValueError("when must be 'before' or 'after'")
        self._add(Fault("delay", n, method, seconds=seconds, when=when))

    def drop_next(self, n: int, *, method: str | None = None) -> None:
        """Close the connection of the next ``n`` matching requests without answering."""
        self._add(Fault("drop", n, method))

    def rewrite_header_next(self, n: int, header: str, value: str, *, method: str | None = None) -> None:
        """Forward the next ``n`` matching requests but replace ``header`` in their responses."""
        self._add(Fault("header", n, method, header=header.lower(), value=value))

    def hold_next(self, n: int, *, method: str | None = None, path_contains: str | None = None) -> threading.Event:
        """Stall the next ``n`` matching requests until the returned event is set, then forward them.

        A test that must act while a worker is inside a step (stop Postgres while a batch is
        uploading) holds that step's request instead of racing it with a timed delay.
        """
        release = threading.Event()
        self._add(Fault("hold", n, method, path_contains=path_contains, release=release))
        return release

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self.seen.clear()

    def count(self, method: str | None = None, outcome: str | None = None) -> int:
        """How many requests were seen, optionally only of one method and/or outcome."""
        with self._lock:
            return sum(1 for s in self.seen if method in (None, s.method) and outcome in (None, s.outcome))

    # -- internals ------------------------------------------------------------------------------------

    def _add(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if (fault.count > 0 and fault.method in (None, method)
                        and (fault.path_contains is None or fault.path_contains in path)):
                    fault.count -= 1
                    self.seen.append(Seen(method, path, fault.kind))
                    return fault
            self.seen.append(Seen(method, path, "forwarded"))
            return None


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1 keeps botocore's pooled connections alive, as against real S3.
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._handle()

        do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

        def _handle(self) -> None:
            body = self._read_body()  # always, so a keep-alive connection stays in sync
            fault = proxy._take(self.command, self.path)
            try:
                if fault is not None and fault.kind == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault is not None and fault.kind == "fail":
                    self._send_error_document(fault.status, fault.code)
                    return
                if fault is not None and fault.kind == "delay" and fault.when == "before":
                    proxy._closing.wait(fault.seconds)
                if fault is not None and fault.kind == "hold":
                    while not (fault.release.is_set() or proxy._closing.is_set()):
                        fault.release.wait(0.05)
                status, headers, payload = self._forward(body)
                if fault is not None and fault.kind == "delay" and fault.when == "after":
                    proxy._closing.wait(fault.seconds)
                if fault is not None and fault.kind == "header":
                    headers = [(k, v) for k, v in headers if k.lower() != fault.header]
                    headers.append((fault.header, fault.value))
                self._send(status, headers, payload)
            except OSError:
                # The client gave up (read timeout) and closed its end: nothing to answer.
                self.close_connection = True

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        conn.putheader(name, value)
                conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                response = conn.getresponse()
                payload = response.read()
                headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
                if self.command == "HEAD":
                    # A HEAD answer carries the object's length but no body; keep it.
                    headers.append(("Content-Length", response.getheader("Content-Length", "0")))
                return response.status, headers, payload
            finally:
                conn.close()

        def _send_error_document(self, status: int, code: str) -> None:
            payload = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                       f"<Message>injected by the test fault proxy</Message></Error>").encode()
            self._send(status, [("Content-Type", "application/xml")], payload)

        def _send(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler
