"""``EospackError``: the one base of every error eospack raises on purpose.

``except EospackError`` catches them all; each also keeps the built-in base it always had
(``ValueError`` for bad options, ``RuntimeError`` for a broken guarantee or a failed
service, ``ConnectionError`` / ``TimeoutError`` where Spark users expect those), so existing
handlers keep working. The message style is Spark's: one line that names the option, the
sink, batch or object concerned, and ends with what to do (``use ...``, ``set ...``,
``restart ...``); secrets never appear in it.

This module imports nothing, so every package (connectors, commit protocols, stateful
operators, tools) can use it without an import cycle.
"""

from __future__ import annotations


class EospackError(Exception):
    """An error eospack raised on purpose, with a message a user can act on."""
