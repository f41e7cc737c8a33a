"""What the checkpoint-on-object-storage tests share: the S3A settings that make the tests'
S3 endpoint (moto) a Hadoop ``s3a://`` file system, for the shared session and for driver
subprocesses.

Credentials never travel as arguments: the shared session gets them in its Hadoop
configuration, a driver subprocess in ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
(S3A's default credential chain reads them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def s3a_settings(endpoint_url: str, region: str) -> dict[str, str]:
    """Hadoop settings (without the ``spark.hadoop.`` prefix) for S3A against a local S3
    endpoint: path-style addressing, plain HTTP, no credentials."""
    return {
        "fs.s3a.endpoint": endpoint_url,
        "fs.s3a.endpoint.region": region,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.change.detection.version.required": "false",
    }


def credential_environment(endpoint: Any) -> dict[str, str]:
    """The environment a driver subprocess reads the endpoint's credentials from."""
    return {
        "AWS_ACCESS_KEY_ID": endpoint.access_key_id,
        "AWS_SECRET_ACCESS_KEY": endpoint.secret_access_key,
        "AWS_REGION": endpoint.region,
    }


def configure_session(spark: Any, endpoint: Any) -> None:
    """Point the running session's ``s3a://`` at ``endpoint`` (its Hadoop configuration,
    which every later query and eospack's checkpoint reads start from)."""
    configuration = spark._jsc.hadoopConfiguration()
    settings: Mapping[str, str] = {
        **s3a_settings(endpoint.endpoint_url, endpoint.region),
        "fs.s3a.access.key": endpoint.access_key_id,
        "fs.s3a.secret.key": endpoint.secret_access_key,
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }
    for key, value in settings.items():
        configuration.set(key, value)


def object_keys(endpoint: Any, prefix: str) -> dict[str, int]:
    """Key -> size of every object under ``prefix`` (read with boto3: the tests' view)."""
    client = endpoint.client()
    found: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=endpoint.bucket, Prefix=prefix
    ):
        found.update({item["Key"]: item["Size"] for item in page.get("Contents", [])})
    return found


def open_multipart_uploads(endpoint: Any, prefix: str) -> list[str]:
    client = endpoint.client()
    uploads = client.list_multipart_uploads(Bucket=endpoint.bucket, Prefix=prefix)
    return [upload["Key"] for upload in uploads.get("Uploads", [])]
