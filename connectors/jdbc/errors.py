"""One exception class per way the 2pc-jdbc sink can fail at query start or while writing.

Every message is one line naming the option (or table/column) at fault and the fix. None
carries a secret: the password and any URL credentials are never formatted into them.
"""

from __future__ import annotations

from eospack.core.errors import EospackError


class JdbcSinkOptionError(EospackError, ValueError):
    """An option is missing, malformed or inconsistent; raised before any data moves."""


class JdbcIdentifierError(JdbcSinkOptionError):
    """A table or column name that cannot be quoted safely as an SQL identifier."""


class JdbcConnectionError(EospackError, ConnectionError):
    """The database refused the connection (down, unknown host, wrong credentials)."""


class JdbcSchemaError(EospackError, ValueError):
    """The target table does not fit the DataFrame (missing, other columns, absent keys)."""


class JdbcWriteError(EospackError, RuntimeError):
    """A task or commit failed against the database (classified by SQLSTATE)."""
