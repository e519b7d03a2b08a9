"""Schedules (design §10): when they fire (``timing``), changes with their own audit chain
(``changes``), firing due occurrences (``firing``), the standing authorization a scheduled
run carries (``authorization``), and ``verifyaudit``'s check of them (``verify``).
"""
