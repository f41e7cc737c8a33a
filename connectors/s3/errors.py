"""One exception class per way 2pc-s3 (the sink and its reader) can fail.

Every message is one line naming the option, path or object at fault and what to do.
None carries a secret: credentials are kept out of options' reprs, and S3 errors are
described by their error code only (``client.describe_error``).
"""

from __future__ import annotations

from eospack.core.errors import EospackError


class S3OptionError(EospackError, ValueError):
    """An option is missing, malformed or inconsistent; raised before any data moves."""


class S3AccessError(EospackError, RuntimeError):
    """The bucket is missing, access is denied, or the endpoint cannot be reached."""


class S3WriteError(EospackError, RuntimeError):
    """A task's upload, or the sink's commit, abort or recovery (including its reads of
    manifests and listings of uploads), failed against S3: the task or commit fails and
    Spark retries it, or the query restarts from its checkpoint."""


class S3ReadError(EospackError, RuntimeError):
    """Committed data under a prefix cannot be read as one table: a listing, manifest or
    data file could not be fetched, there is none, or sinks wrote different schemas."""
