"""``kafka.*`` security options of both Kafka connectors (issue 37): OAUTHBEARER with a
token provider named by ``kafka.sasl.oauth.token.provider``, mTLS with PEM files, and the
one-line refusals of what kafka-python cannot do here (JKS/PKCS12 stores, AWS_MSK_IAM,
GSSAPI without the ``gssapi`` package, Java-only login modules)."""

from __future__ import annotations

import pickle
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eospack.connectors.kafka.errors import (
    KafkaAuthenticationError,
    KafkaSinkOptionError,
    KafkaSourceOptionError,
)
from eospack.connectors.kafka.sink.options import parse_options as parse_sink_options
from eospack.connectors.kafka.source.options import parse_options as parse_source_options

TOKEN = "header.payload-" + uuid.uuid4().hex + ".signature"
PROVIDERS = """
from kafka.net.sasl.oauth import AbstractTokenProvider

TOKEN = {token!r}


def token_function():
    return TOKEN


def signer_pair():
    return (TOKEN, 1700000000000)


class Provider(AbstractTokenProvider):
    def token(self):
        return TOKEN

    def extensions(self):
        return {{"logicalCluster": "lkc-1"}}


class DuckProvider:
    def token(self):
        return TOKEN


class NeedsRegion(AbstractTokenProvider):
    def __init__(self, region):
        self.region = region

    def token(self):
        return TOKEN


INSTANCE = Provider()
NOT_A_PROVIDER = 42


def raises():
    raise RuntimeError("the identity provider is down")


def returns_nothing():
    return None
"""


@pytest.fixture
def providers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a fresh module of token providers, importable in this process."""
    name = f"token_providers_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(PROVIDERS.format(token=TOKEN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def source(**kafka: str) -> Any:
    options = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}
    options.update({f"kafka.{key.replace('_', '.')}": value for key, value in kafka.items()})
    return parse_source_options(options)


def sink(**kafka: str) -> Any:
    options = {"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "t"}
    options.update({f"kafka.{key.replace('_', '.')}": value for key, value in kafka.items()})
    return parse_sink_options(options)


def oauth(path: str) -> dict[str, str]:
    return {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "OAUTHBEARER",
        "sasl_oauth_token_provider": path,
    }


@pytest.mark.parametrize(
    "attribute", ["token_function", "signer_pair", "Provider", "DuckProvider", "INSTANCE"]
)
def test_a_named_token_provider_becomes_kafka_pythons_provider_on_both_formats(
    providers: str, attribute: str
) -> None:
    from kafka.net.sasl.oauth import AbstractTokenProvider

    for config in (
        source(**oauth(f"{providers}:{attribute}")).consumer_config(),
        sink(**oauth(f"{providers}:{attribute}")).producer_config(),
    ):
        provider = config["sasl_oauth_token_provider"]
        assert isinstance(provider, AbstractTokenProvider)
        assert provider.token() == TOKEN
        assert config["sasl_mechanism"] == "OAUTHBEARER"


def test_the_provider_pickles_as_its_path_and_never_shows_the_token(providers: str) -> None:
    """Options travel to executors pickled: the provider travels as its path and is
    imported there again; the token is in no repr, describe() or pickle."""
    options = sink(**oauth(f"{providers}:Provider"))
    provider = dict(options.producer_params)["sasl_oauth_token_provider"]
    shipped = pickle.dumps(options)
    assert TOKEN.encode() not in shipped
    assert pickle.loads(shipped) == options
    assert provider.extensions() == {"logicalCluster": "lkc-1"}
    for text in (repr(options), options.describe(), repr(source(**oauth(f"{providers}:Provider")))):
        assert TOKEN not in text
    assert repr(provider) == f"TokenProvider(kafka.sasl.oauth.token.provider={providers}:Provider)"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "no_such_module_{unique}:token",
            "Option kafka.sasl.oauth.token.provider names no_such_module_{unique}:token, which"
            " cannot be imported (ModuleNotFoundError: No module named"
            " 'no_such_module_{unique}'): install the module on the driver and every executor"
            " (e.g. spark.submit.pyFiles or SparkContext.addPyFile)",
        ),
        (
            "{providers}:missing",
            "Option kafka.sasl.oauth.token.provider names {providers}:missing, which"
            " cannot be imported (AttributeError: module '{providers}' has no attribute"
            " 'missing'): install the module on the driver and every executor (e.g."
            " spark.submit.pyFiles or SparkContext.addPyFile)",
        ),
        (
            "{providers}",
            "Option kafka.sasl.oauth.token.provider is '{providers}': use module:function or"
            " module:Class (a kafka-python AbstractTokenProvider, an object with a token()"
            " method, or a function returning the token)",
        ),
        (
            "{providers}:NeedsRegion",
            "Option kafka.sasl.oauth.token.provider names the class {providers}:NeedsRegion,"
            " which cannot be built without arguments (TypeError: NeedsRegion.__init__()"
            " missing 1 required positional argument: 'region'): name a function that builds"
            " it with its arguments instead",
        ),
        (
            "{providers}:NOT_A_PROVIDER",
            "Option kafka.sasl.oauth.token.provider names {providers}:NOT_A_PROVIDER, an int:"
            " use module:function or module:Class (a kafka-python AbstractTokenProvider, an"
            " object with a token() method, or a function returning the token)",
        ),
    ],
)
def test_a_provider_that_cannot_be_used_is_one_line_naming_the_option(
    providers: str, path: str, message: str
) -> None:
    unique = uuid.uuid4().hex[:6]
    path = path.format(providers=providers, unique=unique)
    expected = message.format(providers=providers, unique=unique)
    with pytest.raises(KafkaSourceOptionError) as raised:
        source(**oauth(path))
    assert str(raised.value) == expected
    with pytest.raises(KafkaSinkOptionError) as raised_by_sink:
        sink(**oauth(path))
    assert str(raised_by_sink.value) == expected


@pytest.mark.parametrize(
    ("attribute", "why"),
    [
        ("raises", "RuntimeError: the identity provider is down"),
        ("returns_nothing", "it returned NoneType, not a token string"),
    ],
)
def test_a_provider_that_fails_is_an_authentication_error_at_parse(
    providers: str, attribute: str, why: str
) -> None:
    """The provider is asked for a token once when the options are parsed (query start),
    so a broken one fails the query before any data moves."""
    with pytest.raises(KafkaAuthenticationError) as raised:
        sink(**oauth(f"{providers}:{attribute}"))
    assert str(raised.value) == (
        f"The token provider {providers}:{attribute} (option"
        f" kafka.sasl.oauth.token.provider) gave no token ({why}): fix the provider;"
        " it runs on the driver and on every executor"
    )


def test_oauthbearer_needs_a_provider_and_a_provider_needs_oauthbearer(providers: str) -> None:
    with pytest.raises(KafkaSourceOptionError, match="^Option kafka.sasl.mechanism is OAUTHBEAR"):
        source(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER")
    with pytest.raises(KafkaSinkOptionError) as raised:
        sink(sasl_oauth_token_provider=f"{providers}:Provider", security_protocol="SASL_SSL")
    assert str(raised.value) == (
        "Option kafka.sasl.oauth.token.provider needs kafka.sasl.mechanism=OAUTHBEARER"
        " (the mechanism is PLAIN): set it"
    )


def test_aws_msk_iam_as_a_mechanism_points_to_oauthbearer_with_the_signer() -> None:
    with pytest.raises(KafkaSinkOptionError) as raised:
        sink(security_protocol="SASL_SSL", sasl_mechanism="AWS_MSK_IAM")
    assert str(raised.value) == (
        "Option kafka.sasl.mechanism AWS_MSK_IAM is not supported: use OAUTHBEARER with"
        " kafka.sasl.oauth.token.provider naming a function that returns"
        " MSKAuthTokenProvider.generate_auth_token(region) (package"
        " aws-msk-iam-sasl-signer-python; see docs/connectors/kafka-security.md)"
    )


def test_gssapi_without_the_gssapi_package_is_refused_saying_what_to_install() -> None:
    pytest.importorskip("kafka")
    if _has_gssapi():
        pytest.skip("the gssapi package is installed here: GSSAPI is accepted")
    with pytest.raises(KafkaSourceOptionError) as raised:
        source(security_protocol="SASL_PLAINTEXT", sasl_mechanism="GSSAPI")
    assert str(raised.value) == (
        "Option kafka.sasl.mechanism GSSAPI needs the Python package gssapi on the driver and"
        " every executor (pip install gssapi, which builds against MIT Kerberos: Debian's"
        " libkrb5-dev) and a Kerberos ticket in each process (kinit, or KRB5_CLIENT_KTNAME"
        " naming a keytab)"
    )


def _has_gssapi() -> bool:
    import importlib.util

    return importlib.util.find_spec("gssapi") is not None


@pytest.mark.parametrize(
    ("module", "fix"),
    [
        (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
            "set kafka.sasl.mechanism=OAUTHBEARER and name a token provider in"
            " kafka.sasl.oauth.token.provider instead",
        ),
        (
            "com.sun.security.auth.module.Krb5LoginModule",
            "for GSSAPI, set kafka.sasl.kerberos.service.name and give each process a"
            " Kerberos ticket (kinit, or KRB5_CLIENT_KTNAME naming a keytab) instead",
        ),
    ],
)
def test_java_only_login_modules_name_the_python_way(module: str, fix: str) -> None:
    with pytest.raises(KafkaSinkOptionError) as raised:
        sink(sasl_jaas_config=f'{module} required secret="s3cr3t";')
    assert str(raised.value) == (
        "Option kafka.sasl.jaas.config must be a PlainLoginModule or ScramLoginModule entry"
        f' with username="..." password="...": {fix}'
    )
    assert "s3cr3t" not in str(raised.value)


def test_mtls_takes_pem_files_under_java_and_kafka_python_names() -> None:
    java = sink(
        security_protocol="SSL",
        ssl_keystore_location="/pem/client.pem",
        ssl_keystore_type="PEM",
        ssl_key_password="secret",
        ssl_truststore_location="/pem/ca.pem",
        ssl_truststore_type="PEM",
    ).producer_config()
    python = sink(
        security_protocol="SSL",
        ssl_certfile="/pem/client.pem",
        ssl_keyfile="/pem/client.key",
        ssl_password="secret",
        ssl_cafile="/pem/ca.pem",
    ).producer_config()
    assert {k: java[k] for k in ("ssl_certfile", "ssl_password", "ssl_cafile")} == {
        "ssl_certfile": "/pem/client.pem",
        "ssl_password": "secret",
        "ssl_cafile": "/pem/ca.pem",
    }
    assert python["ssl_keyfile"] == "/pem/client.key"
    assert "secret" not in repr(sink(security_protocol="SSL", ssl_password="secret"))


def test_a_jks_keystore_is_refused_with_the_commands_that_convert_it() -> None:
    with pytest.raises(KafkaSourceOptionError) as raised:
        source(ssl_keystore_location="/jks/client.jks", ssl_keystore_type="JKS")
    assert str(raised.value) == (
        "Option kafka.ssl.keystore.location needs a PEM file (kafka-python reads no JKS or"
        " PKCS12): convert it with keytool -importkeystore -srckeystore client.jks"
        " -destkeystore client.p12 -deststoretype PKCS12, then openssl pkcs12 -in client.p12"
        " -out client.pem (key and chain in one file; its passphrase goes in"
        " kafka.ssl.key.password), and set kafka.ssl.keystore.type=PEM"
    )
    with pytest.raises(KafkaSinkOptionError) as store_password:
        sink(ssl_keystore_password="changeit")
    assert str(store_password.value) == (
        "Option kafka.ssl.keystore.password is not supported: PEM files have no store"
        " password; an encrypted key's passphrase goes in kafka.ssl.key.password"
    )
