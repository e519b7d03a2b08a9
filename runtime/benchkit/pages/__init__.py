"""``manage.py bench --console``: the console's and the admin's pages on a big database.

Builds the data set of a busy deployment in the bench's own fresh database (100,000 runs,
10,000 of them waiting on a pending approval, 1,000,000 events and one 5,000-step run;
``--quick``: 2,000 / 200 / 25,000 / 500), then asks every page for itself, in process, through
Django's test client logged in as a superuser, a fresh database connection per request (as
``CONN_MAX_AGE=0`` serves them): p50 and p95 of the server time over N requests, the SQL
queries one request makes and the size of its answer. The target: p95 under 150 ms.

The rows are bulk-inserted (plain sqlite3 ``executemany`` in big transactions, as ``scale`` does;
``COPY`` on PostgreSQL, then ``ANALYZE``) run by run, each run as the runtime writes one: its
steps, approvals and events with real kinds, payload shapes, actors (people, and the
``name@host:pid:hex`` owners of the workers that ran it, most of them long dead) and lease epochs;
each run's events form a valid hash chain (``runtime.storage.events.build_events``), so
``verifyaudit`` passes on them. What a run did is drawn at random (seeded, so every build is the
same) within the totals asked for, which are met exactly: at 10 events a run, most finished runs
are a final answer with no tool call (9 events), and the budget left goes to runs that called
tools.

Split by concern, each module readable on its own: ``loaders`` (rows into SQLite or
PostgreSQL), ``stories`` (the data set's constants and one run's story), ``kinds`` (what each
kind of run does), ``plan`` (a shape per run, meeting the totals), ``builder`` (writing the
runs and summing them up) and ``timing`` (the pages and their timings). Named ``pages``, not
``console``: the runtime never imports the console app, it only asks its pages over HTTP.
"""

from __future__ import annotations

from runtime.benchkit.pages.loaders import PostgresLoader, SqliteLoader
from runtime.benchkit.pages.stories import FULL, QUICK, Sizes
from runtime.benchkit.pages.timing import measure

__all__ = ["FULL", "QUICK", "PostgresLoader", "Sizes", "SqliteLoader", "measure"]
