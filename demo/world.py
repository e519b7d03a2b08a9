"""The demo's outside world: a payment provider and a mail server, each its own SQLite file that
the runtime does not own. Their ledgers are what an operator checks to learn whether an
interrupted call took effect.

The payment provider honours idempotency keys (a repeated refund with the same key returns the
first one, as real providers do); the mail server does not (a repeated send is a second mail).
Both log every request they receive, duplicates included.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings

from runtime import conf

SCHEMA = {
    "payments": """
        CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL,
            email TEXT NOT NULL, item TEXT NOT NULL, amount_cents INTEGER NOT NULL);
        CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY,
            idempotency_key TEXT NOT NULL UNIQUE, order_id INTEGER NOT NULL,
            amount_cents INTEGER NOT NULL, at TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, idempotency_key TEXT,
            order_id INTEGER, amount_cents INTEGER, outcome TEXT NOT NULL, at TEXT NOT NULL);
    """,
    "mail": """
        CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, idempotency_key TEXT,
            recipient TEXT NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL, at TEXT NOT NULL);
    """,
    # The ops team's chat: the runtime's approval notifications, as a webhook receiver keeps
    # them (one row per key, however often it was delivered).
    "chat": """
        CREATE TABLE IF NOT EXISTS received (id INTEGER PRIMARY KEY,
            idempotency_key TEXT NOT NULL UNIQUE, event TEXT NOT NULL, approval_id INTEGER,
            title TEXT NOT NULL, link TEXT NOT NULL, deliveries INTEGER NOT NULL,
            first_at TEXT NOT NULL, last_at TEXT NOT NULL);
    """,
}
CUSTOMERS = [("Ada Lovelace", "ada@example.com"), ("Grace Hopper", "grace@example.com"),
             ("Alan Turing", "alan@example.com"), ("Edsger Dijkstra", "edsger@example.com"),
             ("Barbara Liskov", "barbara@example.com"), ("Donald Knuth", "don@example.com")]
ITEMS = ["kettle", "desk lamp", "headphones", "bicycle helmet", "standing desk", "espresso grinder"]
# The shop's currency: every amount in both files (and in the tools' ``amount_cents``) is a
# whole number of its cents.
CURRENCY = "EUR"


def money(cents: int | None) -> str:
    """An amount as people read it, with its unit ("249.00 EUR"): a bare 24900 reads as a
    refund a hundred times too large."""
    if cents is None:
        return "—"
    return f"{Decimal(cents) / 100:.2f} {CURRENCY}"


def world_dir() -> Path:
    return Path(conf.value("RUNTIME_DEMO_DIR") or settings.VAR_DIR / "demo")


@contextmanager
def _db(name: str) -> Iterator[sqlite3.Connection]:
    path = world_dir() / f"{name}.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=20, isolation_level=None)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        yield conn
    finally:
        conn.close()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def setup(orders: int = 60, seed: int = 1) -> None:
    """Create both files and a shop's orders (idempotent: existing orders are kept)."""
    rng = random.Random(seed)
    ensure_schema()
    with _db("payments") as conn:
        if conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0]:
            return
        rows = []
        for i in range(1, orders + 1):
            customer, email = rng.choice(CUSTOMERS)
            rows.append((1000 + i, customer, email, rng.choice(ITEMS),
                         rng.choice([1299, 2450, 4999, 8900, 12900, 18950, 24900])))
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", rows)


def ensure_schema() -> None:
    """Both files with their tables (no orders): what the ledger page needs to answer."""
    for name, ddl in SCHEMA.items():
        with _db(name) as conn:
            conn.executescript(ddl)


def order_ids() -> list[int]:
    with _db("payments") as conn:
        return [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY id")]


def lookup_order(order_id: int) -> dict[str, Any] | None:
    with _db("payments") as conn:
        row = conn.execute("SELECT * FROM orders WHERE id = ?", (order_id,)).fetchone()
    return dict(row) if row else None


def refund(order_id: int, amount_cents: int, key: str) -> dict[str, Any]:
    """The provider's refund endpoint: idempotent by key, every request logged."""
    with _db("payments") as conn:
        conn.execute("BEGIN IMMEDIATE")
        found = conn.execute("SELECT * FROM refunds WHERE idempotency_key = ?", (key,)).fetchone()
        outcome = "duplicate: first refund returned" if found else "refunded"
        if not found:
            conn.execute("INSERT INTO refunds (idempotency_key, order_id, amount_cents, at) "
                         "VALUES (?, ?, ?, ?)", (key, order_id, amount_cents, _now()))
            found = conn.execute("SELECT * FROM refunds WHERE idempotency_key = ?",
                                 (key,)).fetchone()
        conn.execute("INSERT INTO requests (idempotency_key, order_id, amount_cents, outcome, "
                     "at) VALUES (?, ?, ?, ?, ?)", (key, order_id, amount_cents, outcome, _now()))
        conn.execute("COMMIT")
    return {"refund_id": found["id"], "amount_cents": found["amount_cents"],
            "duplicate": outcome != "refunded"}


def send_mail(recipient: str, subject: str, body: str, key: str) -> dict[str, Any]:
    """The mail server: no idempotency, so a repeated send is a second mail."""
    with _db("mail") as conn:
        cur = conn.execute("INSERT INTO outbox (idempotency_key, recipient, subject, body, at) "
                           "VALUES (?, ?, ?, ?, ?)", (key, recipient, subject, body, _now()))
    return {"message_id": cur.lastrowid}


def ledger(key: str = "") -> dict[str, list[dict[str, Any]]]:
    """What the outside world recorded, optionally only under one idempotency key."""
    ensure_schema()  # a console whose demo never ran shows an empty world, not an error
    where, args = ("WHERE idempotency_key = ?", (key,)) if key else ("", ())
    out = {}
    with _db("payments") as conn:
        out["refunds"] = [dict(r) for r in conn.execute(
            f"SELECT * FROM refunds {where} ORDER BY id DESC LIMIT 200", args)]
        out["requests"] = [dict(r) for r in conn.execute(
            f"SELECT * FROM requests {where} ORDER BY id DESC LIMIT 200", args)]
    with _db("mail") as conn:
        out["mails"] = [dict(r) for r in conn.execute(
            f"SELECT * FROM outbox {where} ORDER BY id DESC LIMIT 200", args)]
    return out


def receive_notification(body: dict[str, Any]) -> bool:
    """The chat's webhook: keep a notification once by its idempotency key (a repeat only
    counts a delivery); True if it was new."""
    key, now = str(body["idempotency_key"])[:200], _now()
    approval = body.get("approval") or {}
    with _db("chat") as conn:
        conn.executescript(SCHEMA["chat"])
        cur = conn.execute(
            "INSERT INTO received (idempotency_key, event, approval_id, title, link, deliveries,"
            " first_at, last_at) VALUES (?, ?, ?, ?, ?, 1, ?, ?) ON CONFLICT (idempotency_key) "
            "DO UPDATE SET deliveries = deliveries + 1, last_at = excluded.last_at "
            "RETURNING deliveries",
            (key, str(body.get("event", ""))[:40], approval.get("id"),
             str(approval.get("title", ""))[:300], str(body.get("link", ""))[:500], now, now))
        return cur.fetchone()[0] == 1


def notifications_received() -> list[dict[str, Any]]:
    ensure_schema()
    with _db("chat") as conn:
        return [dict(r) for r in conn.execute(
            "SELECT * FROM received ORDER BY id DESC LIMIT 200")]
