"""The append-only triggers on the audit tables, as the migrations create them."""

from __future__ import annotations

APPEND_ONLY_TABLES = ("runtime_event", "runtime_runcreation", "runtime_auditcheckpoint",
                      "runtime_scheduleevent", "runtime_pruning", "runtime_prunedrun",
                      "runtime_auditexport")

# The one DELETE the triggers let through (migration 0014): an event of a run entered in
# runtime_prunedrun, which `manage.py prune` writes in the transaction that archives the run
# and removes it (runtime.retention). Every other DELETE, and every UPDATE, is refused.
PRUNE_PERMIT = "NOT EXISTS (SELECT 1 FROM runtime_prunedrun WHERE run_id = OLD.run_id)"


def expected_triggers(vendor: str) -> dict[str, str]:
    """Each append-only trigger's name and exact text on ``vendor`` (as the migrations make it)."""
    return {"sqlite": _sqlite_expected, "postgresql": _postgres_expected}[vendor]()


def _sqlite_expected() -> dict[str, str]:
    out = {}
    for table in APPEND_ONLY_TABLES:
        for op in ("update", "delete"):
            when = f"WHEN {PRUNE_PERMIT} " if (table, op) == ("runtime_event", "delete") else ""
            out[f"{table}_no_{op}"] = (
                f"CREATE TRIGGER {table}_no_{op} BEFORE {op.upper()} ON {table} {when}"
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END")
    return out


def _postgres_expected() -> dict[str, str]:
    out = {}
    for table in APPEND_ONLY_TABLES:
        out[f"{table}_no_update_delete"] = (
            f"CREATE TRIGGER {table}_no_update_delete BEFORE DELETE OR UPDATE ON {table} FOR "
            "EACH ROW EXECUTE FUNCTION runtime_event_append_only()")
        out[f"{table}_no_truncate"] = (
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} FOR EACH STATEMENT "
            "EXECUTE FUNCTION runtime_event_append_only()")
    return out


# The function every PostgreSQL trigger above calls; only a DELETE of an event whose run is
# entered in runtime_prunedrun gets past it.
POSTGRES_FUNCTION_BODY = (
    "BEGIN IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'runtime_event' THEN IF "
    "EXISTS (SELECT 1 FROM runtime_prunedrun WHERE run_id = OLD.run_id) THEN RETURN OLD; "
    "END IF; END IF; RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END")
