"""Kafka records as Arrow data: the source's record schema (defined once, in ``schema``),
record batch v2 decode and encode, and the choice between the native extension and the
pure-Python reference."""
