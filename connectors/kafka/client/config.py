"""``kafka.*`` options to kafka-python keyword arguments, for consumers and producers alike.

Spark's Kafka source and sink pass ``kafka.<name>`` options to the Java client; eospack's
formats take the same names and map them onto kafka-python's keywords (dots become
underscores; a few are renamed; ``sasl.jaas.config`` becomes a username and password).
A name kafka-python does not know for that client, or one the format owns itself, is
refused with one line naming the option and the fix. Values of secret options never
appear in errors.

Security beyond PLAIN and SCRAM (issue 37; docs/connectors/kafka-security.md):

- OAUTHBEARER takes ``kafka.sasl.oauth.token.provider=module:function`` (kafka-python's
  ``sasl_oauth_token_provider``, named by its keyword as Spark users name every other
  setting): ``token_provider`` imports it and asks it for a token while the options are
  parsed, so a wrong name or a broken provider fails the query at its start.
- mTLS takes PEM files, under Java's names (``ssl.keystore.location`` with
  ``ssl.keystore.type=PEM``, ``ssl.key.password``, ``ssl.truststore.location``) or
  kafka-python's (``ssl.certfile``, ``ssl.keyfile``, ``ssl.password``, ``ssl.cafile``).
  JKS and PKCS12 stores are refused with the keytool and openssl commands that convert
  them: kafka-python (Python's ``ssl``) reads PEM only, and converting once beats a
  conversion on every executor.
- Refused in one line with the way that works: ``AWS_MSK_IAM`` as a mechanism (AWS's
  signer with OAUTHBEARER is the Python client's way, and the one tested here), GSSAPI
  without the ``gssapi`` package (kafka-python's Kerberos needs it; with it installed,
  GSSAPI is passed on, untested here: no KDC), and Java-only login modules.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re
from collections.abc import Mapping
from typing import Any, Literal

from eospack.core.options import option_error

SECRET_KAFKA_OPTIONS = frozenset(
    {
        "sasl.jaas.config",
        "sasl.plain.password",
        "ssl.key.password",
        "ssl.password",
        "ssl.keystore.password",
        "ssl.truststore.password",
    }
)

TOKEN_PROVIDER = "sasl.oauth.token.provider"
"""kafka-python's ``sasl_oauth_token_provider`` as an option: ``module:function``."""

# Java client settings kafka-python has no counterpart for, each with the way that works.
_REFUSED_SECURITY_OPTIONS = {
    "ssl.keystore.password": "PEM files have no store password; an encrypted key's"
    " passphrase goes in kafka.ssl.key.password",
    "ssl.truststore.password": "PEM files have no store password: remove it",
    "sasl.login.callback.handler.class": "kafka-python runs no Java callback handler: name"
    " a Python function that returns the token in kafka.sasl.oauth.token.provider",
    "sasl.oauthbearer.token.endpoint.url": "kafka-python has no OAuth client of its own:"
    " name a Python function that fetches the token in kafka.sasl.oauth.token.provider",
}
_MSK_IAM_FIX = (
    "use OAUTHBEARER with kafka.sasl.oauth.token.provider naming a function that returns"
    " MSKAuthTokenProvider.generate_auth_token(region) (package"
    " aws-msk-iam-sasl-signer-python; see docs/connectors/kafka-security.md)"
)
_GSSAPI_NEEDS = (
    "the Python package gssapi on the driver and every executor (pip install gssapi, which"
    " builds against MIT Kerberos: Debian's libkrb5-dev) and a Kerberos ticket in each"
    " process (kinit, or KRB5_CLIENT_KTNAME naming a keytab)"
)
_PEM_CONVERSION = (
    "convert it with keytool -importkeystore -srckeystore client.jks -destkeystore"
    " client.p12 -deststoretype PKCS12, then openssl pkcs12 -in client.p12 -out client.pem"
    " (key and chain in one file; its passphrase goes in kafka.ssl.key.password), and set"
    " kafka.ssl.keystore.type=PEM"
)

# Kafka (Java client) names whose kafka-python keyword is not the dotted name with '_'.
_RENAMED_KAFKA_OPTIONS = {
    "ssl.key.password": "ssl_password",
    "ssl.truststore.location": "ssl_cafile",
    "ssl.keystore.location": "ssl_certfile",
}

# kafka-python settings that take Python objects, or that the formats set themselves.
_UNSETTABLE_KWARGS = frozenset(
    {
        "bootstrap_servers",
        "kafka_client",
        "selector",
        "partition_assignment_strategy",
        "metric_reporters",
        "default_offset_commit_callback",
        "socket_options",
        "ssl_context",
        "sasl_kerberos_name",
        "group_instance_id",
        "api_version",
        "auto_commit_interval_ms",
        "key_serializer",
        "value_serializer",
        "partitioner",
        "transactional_id",
    }
)

Client = Literal["consumer", "producer"]

_SECRET_KWARGS = frozenset({"sasl_plain_password", "ssl_password"})


def _hidden(kwargs: Mapping[Any, Any]) -> dict[Any, Any]:
    return {k: "***" if k in _SECRET_KWARGS else v for k, v in kwargs.items()}


class _HideSecretKwargs(logging.Filter):
    """kafka-python's KafkaAdminClient logs its keyword arguments at DEBUG when it starts,
    the password and the key's passphrase included: their values become ***."""

    def filter(self, record: logging.LogRecord) -> bool:
        # A lone dict argument is kept by LogRecord as the args themselves.
        if isinstance(record.args, dict):
            record.args = _hidden(record.args)
        elif isinstance(record.args, tuple):
            record.args = tuple(_hidden(a) if isinstance(a, dict) else a for a in record.args)
        return True


if not any(
    isinstance(f, _HideSecretKwargs) for f in logging.getLogger("kafka.admin.client").filters
):
    logging.getLogger("kafka.admin.client").addFilter(_HideSecretKwargs())


@functools.cache
def _defaults(client: Client) -> dict[str, Any]:
    """kafka-python's settings of ``client`` with their defaults, imported on first need:
    options without ``kafka.*`` settings (other than the servers) never import kafka-python,
    so Spark's planner processes that only parse them do not pay ~0.15 s for it."""
    from kafka import KafkaConsumer, KafkaProducer

    configs = {"consumer": KafkaConsumer.DEFAULT_CONFIG, "producer": KafkaProducer.DEFAULT_CONFIG}
    return dict(configs[client])


_ALWAYS_INT = ("receive_buffer_bytes", "send_buffer_bytes")


def kafka_client_params(
    options: Mapping[str, str],
    client: Client,
    refused: Mapping[str, str],
    error: type[ValueError],
    format_name: str,
) -> tuple[tuple[str, Any], ...]:
    """kafka-python keywords for ``options`` (``kafka.*`` names without the prefix, and
    without ``bootstrap.servers``); ``refused`` maps names the format owns to the fix."""
    raw = dict(options)
    params: dict[str, Any] = {}
    jaas = raw.pop("sasl.jaas.config", None)
    if jaas is not None:
        params.update(parse_jaas(jaas, error))
    provider_name = raw.pop(TOKEN_PROVIDER, None)
    truststore_type = raw.pop("ssl.truststore.type", "PEM").upper()
    keystore_type = raw.pop("ssl.keystore.type", "PEM").upper()
    for kafka_name, value in raw.items():
        if kafka_name in refused:
            raise error(f"Option kafka.{kafka_name} is not supported: {refused[kafka_name]}")
        if kafka_name in _REFUSED_SECURITY_OPTIONS:
            fix = _REFUSED_SECURITY_OPTIONS[kafka_name]
            raise error(f"Option kafka.{kafka_name} is not supported: {fix}")
        if kafka_name == "ssl.truststore.location" and truststore_type != "PEM":
            raise error(
                "Option kafka.ssl.truststore.location needs a PEM file (kafka-python reads no"
                " JKS or PKCS12): convert it with keytool -exportcert -rfc -keystore"
                " truststore.jks -alias <ca> -file ca.pem, and set kafka.ssl.truststore.type=PEM"
            )
        if kafka_name == "ssl.keystore.location" and keystore_type != "PEM":
            raise error(
                "Option kafka.ssl.keystore.location needs a PEM file (kafka-python reads no"
                f" JKS or PKCS12): {_PEM_CONVERSION}"
            )
        if kafka_name in _PEM_FILE_OPTIONS and not _looks_like_pem(value):
            raise error(
                f"Option kafka.{kafka_name} names {value}, which holds no PEM block"
                f" (-----BEGIN): kafka-python reads PEM only; {_PEM_CONVERSION}"
            )
        if kafka_name == "ssl.endpoint.identification.algorithm":
            if value.strip().lower() not in ("https", ""):
                raise error(
                    f"Option kafka.{kafka_name} must be https (verify the brokers' host"
                    ' names) or "" (do not): other values would turn verification off'
                )
            params["ssl_check_hostname"] = value.strip().lower() == "https"
            continue
        kwarg = _RENAMED_KAFKA_OPTIONS.get(kafka_name, kafka_name.replace(".", "_"))
        if kwarg not in _defaults(client) or kwarg in _UNSETTABLE_KWARGS:
            raise error(
                f"Option kafka.{kafka_name} is not a {client} setting kafka-python supports:"
                f" remove it (see the kafka.* table in docs/connectors/{format_name}.md)"
            )
        params[kwarg] = kafka_value(kafka_name, kwarg, value, client, error)
    _refuse_ignored_security(params, provider_name is not None, error)
    params.update(_mechanism_params(params, provider_name, error))
    return tuple(sorted(params.items()))


_PEM_FILE_OPTIONS = frozenset(
    {"ssl.keystore.location", "ssl.truststore.location", "ssl.certfile", "ssl.cafile"}
)


def _looks_like_pem(path: str) -> bool:
    """False only for a readable file with no PEM block (a JKS or PKCS12 store); a file
    this process cannot read is left to the client (it may exist on executors only)."""
    try:
        with open(path.strip(), "rb") as file:
            return b"-----BEGIN" in file.read(1 << 16)
    except OSError:
        return True


_SASL_KWARGS = ("sasl_plain_username", "sasl_mechanism")
_TLS_KWARGS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password")


def _refuse_ignored_security(
    params: Mapping[str, Any], token_provider: bool, error: type[ValueError]
) -> None:
    """kafka-python silently ignores SASL settings unless the protocol is SASL_* and TLS
    files unless it is SSL or SASL_SSL: refuse them, so credentials are never dropped
    while the client connects in plain text."""
    protocol = str(params.get("security_protocol") or "PLAINTEXT").strip().upper()
    sasl = token_provider or any(kwarg in params for kwarg in _SASL_KWARGS)
    if sasl and not protocol.startswith("SASL_"):
        raise error(
            f"Option kafka.security.protocol is {protocol}, which uses no SASL settings:"
            " set it to SASL_SSL (or SASL_PLAINTEXT) or remove the kafka.sasl.* options"
        )
    if any(kwarg in params for kwarg in _TLS_KWARGS) and protocol not in ("SSL", "SASL_SSL"):
        raise error(
            f"Option kafka.security.protocol is {protocol}, which uses no TLS files: set it"
            " to SSL or SASL_SSL or remove the kafka.ssl.* file options"
        )


def _mechanism_params(
    params: Mapping[str, Any], provider_name: str | None, error: type[ValueError]
) -> dict[str, Any]:
    """The SASL mechanism's own settings (the token provider), after refusing a mechanism
    kafka-python cannot use here in one line with the way that works."""
    mechanism = str(params.get("sasl_mechanism") or "PLAIN").strip().upper()
    # kafka-python looks mechanisms up by their exact (upper-case) name.
    named = {"sasl_mechanism": mechanism} if "sasl_mechanism" in params else {}
    if mechanism == "AWS_MSK_IAM":
        raise error(f"Option kafka.sasl.mechanism AWS_MSK_IAM is not supported: {_MSK_IAM_FIX}")
    if mechanism == "GSSAPI" and importlib.util.find_spec("gssapi") is None:
        raise error(f"Option kafka.sasl.mechanism GSSAPI needs {_GSSAPI_NEEDS}")
    if mechanism == "OAUTHBEARER" and provider_name is None:
        raise error(
            "Option kafka.sasl.mechanism is OAUTHBEARER: set kafka.sasl.oauth.token.provider"
            " to module:function (a function returning the token; see"
            " docs/connectors/kafka-security.md)"
        )
    if provider_name is None:
        return named
    if mechanism != "OAUTHBEARER":
        raise error(
            f"Option kafka.{TOKEN_PROVIDER} needs kafka.sasl.mechanism=OAUTHBEARER (the"
            f" mechanism is {mechanism}): set it"
        )
    from ..errors import TokenProviderNameError
    from .token_provider import provider_for

    try:
        return {**named, "sasl_oauth_token_provider": provider_for(provider_name.strip())}
    except TokenProviderNameError as refused:
        raise error(str(refused)) from None


def kafka_value(
    kafka_name: str, kwarg: str, value: str, client: Client, error: type[ValueError]
) -> Any:
    """``value`` as the type kafka-python's default for ``kwarg`` has."""
    name = f"kafka.{kafka_name}"
    secret = kafka_name in SECRET_KAFKA_OPTIONS
    default = _defaults(client).get(kwarg)
    if kwarg in _ALWAYS_INT or (isinstance(default, int) and not isinstance(default, bool)):
        try:
            number = int(value.strip())
        except ValueError:
            number = -1
        if number < 0:
            raise option_error(error, name, value, "a non-negative integer", secret=secret)
        return number
    if isinstance(default, bool):
        if value.strip().lower() not in ("true", "false"):
            raise option_error(error, name, value, "true or false", secret=secret)
        return value.strip().lower() == "true"
    return value


_JAAS = re.compile(
    r"^\s*(?P<module>[\w.$]+)\s+(?:required|requisite|sufficient|optional)"
    r"(?P<pairs>(?:\s+\w+\s*=\s*(?:\"[^\"]*\"|[^\s;]+))*)\s*;?\s*$"
)
_JAAS_FIXES = {
    "OAuthBearerLoginModule": "set kafka.sasl.mechanism=OAUTHBEARER and name a token"
    " provider in kafka.sasl.oauth.token.provider instead",
    "Krb5LoginModule": "for GSSAPI, set kafka.sasl.kerberos.service.name and give each"
    " process a Kerberos ticket (kinit, or KRB5_CLIENT_KTNAME naming a keytab) instead",
}
_JAAS_PAIR = re.compile(r"(\w+)\s*=\s*(?:\"([^\"]*)\"|([^\s;]+))")


def parse_jaas(jaas: str, error: type[ValueError]) -> dict[str, str]:
    """Turn a PLAIN or SCRAM ``sasl.jaas.config`` into kafka-python's username/password."""
    match = _JAAS.match(jaas)
    module = match.group("module").rsplit(".", 1)[-1] if match else ""
    if module not in ("PlainLoginModule", "ScramLoginModule") or match is None:
        fix = _JAAS_FIXES.get(module, "other login modules are not supported")
        raise error(
            "Option kafka.sasl.jaas.config must be a PlainLoginModule or ScramLoginModule entry"
            f' with username="..." password="...": {fix}'
        )
    pairs = {key: quoted or bare for key, quoted, bare in _JAAS_PAIR.findall(match["pairs"])}
    if "username" not in pairs or "password" not in pairs:
        raise error('Option kafka.sasl.jaas.config needs both username="..." and password="..."')
    return {"sasl_plain_username": pairs["username"], "sasl_plain_password": pairs["password"]}
