"""Sources and sinks: replayable-kafka, 2pc-jdbc and 2pc-s3."""
