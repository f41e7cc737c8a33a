"""Floor 1, the core: what every other floor may use and which imports none of them (errors,
option reading, Spark feature checks, checkpoint files, the call-fault rig, logs, Java checks,
cache paths, the checkout layout, the version)."""
