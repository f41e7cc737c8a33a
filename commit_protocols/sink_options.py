"""The options every two-phase-commit sink shares, parsed once: ``deliveryGuarantee`` and
``sinkId``.

Each sink passes the ``OptionReader`` of its own options (so its own error class), so that
a user sees the same rule and the same message whichever sink they configure.
"""

from __future__ import annotations

from dataclasses import dataclass

from eospack.core.options import OptionReader

from .identity import SINK_ID_RULE, SinkIdentityError, validate_sink_id

DELIVERY_GUARANTEES = ("exactly-once", "at-least-once")


@dataclass(frozen=True)
class SinkCommonOptions:
    """``exactly_once`` unless ``deliveryGuarantee=at-least-once``; ``sink_id`` None means
    derived from the query id and the target (``eospack.commit_protocols.identity``)."""

    exactly_once: bool
    sink_id: str | None


def parse_sink_common_options(reader: OptionReader) -> SinkCommonOptions:
    """Validate the two options (unset: the defaults; a blank ``sinkId`` is refused, as it
    names the sink's identity); a bad value raises the reader's error class with a
    one-line fix."""
    guarantee = reader.choice("deliveryGuarantee", DELIVERY_GUARANTEES, "exactly-once")
    sink_id = reader.identity("sinkId", SINK_ID_RULE)
    if sink_id is not None:
        try:
            sink_id = validate_sink_id(sink_id)
        except SinkIdentityError:
            raise reader.refuse("sinkId", SINK_ID_RULE) from None
    return SinkCommonOptions(guarantee == "exactly-once", sink_id)
