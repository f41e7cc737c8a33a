"""Token providers for the OAUTHBEARER tests (``test_kafka_oauth_mtls.py``), named by
``kafka.sasl.oauth.token.provider=integration_tests.ops.oauth_token_parts:<function>``.

A module of the repository, not a file the test ships with ``SparkContext.addPyFile``:
Spark's Python workers start in the repository (``python -m pyspark.daemon``, so its
folder is on their ``sys.path``) and import it as the driver does, as a user's provider
installed in the environment would be. A file added with ``addPyFile`` reached the batch
planners and the executors, but not the streaming source's planner process (local mode,
pyspark 4.3): the docs tell users to install the provider's module instead.
"""

from __future__ import annotations

from pyspark import TaskContext

from eospack.lab.services.kafka_cluster import unsecured_jwt


def app_token() -> str:
    """A token of user ``app`` (the least-privilege grant) for the OAUTH listener."""
    return unsecured_jwt("app")


def failing() -> str:
    raise RuntimeError("the identity provider is down")


def failing_on_executors() -> str:
    """A token on the driver and in Spark's planner processes; an error inside a task."""
    if TaskContext.get() is not None:
        raise RuntimeError("no credentials on this executor")
    return unsecured_jwt("app")


def refused_on_executors() -> str:
    """A token on the driver; inside a task, one the listener refuses (no JWT)."""
    if TaskContext.get() is not None:
        return "not-a-jwt"
    return unsecured_jwt("app")
