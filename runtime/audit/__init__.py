"""Checking the audit record (design §12a): each run's chain (``chain``), its rows replayed
from its events (``replay``), the global chain of creations (``creations``), signed
checkpoints (``checkpoint``) and ``verifyaudit``'s whole check (``check``).
"""
