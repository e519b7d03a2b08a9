"""What the disk and SQLite allow before any runtime code runs: the loop's own statements.

``floor`` runs a steady-state step's statements exactly as the loop issues them (two write
transactions: the step's decision and tool start, then its result with the next step's start;
a step UPDATE or INSERT, the run's compare-and-set and a three-row event insert in each) on a
copy of the freshly migrated schema, with every parameter computed in advance. Nothing else
runs, so it is the most steps per second these rows can be committed at; the runtime's
figure against it is the cost of everything around the SQL.

``cpu_scaling`` is what the machine gives two busy processes against one (a pure-Python loop),
measured in the same run: virtual cores that share a physical one give much less than 2x.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from runtime.benchkit.ceiling import scratch

_STEP_INSERT = ('INSERT INTO "runtime_step" ("run_id", "index", "status", "tool", "arguments", '
                '"effect", "idempotency_key", "result", "error", "attempt", "dispatches", '
                '"started_at") VALUES (?,?,?,?,?,?,?,?,?,?,?,?)')
_DECIDED = ('UPDATE "runtime_step" SET "tool" = ?, "arguments" = ?, "effect" = ?, '
            '"status" = ?, "attempt" = ?, "dispatches" = ? WHERE "id" = ?')
_FINISHED = ('UPDATE "runtime_step" SET "status" = ?, "result" = ?, "finished_at" = ? '
             'WHERE "id" = ?')
_CAS = ('UPDATE "runtime_run" SET "event_seq" = ?, "event_hash" = ?, "updated_at" = ? '
        'WHERE "id" = ? AND "lease_owner" = ? AND "lease_epoch" = ? AND "event_seq" = ?')
_EVENTS = ('INSERT INTO "runtime_event" ("run_id", "step_index", "seq", "kind", "payload", '
           '"actor", "at", "hash") VALUES ' + ",".join(["(?,?,?,?,?,?,?,?)"] * 3))
_AT = "2026-12-03 12:00:00.000000"


def floor(template: Path, directory: Path, seconds: float) -> float:
    """Steps per second of the loop's bare statements on a copy of ``template``."""
    path = directory / "floor.sqlite3"
    shutil.copyfile(template, path)
    with scratch(path) as conn:
        run = conn.execute(
            'INSERT INTO "runtime_run" ("agent", "input", "status", "failure_code", '
            '"failure_message", "planned", "lease_owner", "lease_epoch", "event_seq", '
            '"event_hash", "llm_requests", "tokens_in", "tokens_out", "cost", "created_by", '
            '"created_at", "updated_at") VALUES (\'floor\', \'{}\', \'running\', \'\', \'\', '
            '\'[]\', \'floor\', 1, 0, \'\', 0, 0, 0, 0, \'\', ?, ?)', (_AT, _AT)).lastrowid
        assert run is not None, "an INSERT sets lastrowid"
        step = conn.execute(_STEP_INSERT, _step_row(run, 1)).lastrowid
        seq, n, start = 0, 0, time.perf_counter()
        while True:
            n += 1
            conn.execute("BEGIN IMMEDIATE")  # the decision and the tool's start
            conn.execute(_DECIDED, ("bench_read", f'{{"n": {n}}}', "read_only", "executing", 1,
                                    0, step))
            seq = _chain(conn, run, n, seq, ("llm.responded", "step.decided",
                                             "step.tool_started"))
            conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")  # the result and the next step's start
            conn.execute(_FINISHED, ("succeeded", f'{{"n": {n}}}', _AT, step))
            step = conn.execute(_STEP_INSERT, _step_row(run, n + 1)).lastrowid
            seq = _chain(conn, run, n, seq, ("step.tool_finished", "step.started",
                                             "llm.requested"))
            conn.execute("COMMIT")
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return n / elapsed


def _step_row(run: int, index: int) -> tuple:
    return (run, index, "deciding", "", None, "", f"run{run}-step{index}-0123456789ab", None,
            "", 0, 0, _AT)


def _chain(conn: sqlite3.Connection, run: int, step: int, seq: int, kinds: tuple) -> int:
    """The run's compare-and-set and its three events (hashes precomputed: fixed strings)."""
    params: list = []
    for kind in kinds:
        seq += 1
        params += (run, step, seq, kind, '{"attempt":1}', "floor", _AT, f"{seq:064x}")
    if conn.execute(_CAS, (seq, f"{seq:064x}", _AT, run, "floor", 1, seq - 3)).rowcount != 1:
        raise RuntimeError("floor: the compare-and-set missed")
    conn.execute(_EVENTS, params)
    return seq


_SPIN = ("import sys, time\n"
         "n, end = 0, time.perf_counter() + float(sys.argv[1])\n"
         "while time.perf_counter() < end:\n"
         "    for _ in range(1000): n += 1\n"
         "print(n)\n")


def cpu_scaling(seconds: float) -> float:
    """Work done by two busy processes at once over one alone (2.0 = two whole cores)."""
    def spin(count: int) -> int:
        procs = [subprocess.Popen([sys.executable, "-c", _SPIN, str(seconds)],
                                  stdout=subprocess.PIPE, text=True) for _ in range(count)]
        return sum(int(p.communicate()[0]) for p in procs)

    return spin(2) / spin(1)
