"""The options every two-phase-commit sink shares, parsed once: ``deliveryGuarantee`` and
``sinkId``.

Each sink reads its raw values (Spark hands options over case-insensitively) and passes
them here with its own error class, so that a user sees the same rule and the same
message whichever sink they configure.
"""

from __future__ import annotations

from dataclasses import dataclass

from eospack.commit_protocols.identity import SinkIdentityError, validate_sink_id

DELIVERY_GUARANTEES = ("exactly-once", "at-least-once")


@dataclass(frozen=True)
class SinkCommonOptions:
    """``exactly_once`` unless ``deliveryGuarantee=at-least-once``; ``sink_id`` None means
    derived from the query id and the target (``eospack.commit_protocols.identity``)."""

    exactly_once: bool
    sink_id: str | None


def parse_sink_common_options(
    delivery_guarantee: str | None, sink_id: str | None, error: type[ValueError]
) -> SinkCommonOptions:
    """Validate the two values (None: not given); raise ``error`` with a one-line fix."""
    guarantee = "exactly-once" if delivery_guarantee is None else delivery_guarantee
    if guarantee.strip().lower() not in DELIVERY_GUARANTEES:
        raise error(
            f"Option deliveryGuarantee is {guarantee!r}: use exactly-once (default) or"
            " at-least-once"
        )
    if sink_id is not None:
        try:
            sink_id = validate_sink_id(sink_id.strip())
        except SinkIdentityError as identity_error:
            raise error(str(identity_error)) from None
    return SinkCommonOptions(guarantee.strip().lower() == "exactly-once", sink_id)
