"""The append-only triggers on the audit tables, as the migrations create them."""

from __future__ import annotations

APPEND_ONLY_TABLES = ("runtime_event", "runtime_runcreation", "runtime_auditcheckpoint",
                      "runtime_scheduleevent")


def expected_triggers(vendor: str) -> dict[str, str]:
    """Each append-only trigger's name and exact text on ``vendor`` (as the migrations make it)."""
    return {"sqlite": _sqlite_expected, "postgresql": _postgres_expected}[vendor]()


def _sqlite_expected() -> dict[str, str]:
    return {f"{table}_no_{op}": (f"CREATE TRIGGER {table}_no_{op} BEFORE {op.upper()} ON {table} "
                                 f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END")
            for table in APPEND_ONLY_TABLES for op in ("update", "delete")}


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


POSTGRES_FUNCTION_BODY = "BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END"
