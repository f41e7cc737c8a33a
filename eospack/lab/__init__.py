"""Floor 5, the lab: the embedded services (Kafka, PostgreSQL, S3), the demo and the test
helpers; it may use every floor below, and only the command line uses it."""
