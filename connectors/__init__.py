"""Sources and sinks: replayable-kafka, 2pc-jdbc, 2pc-s3 and 2pc-kafka (each one an entry of
``eospack.tools.formats``)."""
