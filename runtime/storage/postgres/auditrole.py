"""A PostgreSQL role for the application that cannot undo the audit log's protection.

Only a table's owner (or a superuser) can drop or disable a trigger. The runtime, the console
and the workers need only to read and write rows; if they connect as a role that owns nothing,
holds no CREATE right and is no superuser, a compromised application can neither drop the
append-only triggers nor update, delete or truncate the audit tables. Migrations run as the
owner, from a deploy step, with another ``DATABASE_URL``.
"""

from __future__ import annotations

import re

from django.db import connections

from runtime.storage.triggers import APPEND_ONLY_TABLES

_NAME = re.compile(r"^[a-z_][a-z0-9_$]{0,62}$")


def _quote(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a plain role name (lower-case letters, digits, _ and "
                         "$, at most 63 characters)")
    return f'"{name}"'


def role_grants(role: str, using: str = "default") -> list[str]:
    """The statements (run as the tables' owner) that give ``role`` what the application needs
    and nothing that can alter the audit log: rows of every table read and written, the audit
    tables only read and appended to, the migration record only read."""
    connection = connections[using]
    who = _quote(role)
    database = connection.settings_dict["NAME"]
    with connection.cursor() as cur:
        cur.execute("SELECT current_schema(), quote_ident(%s), quote_ident(current_schema())",
                    [database])
        _, db, schema = cur.fetchone()
    audit = ", ".join(APPEND_ONLY_TABLES)
    return [
        f"GRANT CONNECT ON DATABASE {db} TO {who}",
        f"GRANT USAGE ON SCHEMA {schema} TO {who}",
        f"REVOKE CREATE ON SCHEMA {schema} FROM {who}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {who}",
        f"REVOKE UPDATE, DELETE, TRUNCATE ON {audit} FROM {who}",
        # Only `prune` (run as the owner) records prunings: an entry made by the application
        # would mark a live run as pruned, and the record is append-only.
        f"REVOKE INSERT ON runtime_pruning, runtime_prunedrun FROM {who}",
        f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON django_migrations FROM {who}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {who}",
    ]


def role_problems(role: str, using: str = "default") -> list[str]:
    """Why ``role`` could still undo the audit log's protection (empty when it cannot)."""
    _quote(role)
    with connections[using].cursor() as cur:
        cur.execute("SELECT rolsuper, rolcreaterole, rolbypassrls FROM pg_roles "
                    "WHERE rolname = %s", [role])
        found = cur.fetchone()
        if found is None:
            return [f"role {role} does not exist: CREATE ROLE {role} LOGIN PASSWORD '...' first"]
        problems = []
        if found[0]:
            problems.append(f"role {role} is a superuser: it can drop any trigger")
        if found[1]:
            problems.append(f"role {role} can create roles (and grant itself membership)")
        cur.execute("SELECT c.relname FROM pg_class c WHERE c.relnamespace = "
                    "to_regnamespace(current_schema()) AND c.relkind IN ('r', 'p') AND "
                    "pg_has_role(%s, c.relowner, 'USAGE') ORDER BY 1", [role])
        owned = [r[0] for r in cur.fetchall()]
        if owned:
            problems.append(f"role {role} owns (or is a member of the owner of) "
                            f"{', '.join(owned[:5])}{' ...' if len(owned) > 5 else ''}: an "
                            "owner can drop the triggers; connect the application as a role "
                            "that owns nothing")
        cur.execute("SELECT has_schema_privilege(%s, current_schema(), 'CREATE')", [role])
        if cur.fetchone()[0]:
            problems.append(f"role {role} may create objects in the schema (directly or "
                            "through PUBLIC: REVOKE CREATE ON SCHEMA ... FROM PUBLIC)")
        cur.execute("SELECT t FROM unnest(%s::text[]) t WHERE has_table_privilege(%s, t, "
                    "'UPDATE') OR has_table_privilege(%s, t, 'DELETE') OR "
                    "has_table_privilege(%s, t, 'TRUNCATE')",
                    [list(APPEND_ONLY_TABLES), role, role, role])
        writable = [r[0] for r in cur.fetchall()]
        if writable:
            problems.append(f"role {role} may update, delete or truncate {', '.join(writable)}")
    return problems
