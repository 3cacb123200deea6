"""A TCP proxy in front of the test's Postgres that can go down, or cut a connection at its COMMIT.

What a network between a worker and its ledger does: drop every connection and refuse new
ones for a while (``down`` / ``up``), or break one connection at the worst moment of a
transaction (``cut_next_commit``): before the server sees the COMMIT (nothing committed) or
after the server has committed it but before its answer reaches the client (committed, and
the client cannot know). The bytes are Postgres's own wire protocol, forwarded unchanged;
the proxy only looks for the COMMIT command and its ``CommandComplete`` tag. Connect through
it with ``sslmode=disable`` so that those bytes are plain.
"""

from __future__ import annotations

import socket
import threading
from typing import Literal

#: The simple query or parse message text of psycopg's COMMIT, and the server's CommandComplete tag.
_COMMIT = b"COMMIT\x00"
Cut = Literal["before", "after"]


class PgProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._cut: Cut | None = None
        #: COMMITs cut so far, by where: the test's proof that the moment it means to break came.
        self.cuts: dict[str, int] = {"before": 0, "after": 0}
        self._listener: socket.socket | None = None
        self.port = 0
        self.up()

    # -- control -----------------------------------------------------------------------------
    def up(self) -> None:
        """Accept connections (again, on the same port)."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self.port = listener.getsockname()[1]
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="pg-proxy-accept", daemon=True).start()

    def down(self) -> None:
        """Close every connection and refuse new ones: the ledger is unreachable until ``up``."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = self._pairs, []
        if listener is not None:
            _close(listener)
        for a, b in pairs:
            _close(a)
            _close(b)

    def cut_next_commit(self, where: Cut) -> None:
        """Break the connection of the next COMMIT: ``before`` the server gets it, or ``after`` it committed."""
        with self._lock:
            self._cut = where

    def close(self) -> None:
        self.down()

    def url(self, database_url: str) -> str:
        """``database_url`` pointed at this proxy, TLS off (the proxy reads the commands)."""
        scheme, rest = database_url.split("://", 1)
        creds, hostpart = rest.rsplit("@", 1) if "@" in rest else ("", rest)
        _, db = hostpart.split("/", 1)
        db, _, query = db.partition("?")
        query = "&".join(q for q in (query, "sslmode=disable") if q)
        return f"{scheme}://{creds + '@' if creds else ''}127.0.0.1:{self.port}/{db}?{query}"

    # -- pumping -------------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server, "before"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, "after"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, side: Cut) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if data and _COMMIT in data:
                with self._lock:
                    cut = self._cut == side
                    if cut:
                        self._cut = None
                        self.cuts[side] += 1
                if cut:
                    data = b""  # the COMMIT (or its answer) never arrives: the connection breaks here
            if not data:
                _close(src)
                _close(dst)
                return
            try:
                dst.sendall(data)
            except OSError:
                _close(src)
                _close(dst)
                return


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
