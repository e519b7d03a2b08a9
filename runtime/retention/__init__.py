"""Retention: finished runs archived to files and removed from the database with the audit
still provable, old notifications removed, and SQLite's free pages given back.

``prune.py`` archives and removes runs in batches (``manage.py prune``), each batch a
``Pruning`` on record (``record.py``); ``archive.py`` writes and reads the archive files;
``verify.py`` checks them (``verifyaudit --archive``); ``outbox.py`` removes delivered
notifications; ``space.py`` reclaims the SQLite file's free pages. The operator's procedure
is docs/operations/retention.md.
"""
