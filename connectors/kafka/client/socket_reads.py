"""kafka-python's sockets read in large pieces.

kafka-python 3.0's transports (``kafka/net/transport.py``) read a socket 4,096 bytes per
``recv`` and join the pieces: a 4 MB Fetch response is a thousand calls and copies on its
network thread, which then took 80% of the wall clock of the native reader (about 1 CPU
second per 2.5M records against 0.15 s of decoding). ``use_large_reads`` gives both
transports the same loop with 1 MiB reads: the bytes received and every error path are
kafka-python's own, only the size of each ``recv`` differs. Pinned by every Kafka test
(they run with it), measured in ``benchmarks/kafka_source.py``.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

RECV_BYTES = 1 << 20

log = logging.getLogger(__name__)

_installed = False


def _receive(transport: Any, retry_errors: tuple[type[BaseException], ...]) -> tuple[bytes, Any]:
    import kafka.errors as kafka_errors

    received = []
    error = None
    while True:
        try:
            data = transport._sock.recv(RECV_BYTES)
        except retry_errors:
            break
        except BaseException as failure:
            log.exception("%s: Error receiving network data closing socket", transport)
            error = kafka_errors.KafkaConnectionError(failure)
            break
        if not data:
            log.error("%s: socket disconnected", transport)
            error = kafka_errors.KafkaConnectionError("socket disconnected")
            break
        received.append(data)
    return b"".join(received), error


def _tcp_receive(self: Any) -> tuple[bytes, Any]:
    return _receive(self, (BlockingIOError, InterruptedError))


def _ssl_receive(self: Any) -> tuple[bytes, Any]:
    return _receive(
        self, (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
    )


def use_large_reads() -> None:
    """Install the large reads into kafka-python's transports (once per process)."""
    global _installed
    if _installed:
        return
    from kafka.net.transport import KafkaSSLTransport, KafkaTCPTransport

    KafkaTCPTransport._sock_recv = _tcp_receive  # type: ignore[method-assign]
    KafkaSSLTransport._sock_recv = _ssl_receive  # type: ignore[method-assign]
    _installed = True
