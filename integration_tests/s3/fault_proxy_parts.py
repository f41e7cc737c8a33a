"""A loopback proxy in front of one TCP service that injects network faults on demand.

A test points its client at ``proxy.port`` (``proxy.url`` for HTTP) instead of the
service. Every mode can ``pause`` (hold every byte in both directions until ``resume``:
a stalled network, connections stay open) and ``cut`` (close every open connection, as a
dropped link does). With ``http=True`` the proxy also reads HTTP/1.1 messages
(Content-Length or chunked bodies, keep-alive, ``Expect: 100-continue``), so a rule can
act on the next request whose method and path match:

- ``drop_response``: forward the request, let the service apply it, read its answer, then
  close the client's connection without answering: a lost answer (a client then retries).
- ``delay_response``: hold the answer for some seconds: a stall past a client's timeout.

Used by the S3 fault tests (a lost answer to a conditional PUT); plain TCP mode is meant
for Kafka and PostgreSQL stalls. Not for production: no TLS, loopback only.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO, Literal

Action = Literal["drop", "delay"]
_CHUNK = 64 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})


@dataclass
class HttpRule:
    """Act on the next ``times`` requests whose method is ``method`` and whose target (path
    and query) matches the regular expression ``path``; ``fired`` lists what it acted on."""

    method: str
    path: str
    action: Action
    times: int = 1
    delay_seconds: float = 0.0
    fired: list[str] = field(default_factory=list)

    def matches(self, method: str, target: str) -> bool:
        return (
            len(self.fired) < self.times
            and method.upper() == self.method.upper()
            and re.search(self.path, target) is not None
        )


@dataclass
class _Message:
    head: bytes
    body: bytes
    start_line: str
    headers: dict[str, str]

    def raw(self) -> bytes:
        return self.head + self.body


class _ConnectionLost(Exception):
    """One side of a proxied connection closed or failed."""


class FaultProxy:
    """Relays ``127.0.0.1:<port>`` to ``upstream_host:upstream_port`` (see the module doc)."""

    def __init__(self, upstream_host: str, upstream_port: int, *, http: bool = False) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.http = http
        self.requests: list[tuple[str, str]] = []
        """Every HTTP request seen, as (method, target), in arrival order."""
        self._rules: list[HttpRule] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._stopped = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._acceptor = threading.Thread(
            target=self._accept, name=f"fault-proxy-{self.port}", daemon=True
        )
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # Faults --------------------------------------------------------------------------------

    def drop_response(self, method: str, path: str, times: int = 1) -> HttpRule:
        return self._add(HttpRule(method, path, "drop", times))

    def delay_response(self, method: str, path: str, seconds: float, times: int = 1) -> HttpRule:
        return self._add(HttpRule(method, path, "delay", times, seconds))

    def pause(self) -> None:
        """Hold every byte, both ways, until ``resume``."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        """Close every open connection (both sides); new connections are still accepted."""
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _close(sock)

    def _release(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._sockets.difference_update(sockets)
        for sock in sockets:
            _close(sock)

    def stop(self) -> None:
        self._stopped.set()
        self._flowing.set()
        _close(self._server)
        self.cut()
        self._acceptor.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _add(self, rule: HttpRule) -> HttpRule:
        if not self.http:
            raise ValueError("HTTP rules need FaultProxy(..., http=True)")
        with self._lock:
            self._rules.append(rule)
        return rule

    def _claim_rule(self, method: str, target: str) -> HttpRule | None:
        with self._lock:
            self.requests.append((method, target))
            for rule in self._rules:
                if rule.matches(method, target):
                    rule.fired.append(target)
                    return rule
        return None

    # Relaying ------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._track(client)
            relay = self._relay_http if self.http else self._relay_tcp
            threading.Thread(target=relay, args=(client,), daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _connect_upstream(self) -> socket.socket:
        upstream = socket.create_connection(self.upstream, timeout=30)
        upstream.settimeout(None)
        self._track(upstream)
        return upstream

    def _relay_tcp(self, client: socket.socket) -> None:
        try:
            upstream = self._connect_upstream()
        except OSError:
            self._release(client)
            return
        back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
        back.start()
        self._pump(client, upstream)
        back.join()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    break
                self._flowing.wait()
                target.sendall(data)
        except OSError:
            pass
        finally:
            self._release(source, target)

    def _relay_http(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        upstream_reader: BinaryIO | None = None
        client_reader = client.makefile("rb")
        try:
            while True:
                request = _read_message(client_reader, on_expect=lambda: _send_continue(client))
                if request is None:
                    return
                method, target = _method_and_target(request.start_line)
                rule = self._claim_rule(method, target)
                self._flowing.wait()
                if upstream is None:
                    upstream = self._connect_upstream()
                    upstream_reader = upstream.makefile("rb")
                assert upstream_reader is not None
                upstream.sendall(request.raw())
                response = _read_response(upstream_reader, method)
                if response is None:
                    return
                if rule is not None and rule.action == "drop":
                    return
                if rule is not None and rule.action == "delay":
                    self._stopped.wait(rule.delay_seconds)
                self._flowing.wait()
                client.sendall(response.raw())
                if _closes(response):
                    return
        except (OSError, _ConnectionLost, ValueError):
            return
        finally:
            self._release(client, *([upstream] if upstream is not None else []))


def _method_and_target(start_line: str) -> tuple[str, str]:
    parts = start_line.split(" ")
    if len(parts) < 2:
        raise ValueError(f"not an HTTP request line: {start_line!r}")
    return parts[0], parts[1]


def _send_continue(client: socket.socket) -> None:
    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")


def _read_head(reader: BinaryIO) -> tuple[bytes, str, dict[str, str]] | None:
    lines: list[bytes] = []
    while True:
        line = reader.readline(_CHUNK)
        if not line:
            if lines:
                raise _ConnectionLost("connection closed inside a message head")
            return None
        if line in (b"\r\n", b"\n"):
            if not lines:
                continue
            break
        lines.append(line)
    start_line = lines[0].decode("latin-1").strip()
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return b"".join(lines), start_line, headers


def _read_message(reader: BinaryIO, on_expect: Callable[[], None] | None = None) -> _Message | None:
    """A request: head and body, an ``Expect: 100-continue`` answered here and dropped
    (botocore does not sign it), so the service answers only once."""
    read = _read_head(reader)
    if read is None:
        return None
    head_lines, start_line, headers = read
    if headers.get("expect", "").lower() == "100-continue":
        if on_expect is not None:
            on_expect()
        head_lines = b"".join(
            line + b"\r\n"
            for line in head_lines.split(b"\r\n")
            if line and not line.lower().startswith(b"expect:")
        )
        headers.pop("expect")
    head = head_lines + b"\r\n"
    return _Message(head, _read_body(reader, headers, until_close=False), start_line, headers)


def _read_response(reader: BinaryIO, request_method: str) -> _Message | None:
    """The final answer to one request (interim 1xx answers are skipped)."""
    while True:
        read = _read_head(reader)
        if read is None:
            return None
        head_lines, start_line, headers = read
        status = int(start_line.split(" ")[1])
        if 100 <= status < 200:
            continue
        head = head_lines + b"\r\n"
        if request_method.upper() == "HEAD" or status in _NO_BODY_STATUSES:
            return _Message(head, b"", start_line, headers)
        return _Message(head, _read_body(reader, headers, until_close=True), start_line, headers)


def _read_body(reader: BinaryIO, headers: dict[str, str], until_close: bool) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        while True:
            size_line = reader.readline(_CHUNK)
            if not size_line:
                raise _ConnectionLost("connection closed inside a chunked body")
            parts.append(size_line)
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while True:
                    trailer = reader.readline(_CHUNK)
                    parts.append(trailer)
                    if trailer in (b"\r\n", b"\n", b""):
                        return b"".join(parts)
            parts.append(_read_exactly(reader, size + 2))
    length = headers.get("content-length")
    if length is not None:
        return _read_exactly(reader, int(length))
    return reader.read() if until_close else b""


def _read_exactly(reader: BinaryIO, count: int) -> bytes:
    data = reader.read(count)
    if len(data) != count:
        raise _ConnectionLost("connection closed inside a body")
    return data


def _closes(response: _Message) -> bool:
    if response.headers.get("connection", "").lower() == "close":
        return True
    has_length = "content-length" in response.headers
    chunked = "chunked" in response.headers.get("transfer-encoding", "").lower()
    return not (has_length or chunked or not response.body)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
