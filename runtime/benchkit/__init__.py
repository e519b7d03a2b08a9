"""``manage.py bench``: what a durable step costs on this machine, next to what the disk allows.

Split by section: ``ceiling`` (raw synced commits), ``steps`` (in-process durable steps),
``workers`` (worker processes: concurrency, approval-to-restart, RSS), ``scale`` (query plans and
times on large tables), ``report`` (the table and the targets). ``agents`` holds the agents the
bench runs, registered in subprocesses through ``RUNTIME_AGENTS``.
"""
