"""Telling a refused login from a broker that is down, for both Kafka connectors.

kafka-python retries a connection whose SASL handshake or credentials the broker refused
like any failed connection, until its bootstrap timeout, and then raises a bare
``KafkaTimeoutError`` ("Unable to bootstrap"): a wrong password would read as an
unreachable cluster. So when a client with SASL settings cannot connect, one probe
connects to each bootstrap server again, at most ``PROBE_ATTEMPTS`` times (the broker
sometimes closes the socket before the client reads its refusal), and if a broker refused
the login, ``KafkaAuthenticationError`` says so in one line: the mechanism, the user,
the security protocol and the servers, never the password.

The probe logs in over a blocking socket with kafka-python's protocol classes and SASL
mechanisms (private parts, pinned by ``integration_tests/ops/test_kafka_secured.py``): its
own transport drops a refusal that arrives together with the broker closing the socket.
It costs nothing when connections work.

The same probe tells a TLS listener that refused the client (mTLS: no client certificate,
or one its CA did not sign; or a server certificate the client's CA file does not trust)
from an unreachable one, for SSL and SASL_SSL alike: after the handshake it sends
ApiVersions, because under TLS 1.3 the broker's refusal of a client certificate arrives
as an alert on the first read. OAUTHBEARER refusals name the token provider's option and
never the token (JWT-shaped text in a broker's reason is cut out too).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import KafkaAuthenticationError, TlsRefusal

PROBE_ATTEMPTS = 3
_ERROR_PREFIX = re.compile(r"^(\[Error \d+\] )?\w+Error: ")
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*")
PROBE_TIMEOUT_MS = 5_000


def uses_sasl(config: Mapping[str, Any]) -> bool:
    return str(config.get("security_protocol") or "").upper().startswith("SASL")


def uses_tls(config: Mapping[str, Any]) -> bool:
    return str(config.get("security_protocol") or "").upper() in ("SSL", "SASL_SSL")


def refused_login(config: Mapping[str, Any]) -> BaseException | None:
    """The error a bootstrap server refused the SASL login or the TLS handshake of
    ``config`` with (kafka-python settings, ``bootstrap_servers`` included), or None: it
    did not, or it cannot be told (no answer: the caller's own error stands)."""
    if not uses_sasl(config) and not uses_tls(config):
        return None
    servers = config.get("bootstrap_servers") or ()
    if isinstance(servers, str):
        servers = servers.split(",")
    deadline = time.monotonic() + PROBE_TIMEOUT_MS / 1000
    for _ in range(PROBE_ATTEMPTS):
        for server in servers:
            host, _, port = str(server).strip().rpartition(":")
            if time.monotonic() >= deadline:
                return None
            try:
                return _login(host.strip("[]"), int(port), config, deadline)
            except KafkaAuthenticationError as no_token:  # the token provider failed
                return no_token
            except (OSError, ValueError, EOFError):
                continue  # down, or closed before answering: try again, or another server
    return None


def _login(
    host: str, port: int, config: Mapping[str, Any], deadline: float
) -> BaseException | None:
    """One SASL login over a blocking socket, as kafka-python's connection does it
    (SaslHandshake v1, then SaslAuthenticate until the mechanism is done): the refusal,
    or None when the broker accepted it. Blocking, because kafka-python's own transport
    drops a refusal that arrives together with the broker closing the socket."""
    import socket
    import ssl

    from kafka import errors as kafka_errors
    from kafka.net.sasl import get_sasl_mechanism
    from kafka.net.transport import KafkaSSLTransport
    from kafka.protocol.parser import KafkaProtocol
    from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

    timeout = max(0.1, deadline - time.monotonic())
    raw = socket.create_connection((host, port), timeout=timeout)
    connection: socket.socket = raw
    try:
        if uses_tls(config):
            settings = {key: config.get(key) for key in KafkaSSLTransport.DEFAULT_CONFIG}
            if settings["ssl_check_hostname"] is None:
                settings["ssl_check_hostname"] = True
            context = KafkaSSLTransport._build_ssl_context(settings)
            try:
                connection = context.wrap_socket(raw, server_hostname=host)
            except ssl.SSLError as tls_error:
                return TlsRefusal(_tls_reason(tls_error))
        parser = KafkaProtocol(client_id="eospack-authentication-probe")

        def call(request: Any) -> Any:
            parser.send_request(request)
            connection.sendall(parser.send_bytes())
            while True:
                data = connection.recv(65536)
                if not data:
                    raise EOFError("closed")
                answers = parser.receive_bytes(data)
                if answers:
                    return answers[0][1]

        if not uses_sasl(config):
            from kafka.protocol.metadata import ApiVersionsRequest

            try:
                call(ApiVersionsRequest(version=0))
            except ssl.SSLError as tls_error:
                return TlsRefusal(_tls_reason(tls_error))
            return None

        mechanism_name = str(config.get("sasl_mechanism") or "PLAIN")
        handshake = SaslHandshakeRequest(mechanism=mechanism_name, version=1)
        answer = call(handshake)
        error = kafka_errors.for_code(answer.error_code)
        if error is not kafka_errors.NoError:
            return kafka_errors.UnsupportedSaslMechanismError(
                f"the listener does not enable {mechanism_name} (it enables"
                f" {', '.join(answer.mechanisms) or 'none'})"
            )
        settings = {key: value for key, value in config.items() if key.startswith("sasl_")}
        mechanism = get_sasl_mechanism(mechanism_name)(host=host, **settings)
        while not mechanism.is_done():
            answer = call(SaslAuthenticateRequest(auth_bytes=mechanism.auth_bytes(), version=1))
            error = kafka_errors.for_code(answer.error_code)
            if error is not kafka_errors.NoError:
                return kafka_errors.SaslAuthenticationFailedError(
                    f"{error.__name__}: {answer.error_message}"
                )
            mechanism.receive(answer.auth_bytes)
        if not mechanism.is_authenticated():
            return kafka_errors.SaslAuthenticationFailedError(
                f"the broker's answer did not authenticate the {mechanism_name} exchange"
            )
        return None
    finally:
        connection.close()


def _tls_reason(error: BaseException) -> str:
    """An ``ssl.SSLError`` as its OpenSSL reason (e.g. TLSV13_ALERT_CERTIFICATE_REQUIRED)."""
    reason = getattr(error, "reason", None) or getattr(error, "verify_message", None)
    return str(reason or " ".join(str(error).split()))


def authentication_error(
    config: Mapping[str, Any], refusal: BaseException, who: str
) -> KafkaAuthenticationError:
    """One line for ``refusal``: ``who`` (e.g. "2pc-kafka"), the servers, the protocol,
    the mechanism and the user (or the token provider, or the TLS verdict); the broker's
    reason with the password and anything shaped like a token cut out."""
    password = str(config.get("sasl_plain_password") or "")
    reason = str(refusal)
    while (prefix := _ERROR_PREFIX.match(reason)) is not None:
        reason = reason[prefix.end() :]
    if password:
        reason = reason.replace(password, "***")
    reason = _TOKEN_LIKE.sub("***", reason).strip().rstrip(".")
    servers = config.get("bootstrap_servers")
    if isinstance(servers, (list, tuple)):
        servers = ",".join(servers)
    protocol = config.get("security_protocol")
    where = f"{who}: Kafka at {servers} (option kafka.bootstrap.servers)"
    if isinstance(refusal, TlsRefusal):
        return KafkaAuthenticationError(
            f"{where} refused the TLS handshake over {protocol} ({reason}): check the client"
            " certificate (kafka.ssl.keystore.location or kafka.ssl.certfile/keyfile; the"
            " listener's CA must have signed it) and kafka.ssl.truststore.location (the CA"
            " of the broker's certificate)"
        )
    mechanism = config.get("sasl_mechanism")
    if str(mechanism).upper() == "OAUTHBEARER":
        provider = getattr(config.get("sasl_oauth_token_provider"), "name", "(a provider)")
        return KafkaAuthenticationError(
            f"{where} refused authentication: SASL OAUTHBEARER with the token of {provider}"
            f" (option kafka.sasl.oauth.token.provider) over {protocol} failed ({reason}):"
            " check the token the provider returns (subject, scope, audience, expiry)"
            " against the listener's validator"
        )
    user = config.get("sasl_plain_username")
    as_user = f" as user {user!r}" if user else ""
    return KafkaAuthenticationError(
        f"{where} refused authentication: SASL {mechanism}{as_user} over {protocol} failed"
        f" ({reason}): check kafka.sasl.jaas.config's username and password and"
        " kafka.sasl.mechanism against the listener's"
    )


def raise_if_refused(config: Mapping[str, Any], who: str) -> None:
    """After a client of ``config`` could not connect: raise ``KafkaAuthenticationError``
    if the reason is a refused login; else return (the caller raises its own error)."""
    refusal = refused_login(config)
    if isinstance(refusal, KafkaAuthenticationError):
        raise refusal from None  # already one line naming the option
    if refusal is not None:
        raise authentication_error(config, refusal, who) from None


@contextlib.contextmanager
def naming_refused_logins(config: Mapping[str, Any], who: str) -> Iterator[None]:
    """Around building a client of ``config`` inside a task: when kafka-python gives up
    bootstrapping (it retries a refused login like a lost connection, for its bootstrap
    timeout, then says only "Unable to bootstrap"), raise ``KafkaAuthenticationError`` if
    a broker refused the login or the TLS handshake; else the error stands. No probe runs
    while clients connect: a task pays nothing for it."""
    from kafka.errors import KafkaTimeoutError

    try:
        yield
    except KafkaTimeoutError:
        raise_if_refused(config, who)
        raise
