"""Spark's own JDBC writer as the oracle of what 2pc-jdbc stores (the PostgreSQL JDBC
driver binds doubles and floats as float8 / float4 parameters, decimals as numeric,
arrays as typed array parameters, and the server casts them to the column's type):
shared by the float-rounding tests and their adversarial review."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest


def spark_jdbc_writer(spark: Any) -> dict[str, str]:
    """The PostgreSQL JDBC driver (the ``postgresql-jdbc`` jar set, fetched with mvn once)
    added to the shared session with ``ADD JAR``; skips when the jars are neither cached
    nor fetchable. Returns the writer's extra properties."""
    from eospack.lab.services import ServiceStartError
    from eospack.lab.services.maven import is_cached, mvn_executable, resolve_classpath

    if not is_cached("postgresql-jdbc") and mvn_executable() is None:
        pytest.skip("needs the PostgreSQL JDBC driver: not cached and mvn was not found")
    try:
        jars = resolve_classpath("postgresql-jdbc")
    except ServiceStartError as error:
        pytest.skip(f"needs the PostgreSQL JDBC driver: {error}")
    for jar in jars:
        spark.sql(f"ADD JAR '{jar}'")
    return {"driver": "org.postgresql.Driver"}


def oracle_properties(endpoint: Any, writer: dict[str, str]) -> dict[str, str]:
    properties = {"user": endpoint.user, **writer}
    if endpoint.password:
        properties["password"] = endpoint.password
    return properties


def sink_options(endpoint: Any, table: str, protocol: str = "prepared") -> dict[str, str]:
    options = {
        "url": endpoint.jdbc_url,
        "user": endpoint.user,
        "dbtable": table,
        "protocol": protocol,
    }
    if endpoint.password:
        options["password"] = endpoint.password
    return options


def seed_from_environment() -> int:
    """A random seed, printed (``EOSPACK_FLOAT_SEED`` replays it)."""
    seed = int(os.environ.get("EOSPACK_FLOAT_SEED") or random.SystemRandom().randrange(2**32))
    print(f"EOSPACK_FLOAT_SEED={seed}")
    return seed
