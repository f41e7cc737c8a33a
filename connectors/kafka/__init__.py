"""Kafka: the replayable-kafka source and the 2pc-kafka sink, side by side with their shared
client configuration (``client_config``) and errors (``errors``)."""
