"""Metrics of every query that uses the pack, for Prometheus (docs/metrics.md).

``eospack.metrics.serve(spark, port=9464)`` before starting queries; scrape
``http://<host>:<port>/metrics``. Needs ``pip install 'eospack[metrics]'``. How the numbers
travel from Spark's Python processes to the endpoint: ``eospack.core.metrics``.
"""

from __future__ import annotations

from eospack.tools.metrics import MetricsEndpoint, MetricsUnavailableError, serve

__all__ = ["MetricsEndpoint", "MetricsUnavailableError", "serve"]
