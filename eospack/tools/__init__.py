"""Floor 4, the operator's tools: the format registry and register(), doctor, checkpoint
inspect, savepoints, the supervisor and the Spark session helper; above the connectors,
below the lab and the command line."""
