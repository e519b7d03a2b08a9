"""Leases (design §6): a lease holder's fenced commits (``lease``), the heartbeat that keeps
leases alive (``heartbeat``), and claims and takeovers (``claims``).
"""
