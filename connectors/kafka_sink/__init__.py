"""2pc-kafka (in progress): Kafka transactions that the driver commits."""
