"""Kafka: the replayable-kafka source (``source/``) and the 2pc-kafka sink (``sink/``), which
import nothing from each other, beside what they share: the record schema and codec
(``records/``), the kafka-python client (``client/``) and every error class (``errors``).
README.md here maps the modules."""
