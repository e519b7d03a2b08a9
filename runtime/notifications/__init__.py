"""Notifications about approvals: the configured channels (``channels``), the transactional
outbox written with each approval's change (``outbox``) and delivery at least once
(``delivery``).
"""
