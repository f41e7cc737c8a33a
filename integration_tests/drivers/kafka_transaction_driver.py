"""Opens a Kafka transaction, writes records, flushes, prints how to commit it (one JSON
line) and ends the process at once, as a killed Python worker would: nothing is closed,
the transaction stays open on the broker.

Usage: kafka_transaction_driver.py BOOTSTRAP TOPIC TRANSACTIONAL_ID RECORDS TIMEOUT_MS
"""

from __future__ import annotations

import json
import os
import sys

from eospack.connectors.kafka.client.transactions import begin

if __name__ == "__main__":
    bootstrap, topic, transactional_id, records, timeout_ms = sys.argv[1:6]
    producer = begin(
        {"bootstrap_servers": bootstrap, "transaction_timeout_ms": int(timeout_ms)},
        transactional_id,
    )
    for index in range(int(records)):
        producer.send(
            topic, key=b"k", value=f"{transactional_id}:{index}".encode(), partition=index % 2
        )
    producer.flush()
    identity = producer._transaction_manager.producer_id_and_epoch
    print(
        json.dumps(
            {
                "transactional_id": transactional_id,
                "producer_id": identity.producer_id,
                "epoch": identity.epoch,
                "records": int(records),
            }
        ),
        flush=True,
    )
    os._exit(0)
