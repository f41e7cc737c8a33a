"""Types of the Rust extension (native/; see connectors/kafka/records/record_batches.py)."""

__version__: str

def decode_records(
    raw: bytes,
    fetch_offset: int,
    topic: str,
    partition: int,
    read_committed: bool,
    aborted: list[tuple[int, int]],
    include_headers: bool,
    check_crcs: bool = True,
) -> tuple[object, object, int, int] | None: ...
def encode_records(
    schema: object,
    array: object,
    partitions: int,
    sticky_partition: int,
    max_batch_bytes: int,
    max_record_bytes: int,
    timestamp_ms: int,
    codec: int,
) -> tuple[list[tuple[int, int, bytearray]], int]: ...
def set_producer_state(
    batch: bytearray, producer_id: int, epoch: int, base_sequence: int, transactional: bool
) -> None: ...
def partition_for_key(key: bytes, partitions: int) -> int: ...
def build_profile() -> str:
    """How the extension was compiled: "release" (optimised) or "debug" (debug assertions)."""
