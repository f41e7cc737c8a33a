"""Attacks on the Kafka security options (issue 37) that need no broker."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

import pytest
from kafka.net.sasl import get_sasl_mechanism

from eospack.connectors.kafka.client import token_provider
from eospack.connectors.kafka.client.config import kafka_client_params
from eospack.connectors.kafka.errors import KafkaAuthenticationError

_SCRAM = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required"
    ' username="app" password="s3cr3t-pw";'
)


@pytest.mark.parametrize("mechanism", ["scram-sha-512", "Scram-Sha-256", "plain"])
def test_a_lowercase_mechanism_reaches_kafka_python_as_a_name_it_knows(mechanism: str) -> None:
    """The refusals compare the mechanism upper-cased, so a lowercase one passes them; it
    must then also reach kafka-python as a registered name (its lookup is exact: before,
    'scram-sha-512' passed parsing and failed each connection with a KeyError)."""
    options = {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism}
    options["sasl.jaas.config"] = _SCRAM
    params = dict(kafka_client_params(options, "producer", {}, ValueError, "2pc-kafka"))
    assert get_sasl_mechanism(params["sasl_mechanism"]) is not None


def test_a_provider_that_hangs_fails_the_query_start_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider that never answers (an unreachable token endpoint without a timeout)
    must not hang the query's start forever: it fails in one line naming the option."""
    (tmp_path / "hanging_tokens_attack.py").write_text(
        "import threading\nRELEASE = threading.Event()\n\n\n"
        "def token() -> str:\n    RELEASE.wait(60)\n    return 'tok-never-seen'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(token_provider, "FIRST_TOKEN_TIMEOUT_SECONDS", 1.0, raising=False)
    options = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}
    options["sasl.oauth.token.provider"] = "hanging_tokens_attack:token"
    outcome: list[BaseException | None] = []

    def parse() -> None:
        try:
            kafka_client_params(options, "consumer", {}, ValueError, "replayable-kafka")
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    started = time.monotonic()
    worker = threading.Thread(target=parse, daemon=True)
    worker.start()
    worker.join(timeout=15)
    try:
        assert not worker.is_alive(), "parsing the options hung on the token provider"
        assert time.monotonic() - started < 15
        assert isinstance(outcome[0], KafkaAuthenticationError)
        message = str(outcome[0])
        assert "kafka.sasl.oauth.token.provider" in message and "\n" not in message
        assert "tok-never-seen" not in message
    finally:
        sys.modules["hanging_tokens_attack"].RELEASE.set()
        worker.join(timeout=5)


@pytest.mark.parametrize("typo", ["http", "HTTP S", "true", "none"])
def test_a_misspelt_hostname_check_is_refused_not_turned_off(typo: str) -> None:
    """Only an empty value turns hostname verification off (the docs); before, any value
    other than https (a typo) silently turned it off."""
    options = {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": typo}
    with pytest.raises(ValueError, match="kafka.ssl.endpoint.identification.algorithm") as raised:
        kafka_client_params(options, "consumer", {}, ValueError, "replayable-kafka")
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("protocol", "setting", "value"),
    [
        (None, "sasl.jaas.config", _SCRAM),
        ("PLAINTEXT", "sasl.jaas.config", _SCRAM),
        ("SSL", "sasl.jaas.config", _SCRAM),
        (None, "ssl.cafile", "/etc/kafka/ca.pem"),
        ("SASL_PLAINTEXT", "ssl.truststore.location", "/etc/kafka/ca.pem"),
        (None, "ssl.keystore.location", "/etc/kafka/client.pem"),
    ],
)
def test_security_settings_the_protocol_would_ignore_are_refused(
    protocol: str | None, setting: str, value: str
) -> None:
    """kafka-python ignores SASL settings unless the protocol is SASL_*, and TLS files
    unless it is SSL or SASL_SSL: before, a forgotten kafka.security.protocol connected in
    plain text with the credentials silently unused (a secured listener then looks
    unreachable). Refused in one line naming kafka.security.protocol, never the secret."""
    options = {setting: value}
    if protocol is not None:
        options["security.protocol"] = protocol
    with pytest.raises(ValueError, match="kafka.security.protocol") as raised:
        kafka_client_params(options, "producer", {}, ValueError, "2pc-kafka")
    assert "\n" not in str(raised.value) and "s3cr3t-pw" not in str(raised.value)


@pytest.mark.timeout(60)
def test_kafka_pythons_debug_log_of_an_admin_client_holds_no_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """kafka-python's KafkaAdminClient logs its whole configuration at DEBUG when it
    starts, the SASL password and the key's passphrase included; the sink builds admin
    clients from the parsed options (transactions.admin_client)."""
    from eospack.connectors.kafka.client.transactions import admin_client
    from eospack.connectors.kafka.sink.options import parse_options

    options = parse_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "topic": "out",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": _SCRAM,
            "kafka.ssl.key.password": "k3y-passphrase",
        }
    )

    class NoNetwork:
        def __init__(self, **_: object) -> None:
            raise RuntimeError("no network in this test")

    config = {**options.client_config(), "kafka_client": NoNetwork}
    with (
        caplog.at_level(logging.DEBUG, logger="kafka"),
        pytest.raises(RuntimeError, match="no network"),
    ):
        admin_client(config)
    assert "Starting KafkaAdminClient" in caplog.text, "the attack needs kafka-python's log"
    assert "s3cr3t-pw" not in caplog.text
    assert "k3y-passphrase" not in caplog.text


def test_a_provider_that_fails_after_the_query_started_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider that gave its first token and fails later (credentials expired on an
    executor): a task's bootstrap times out, then the probe asks the provider again.
    Before, the provider's own exception escaped the probe in place of the documented
    one line naming the option."""
    from kafka.errors import KafkaTimeoutError

    from eospack.connectors.kafka.client import authentication

    (tmp_path / "expiring_tokens_attack.py").write_text(
        "CALLS = []\n\n\ndef token() -> str:\n    CALLS.append(1)\n"
        "    if len(CALLS) > 1:\n        raise RuntimeError('credentials expired')\n"
        "    return 'tok-first'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    options = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}
    options["sasl.oauth.token.provider"] = "expiring_tokens_attack:token"
    config = dict(kafka_client_params(options, "producer", {}, ValueError, "2pc-kafka"))
    config["bootstrap_servers"] = ["127.0.0.1:9"]
    provider = config["sasl_oauth_token_provider"]

    def login_asking_the_token(*_: object) -> None:  # what the mechanism's auth_bytes does
        provider.token()

    monkeypatch.setattr(authentication, "_login", login_asking_the_token)
    with (
        pytest.raises(KafkaAuthenticationError) as raised,
        authentication.naming_refused_logins(config, "2pc-kafka"),
    ):
        raise KafkaTimeoutError("Unable to bootstrap")
    message = str(raised.value)
    assert "kafka.sasl.oauth.token.provider" in message and "credentials expired" in message
    assert "\n" not in message and "tok-first" not in message


@pytest.mark.parametrize("setting", ["ssl.keystore.location", "ssl.truststore.location"])
def test_a_java_store_given_without_its_type_is_refused_in_one_line(
    tmp_path: Path, setting: str
) -> None:
    """A JKS file under a PEM name (no kafka.ssl.*.type given: PEM is the default) reached
    kafka-python, whose TLS context failed on every connection like an unreachable
    broker (and the probe took it for one). Refused at parse time saying what to do."""
    store = tmp_path / "client.jks"
    store.write_bytes(b"\xfe\xed\xfe\xed\x00\x00\x00\x02" + bytes(range(256)))
    options = {"security.protocol": "SSL", setting: str(store)}
    with pytest.raises(ValueError, match=f"kafka.{setting}") as raised:
        kafka_client_params(options, "consumer", {}, ValueError, "replayable-kafka")
    assert "PEM" in str(raised.value) and "\n" not in str(raised.value)
