"""The Kafka client both connectors share: kafka-python's settings, logins, broker calls and
ride-through, and every use of kafka-python's private parts (pinned by
``tests/test_kafka_private_api_canary.py``)."""
