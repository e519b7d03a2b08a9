"""SQLite: the Django database backend (``ENGINE = "runtime.storage.sqlite"``: writers queued
on a lock file, private files, no network file systems), the committer with its group
commit, and a worker's WAL checkpoints.

Django imports this package to find ``base``: keep it free of imports.
"""
