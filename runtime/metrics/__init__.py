"""Prometheus metrics: what the database knows, read at scrape time (``collector``; the
console serves it at ``/metrics`` behind a bearer token), and what each worker process knows
(``runtime.meters``; ``runworker --metrics-port`` serves it). docs/operations/monitoring.md
explains each metric, the alert rules and the dashboard."""

from runtime.metrics.collector import DatabaseCollector
from runtime.metrics.exposition import (
    CONTENT_TYPE,
    database_metrics_text,
    serve_process_metrics,
)

__all__ = ["CONTENT_TYPE", "DatabaseCollector", "database_metrics_text",
           "serve_process_metrics"]
