"""The two ways metrics leave a process: the database's numbers as one scrape's text (the
console's ``/metrics`` view returns it), and a worker's own counters and histograms on an
HTTP server of its own (``runworker --metrics-port``)."""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, generate_latest, start_http_server
from prometheus_client.registry import CollectorRegistry

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.metrics.collector import DatabaseCollector

log = logging.getLogger("runtime.metrics")

# The text format generate_latest writes (names escaped to the classic characters), which
# every Prometheus version reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def database_metrics_text(clock: Clock = SYSTEM_CLOCK) -> bytes:
    """One scrape of the shared numbers, in Prometheus's text format. A registry of its own,
    so the console's process metrics (and any worker meters it imported) are not mixed in:
    every console process answers the same."""
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(clock))
    return generate_latest(registry)


def serve_process_metrics(port: int, addr: str = "127.0.0.1") -> tuple[WSGIServer,
                                                                       threading.Thread]:
    """Serve this process's metrics (prometheus_client's default registry: the meters, and
    the process's CPU, memory and garbage collection) on ``addr:port`` from a daemon thread;
    port 0 takes a free one. The log line names the address actually bound. Raises OSError
    when the address cannot be bound."""
    server, thread = start_http_server(port, addr=addr, registry=REGISTRY)
    host, bound = server.server_address[:2]
    log.info("metrics of this process on http://%s:%s/metrics", host, bound)
    return server, thread
