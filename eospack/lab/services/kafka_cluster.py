"""Apache Kafka as production runs it, on one machine: several brokers, or a secured broker.

- ``ApacheKafkaCluster``: N KRaft nodes, each controller and broker (three by default: the
  quorum survives one node down), replication factor 3 and ``min.insync.replicas`` 2 for
  new topics and the internal topics (RF and ISR capped by N). Heap 450 MiB each.
- ``SecuredKafka``: one KRaft node whose client listener is SASL_SSL: SCRAM-SHA-512 users
  ``admin`` (a super user, also the inter-broker user) and ``app`` (granted only
  ``APP_GRANT``, the least privilege docs/connectors/*.md document), a CA and a broker
  certificate generated at start (SAN ``127.0.0.1`` and ``localhost``, so hostname
  verification passes), ``StandardAuthorizer``, and ``transaction.max.timeout.ms`` lowered
  to 300000 (below 2pc-kafka's default timeout, as teams set it). The controller listener
  is PLAINTEXT on loopback: the broker's own registration there is ``User:ANONYMOUS``, a
  super user; clients use the SASL_SSL listener only.
  Two more client listeners on the same broker (issue 37), so that one broker serves every
  security test: ``OAUTH`` (SASL_SSL with OAUTHBEARER and Kafka's unsecured JWT validator,
  which accepts unsigned tokens, ``alg: none``: ``unsecured_jwt(user)`` makes one; its
  ``sub`` is the principal) and ``MTLS`` (SSL requiring a client certificate the CA signed;
  ``CN=app`` is mapped to ``User:app``). Both reach the same users and grants.

Both are made of ``KafkaNode`` processes, each killable (SIGKILL, ``kill(node_id)``) and
restartable on the same ports and log directory (``start(node_id)``). Passwords are
random per start and never logged; ``client_options(user)`` gives a user's ``kafka.*``
options (the secret in ``sasl.jaas.config``), ``client_config(user)`` kafka-python's.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import secrets
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eospack.lab.services.apache_kafka import (
    LOG4J2_PROPERTIES,
    START_TIMEOUT_SECONDS,
    ApacheKafka,
    java_executable,
    new_cluster_id,
    node_is_unfenced,
)
from eospack.lab.services.base import (
    KafkaEndpoint,
    ServiceStartError,
    ensure_port_free,
    free_port,
    port_accepts_connections,
    remember_broker,
    wait_until_ready,
)
from eospack.lab.services.embedded import LOOPBACK, _ChildProcess
from eospack.lab.services.maven import resolve_classpath

CLUSTER_HEAP = "450m"
SECURED_TRANSACTION_MAX_TIMEOUT_MS = 300_000
"""The secured broker's ``transaction.max.timeout.ms``: below 2pc-kafka's default (900000),
as a team's broker may have it."""
ADMIN_USER = "admin"
APP_USER = "app"
APP_TOPIC_PREFIX = "app."
"""The application user's topics: its grant covers every topic whose name starts so."""
APP_TRANSACTIONAL_ID_PREFIX = "eospack-"
SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Grant:
    """One ACL: ``operations`` on resources of ``resource_type`` whose names start with
    ``prefix`` (a PREFIXED pattern), allowed to ``User:<user>``."""

    resource_type: str
    prefix: str
    operations: tuple[str, ...]


APP_GRANT = (
    Grant("TOPIC", APP_TOPIC_PREFIX, ("READ", "WRITE", "DESCRIBE", "CREATE")),
    Grant("TRANSACTIONAL_ID", APP_TRANSACTIONAL_ID_PREFIX, ("DESCRIBE", "WRITE")),
)
"""The least-privilege grant of the application user (docs/connectors/2pc-kafka.md and
replayable-kafka.md, 'Security / ACLs'): no cluster permission, no DESCRIBE_CONFIGS."""


class KafkaNode(ApacheKafka):
    """One KRaft node (controller and broker) of a cluster, its settings given: launched by
    ``launch``, ready once ``is_ready`` says so; ``kill``/``start`` as ``ApacheKafka``."""

    def __init__(
        self,
        name: str,
        node_id: int,
        settings: Mapping[str, str],
        is_ready: Callable[[KafkaNode], bool],
        heap: str,
    ) -> None:
        self.name = name
        self.node_id = node_id
        self.java = java_executable()
        self.classpath = resolve_classpath("kafka-broker")
        self.heap = heap
        self._is_ready = is_ready
        _ChildProcess.__init__(self)
        self.log_dir = self.workdir / "data"
        self.config_file = self.workdir / "server.properties"
        self.log4j_file = self.workdir / "log4j2.properties"
        self.config_file.write_text(
            "".join(
                f"{key}={value}\n"
                for key, value in {**settings, "log.dirs": str(self.log_dir)}.items()
            )
        )
        self.log4j_file.write_text(LOG4J2_PROPERTIES)

    def launch(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self._launch(self._java_command("kafka.Kafka", str(self.config_file), heap=self.heap))

    def wait_ready(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        wait_until_ready(
            self.name, lambda: self._is_ready(self), self._exit_code, self.log_file, timeout=timeout
        )

    def start(self) -> None:
        """Start (or restart after ``kill``) the node on the same ports and log directory."""
        self.launch()
        self.wait_ready()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class _Nodes:
    """What both clusters share: their nodes, killed and restarted one by one."""

    name = "kafka cluster (apache kafka)"
    nodes: dict[int, KafkaNode]
    endpoint: KafkaEndpoint

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id]

    def kill(self, node_id: int) -> None:
        """SIGKILL node ``node_id``, keeping its ports and log directory for ``start``."""
        self.nodes[node_id]._terminate(signal.SIGKILL)

    def start(self, node_id: int) -> None:
        """Restart node ``node_id`` (after ``kill``) and wait until it is an unfenced broker."""
        self.nodes[node_id].start()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _start_all(self) -> None:
        for node in self.nodes.values():
            node.launch()
        for node in self.nodes.values():
            node.wait_ready()


class ApacheKafkaCluster(_Nodes):
    """``brokers`` KRaft nodes on loopback, each controller and broker; see the module doc.

    ``endpoint.bootstrap_servers`` lists every node; ``nodes[node_id].port`` is one node's
    client port. ``leader(topic, partition)`` and ``transaction_coordinator(id)`` say which
    node serves what, for tests that kill a given one."""

    def __init__(self, brokers: int = 3, heap: str = CLUSTER_HEAP) -> None:
        if brokers < 1:
            raise ServiceStartError(f"{self.name} needs at least one broker, not {brokers}")
        self.name = f"kafka cluster of {brokers} (apache kafka)"
        ports = _free_ports(2 * brokers)
        client_ports = dict(zip(range(1, brokers + 1), ports[:brokers], strict=True))
        controller_ports = dict(zip(range(1, brokers + 1), ports[brokers:], strict=True))
        for port in ports:
            ensure_port_free(self.name, port)
        voters = ",".join(f"{i}@{LOOPBACK}:{controller_ports[i]}" for i in client_ports)
        replication = str(min(3, brokers))
        min_isr = str(min(2, brokers))
        self.nodes = {}
        try:
            for node_id, port in client_ports.items():
                settings = {
                    "process.roles": "broker,controller",
                    "node.id": str(node_id),
                    "controller.quorum.voters": voters,
                    "listeners": f"PLAINTEXT://{LOOPBACK}:{port},"
                    f"CONTROLLER://{LOOPBACK}:{controller_ports[node_id]}",
                    "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{port}",
                    "controller.listener.names": "CONTROLLER",
                    "inter.broker.listener.name": "PLAINTEXT",
                    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "num.partitions": "1",
                    "default.replication.factor": replication,
                    "min.insync.replicas": min_isr,
                    "offsets.topic.replication.factor": replication,
                    "offsets.topic.num.partitions": "4",
                    "transaction.state.log.replication.factor": replication,
                    "transaction.state.log.min.isr": min_isr,
                    "transaction.state.log.num.partitions": "4",
                    "share.coordinator.state.topic.replication.factor": replication,
                    "share.coordinator.state.topic.min.isr": min_isr,
                    "group.initial.rebalance.delay.ms": "0",
                    "broker.heartbeat.interval.ms": "500",
                    "broker.session.timeout.ms": "3000",
                    "log.initial.task.delay.ms": "1000",
                    "log.cleaner.backoff.ms": "1000",
                }
                self.nodes[node_id] = KafkaNode(
                    f"kafka node {node_id} of {brokers} (apache kafka)",
                    node_id,
                    settings,
                    lambda node: (
                        port_accepts_connections(LOOPBACK, node.port)
                        and node_is_unfenced(f"{LOOPBACK}:{node.port}", node.node_id, {})
                    ),
                    heap,
                )
                self.nodes[node_id].port = port
            cluster_id = new_cluster_id()
            for node in self.nodes.values():
                node.format_storage(cluster_id)
            self._start_all()
        except BaseException:
            self.stop()
            raise
        servers = ",".join(f"{LOOPBACK}:{port}" for port in client_ports.values())
        self.endpoint = KafkaEndpoint(bootstrap_servers=servers, kind="kafka")
        remember_broker(self.endpoint)

    def _ask(self, question: Callable[[Any], Any], timeout: float = 30.0) -> Any:
        """``question(admin)`` with a fresh admin client, asked again while a node is down
        (a client may pick the dead one first) for at most ``timeout`` seconds."""
        from kafka import KafkaAdminClient
        from kafka import errors as kafka_errors

        deadline = time.monotonic() + timeout
        while True:
            try:
                admin = KafkaAdminClient(
                    bootstrap_servers=self.endpoint.bootstrap_servers, request_timeout_ms=5_000
                )
                try:
                    return question(admin)
                finally:
                    admin.close()
            except kafka_errors.KafkaError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node that leads ``topic``-``partition`` now (fresh metadata; -1: none)."""
        described = self._ask(lambda admin: admin.describe_topics([topic]))
        for entry in described[0]["partitions"]:
            if entry["partition_index"] == partition:
                return int(entry["leader_id"])
        raise KeyError(f"{topic}-{partition}")

    def in_sync_replicas(self, topic: str, partition: int = 0) -> list[int]:
        """The nodes in sync for ``topic``-``partition`` now, sorted."""
        described = self._ask(lambda admin: admin.describe_topics([topic]))
        for entry in described[0]["partitions"]:
            if entry["partition_index"] == partition:
                return sorted(int(node) for node in entry["isr_nodes"])
        raise KeyError(f"{topic}-{partition}")

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node that coordinates ``transactional_id``'s transactions now."""
        from kafka.protocol.metadata import CoordinatorType

        return int(
            self._ask(
                lambda admin: admin._manager.run(
                    admin._find_coordinator_id, transactional_id, CoordinatorType.TRANSACTION
                )
            )
        )


# The secured broker -----------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA (what clients trust), the broker's key and chain, and client
    certificates for the MTLS listener: ``app``'s (signed by the CA) as one file with key
    and chain (``app_keystore``, Java's PEM keystore) and as separate certificate and key
    files (kafka-python's ``ssl_certfile``/``ssl_keyfile``), and a stranger's, signed by
    a CA the broker does not trust (a wrong client certificate)."""

    ca_file: Path
    broker_keystore: Path
    app_keystore: Path
    app_certificate: Path
    app_key: Path
    stranger_keystore: Path


def generate_certificates(directory: Path) -> Certificates:
    """A CA and a broker certificate it signs, valid for ``127.0.0.1`` and ``localhost``
    (subjectAltName), for a day; the broker's keystore is its PKCS#8 key and chain in PEM.
    Also client certificates (``Certificates``): ``CN=app`` signed by the CA, and
    ``CN=app`` signed by another CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "eospack test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    broker = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(pem))
    keystore = directory / "broker-keystore.pem"
    keystore.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + broker.public_bytes(pem)
        + ca.public_bytes(pem)
    )
    keystore.chmod(0o600)

    def client_certificate(issuer: x509.Name, issuer_key: Any) -> tuple[bytes, bytes]:
        client_key = ec.generate_private_key(ec.SECP256R1())
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, APP_USER)]))
            .issuer_name(issuer)
            .public_key(client_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0])
            .not_valid_after(valid[1])
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(issuer_key, hashes.SHA256())
        )
        key_pem = client_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return key_pem, certificate.public_bytes(pem)

    files: dict[str, Path] = {}

    def write(name: str, content: bytes) -> Path:
        path = directory / name
        path.touch(mode=0o600)
        path.write_bytes(content)
        files[name] = path
        return path

    app_key, app_certificate = client_certificate(ca_name, ca_key)
    stranger_ca_key = ec.generate_private_key(ec.SECP256R1())
    stranger_ca = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a CA nobody trusts")])
    stranger_key, stranger_certificate = client_certificate(stranger_ca, stranger_ca_key)
    return Certificates(
        ca_file,
        keystore,
        app_keystore=write("app-keystore.pem", app_key + app_certificate),
        app_certificate=write("app-certificate.pem", app_certificate),
        app_key=write("app-key.pem", app_key),
        stranger_keystore=write("stranger-keystore.pem", stranger_key + stranger_certificate),
    )


def unsecured_jwt(subject: str, lifetime_seconds: int = 3600) -> str:
    """An unsigned JWT (``alg: none``) for ``subject``, as Kafka's unsecured OAUTHBEARER
    validator (the ``OAUTH`` listener) accepts it: ``sub``, ``iat`` and ``exp`` claims."""

    def part(claims: Mapping[str, Any]) -> str:
        text = json.dumps(claims, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(text).rstrip(b"=").decode()

    now = int(time.time())
    return (
        f"{part({'alg': 'none'})}."
        f"{part({'sub': subject, 'iat': now, 'exp': now + lifetime_seconds})}."
    )


class SecuredKafka(_Nodes):
    """One KRaft node with a SASL_SSL client listener; see the module doc.

    ``endpoint.bootstrap_servers`` is the SASL_SSL listener; ``client_options(user)`` the
    ``kafka.*`` options of ``admin`` or ``app`` (``password=`` overrides, for a wrong one)."""

    def __init__(
        self,
        heap: str = "512m",
        transaction_max_timeout_ms: int = SECURED_TRANSACTION_MAX_TIMEOUT_MS,
    ) -> None:
        self.heap = heap
        self.transaction_max_timeout_ms = transaction_max_timeout_ms
        self.name = "secured kafka broker (apache kafka, SASL_SSL)"
        self.passwords = {
            ADMIN_USER: secrets.token_urlsafe(18),
            APP_USER: secrets.token_urlsafe(18),
        }
        port, controller_port, oauth_port, mtls_port = _free_ports(4)
        self.port = port
        self.oauth_bootstrap_servers = f"{LOOPBACK}:{oauth_port}"
        self.mtls_bootstrap_servers = f"{LOOPBACK}:{mtls_port}"
        admin_jaas = _scram_jaas(ADMIN_USER, self.passwords[ADMIN_USER])
        self.nodes = {}
        try:
            node = KafkaNode(self.name, 1, {}, lambda node: self._ready(), self.heap)
            node.port = port
            self.nodes[1] = node
            self.certificates = generate_certificates(node.workdir)
            settings = {
                "process.roles": "broker,controller",
                "node.id": "1",
                "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{controller_port}",
                "listeners": f"SASL_SSL://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port},"
                f"OAUTH://{LOOPBACK}:{oauth_port},MTLS://{LOOPBACK}:{mtls_port}",
                "advertised.listeners": f"SASL_SSL://{LOOPBACK}:{port},"
                f"OAUTH://{LOOPBACK}:{oauth_port},MTLS://{LOOPBACK}:{mtls_port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "SASL_SSL",
                "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT,"
                "OAUTH:SASL_SSL,MTLS:SSL",
                # OAUTHBEARER with no server callback handler: Kafka's unsecured validator.
                "listener.name.oauth.sasl.enabled.mechanisms": "OAUTHBEARER",
                "listener.name.oauth.oauthbearer.sasl.jaas.config": (
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
                    f' required unsecuredLoginStringClaim_sub="{ADMIN_USER}";'
                ),
                "listener.name.mtls.ssl.client.auth": "required",
                "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
                "sasl.enabled.mechanisms": SCRAM_MECHANISM,
                "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": admin_jaas,
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.certificates.broker_keystore),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.certificates.ca_file),
                "ssl.endpoint.identification.algorithm": "https",
                "ssl.client.auth": "none",
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": f"User:{ADMIN_USER};User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "false",
                "transaction.max.timeout.ms": str(self.transaction_max_timeout_ms),
                "num.partitions": "1",
                "offsets.topic.replication.factor": "1",
                "offsets.topic.num.partitions": "4",
                "transaction.state.log.replication.factor": "1",
                "transaction.state.log.min.isr": "1",
                "transaction.state.log.num.partitions": "4",
                "share.coordinator.state.topic.replication.factor": "1",
                "share.coordinator.state.topic.min.isr": "1",
                "group.initial.rebalance.delay.ms": "0",
                "broker.heartbeat.interval.ms": "500",
                "broker.session.timeout.ms": "3000",
                "log.initial.task.delay.ms": "1000",
                "log.cleaner.backoff.ms": "1000",
            }
            node.config_file.write_text(
                "".join(
                    f"{k}={v}\n" for k, v in {**settings, "log.dirs": str(node.log_dir)}.items()
                )
            )
            node.config_file.chmod(0o600)
            scram = [
                argument
                for user, password in self.passwords.items()
                for argument in (
                    "--add-scram",
                    f"{SCRAM_MECHANISM}=[name={user},password={password}]",
                )
            ]
            node.format_storage(new_cluster_id(), "--standalone", *scram)
            self.endpoint = KafkaEndpoint(bootstrap_servers=f"{LOOPBACK}:{port}", kind="kafka")
            self._start_all()
            self.grant(APP_USER, APP_GRANT)
        except BaseException:
            self.stop()
            raise
        remember_broker(self.endpoint)

    def _ready(self) -> bool:
        return port_accepts_connections(LOOPBACK, self.port) and node_is_unfenced(
            self.endpoint.bootstrap_servers, 1, self.client_config(ADMIN_USER)
        )

    def client_options(self, user: str = APP_USER, password: str | None = None) -> dict[str, str]:
        """``user``'s ``kafka.*`` options for replayable-kafka and 2pc-kafka (bootstrap
        servers included); ``password`` replaces the real one (a test of a wrong one)."""
        secret = self.passwords[user] if password is None else password
        return {
            "kafka.bootstrap.servers": self.endpoint.bootstrap_servers,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": SCRAM_MECHANISM,
            "kafka.sasl.jaas.config": _scram_jaas(user, secret),
            "kafka.ssl.truststore.location": str(self.certificates.ca_file),
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.endpoint.identification.algorithm": "https",
        }

    def oauth_options(self, token_provider: str) -> dict[str, str]:
        """``kafka.*`` options for the ``OAUTH`` listener with ``token_provider``
        (``module:function``) as ``kafka.sasl.oauth.token.provider``."""
        return {
            "kafka.bootstrap.servers": self.oauth_bootstrap_servers,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "OAUTHBEARER",
            "kafka.sasl.oauth.token.provider": token_provider,
            "kafka.ssl.truststore.location": str(self.certificates.ca_file),
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.endpoint.identification.algorithm": "https",
        }

    def mtls_options(self, keystore: Path | None = None) -> dict[str, str]:
        """``kafka.*`` options for the ``MTLS`` listener, Java's names: ``keystore`` (key
        and chain in one PEM file; ``app``'s by default) and the CA as truststore."""
        return {
            "kafka.bootstrap.servers": self.mtls_bootstrap_servers,
            "kafka.security.protocol": "SSL",
            "kafka.ssl.keystore.location": str(keystore or self.certificates.app_keystore),
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.truststore.location": str(self.certificates.ca_file),
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.endpoint.identification.algorithm": "https",
        }

    def write_client_properties(self, user: str = APP_USER) -> Path:
        """``user``'s client settings as a properties file (mode 600) in the broker's work
        directory: ``security.protocol``, ``sasl.*``, ``ssl.*``, as Kafka's tools and
        ``eospack checkpoint inspect --kafka-command-config`` read them."""
        path = self.nodes[1].workdir / f"client-{user}.properties"
        options = self.client_options(user)
        options.pop("kafka.bootstrap.servers")
        path.touch(mode=0o600)
        path.write_text(
            "".join(f"{key.removeprefix('kafka.')}={value}\n" for key, value in options.items())
        )
        return path

    def client_config(self, user: str = APP_USER, password: str | None = None) -> dict[str, Any]:
        """kafka-python's settings for ``user`` (without ``bootstrap_servers``)."""
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": SCRAM_MECHANISM,
            "sasl_plain_username": user,
            "sasl_plain_password": self.passwords[user] if password is None else password,
            "ssl_cafile": str(self.certificates.ca_file),
            "ssl_check_hostname": True,
        }

    def admin_client(self, user: str = ADMIN_USER) -> Any:
        from kafka import KafkaAdminClient

        return KafkaAdminClient(
            bootstrap_servers=self.endpoint.bootstrap_servers,
            request_timeout_ms=10_000,
            **self.client_config(user),
        )

    def grant(self, user: str, grants: tuple[Grant, ...]) -> None:
        """Allow ``user`` each of ``grants`` (CreateAcls, as the super user), and wait
        until the authorizer shows them."""
        from kafka.admin import (
            ACL,
            ACLFilter,
            ACLOperation,
            ACLPermissionType,
            ACLResourcePatternType,
            ResourcePattern,
            ResourcePatternFilter,
            ResourceType,
        )

        acls = [
            ACL(
                principal=f"User:{user}",
                host="*",
                operation=ACLOperation[operation],
                permission_type=ACLPermissionType.ALLOW,
                resource_pattern=ResourcePattern(
                    ResourceType[grant.resource_type], grant.prefix, ACLResourcePatternType.PREFIXED
                ),
            )
            for grant in grants
            for operation in grant.operations
        ]
        admin = self.admin_client()
        try:
            result = admin.create_acls(acls)
            if result.get("failed"):
                raise ServiceStartError(f"{self.name} could not create ACLs: {result['failed']}")
            wanted = ACLFilter(
                principal=f"User:{user}",
                host="*",
                operation=ACLOperation.ANY,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(
                    ResourceType.ANY, None, ACLResourcePatternType.ANY
                ),
            )
            deadline = time.monotonic() + 30
            while len(admin.describe_acls(wanted)[0]) < len(acls):
                if time.monotonic() > deadline:
                    raise ServiceStartError(f"{self.name}: the ACLs of {user} did not show")
                time.sleep(0.1)
        finally:
            admin.close()


def _scram_jaas(user: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required"
        f' username="{user}" password="{password}";'
    )


# eospack services up --kafka-brokers N / --kafka-security sasl_ssl ------------------

KAFKA_SECURITY_CHOICES = ("none", "sasl_ssl")


def start_production_kafka(brokers: int = 1, security: str = "none") -> Any:
    """The broker ``eospack services up`` starts for ``--kafka-brokers`` and
    ``--kafka-security``: a cluster of ``brokers`` nodes, or the SASL_SSL broker (one node;
    both at once are refused). Its ``settings_lines()`` say how to connect."""
    if security not in KAFKA_SECURITY_CHOICES:
        raise ServiceStartError(
            f"--kafka-security {security!r} is not known: use {' or '.join(KAFKA_SECURITY_CHOICES)}"
        )
    if security == "sasl_ssl":
        if brokers != 1:
            raise ServiceStartError(
                "--kafka-security sasl_ssl runs one broker: leave --kafka-brokers out"
                " (a secured cluster of several brokers is not there yet)"
            )
        return SecuredKafka()
    return ApacheKafkaCluster(brokers=brokers)


def settings_lines(kafka: Any) -> list[str]:
    """What ``eospack services up`` prints for a broker ``start_production_kafka`` made."""
    if isinstance(kafka, SecuredKafka):
        return secured_settings_lines(kafka)
    return cluster_settings_lines(kafka)


def cluster_settings_lines(cluster: ApacheKafkaCluster) -> list[str]:
    nodes = ", ".join(f"node {i} on {LOOPBACK}:{n.port}" for i, n in cluster.nodes.items())
    return [
        f"kafka.bootstrap.servers  {cluster.endpoint.bootstrap_servers}",
        f"kafka nodes              {nodes}  (RF {min(3, len(cluster.nodes))}, min ISR"
        f" {min(2, len(cluster.nodes))} for new topics)",
    ]


def secured_settings_lines(broker: SecuredKafka) -> list[str]:
    """Where to connect and which files hold the users' settings: the passwords are only
    in those files (mode 600), never printed."""
    files = {user: broker.write_client_properties(user) for user in (APP_USER, ADMIN_USER)}
    return [
        f"kafka.bootstrap.servers  {broker.endpoint.bootstrap_servers}  (SASL_SSL,"
        f" {SCRAM_MECHANISM}, TLS checked against {broker.certificates.ca_file})",
        f"kafka app user           {files[APP_USER]}  (kafka.* settings of user {APP_USER}:"
        f" topics {APP_TOPIC_PREFIX}*, transactional ids {APP_TRANSACTIONAL_ID_PREFIX}*;"
        " a properties file as --kafka-command-config takes)",
        f"kafka admin user         {files[ADMIN_USER]}  (super user)",
        f"kafka oauth listener     {broker.oauth_bootstrap_servers}  (SASL_SSL, OAUTHBEARER;"
        " Kafka's unsecured validator: an unsigned JWT whose sub is the user, see"
        " docs/connectors/kafka-security.md)",
        f"kafka mtls listener      {broker.mtls_bootstrap_servers}  (SSL; client certificate"
        f" {broker.certificates.app_keystore} is User:{APP_USER})",
    ]
