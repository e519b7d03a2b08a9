"""Audit exports: filtered, streamed, every line checkable against the chain (by itself from a
run's first event, or against a signed checkpoint's heads), and each export on record in an
append-only chain of its own."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import stat
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from runtime import Agent, FinalAnswer, ScriptedLLM, ToolCall, cancel, resume, start
from runtime.agents.agent import registry
from runtime.approvals.decisions import approve, reject
from runtime.audit import export as export_module
from runtime.audit.check import triggers_problems
from runtime.audit.checkpoint import checkpoint_load
from runtime.audit.export import (
    audit_export,
    audit_export_stream,
    export_filters,
    exports_problems,
)
from runtime.audit.export_check import audit_export_verify
from runtime.canonical import iso_time
from runtime.errors import ExportRefused
from runtime.models import Approval, AuditExport, Event, Run
from runtime.storage.events import event_hash
from tests.kit import Ledger, charges_need_approval, make_agent, make_tools, verifyaudit

pytestmark = pytest.mark.engines

KEY = "k" * 40


@pytest.fixture(autouse=True)
def audit_key(settings):
    settings.RUNTIME = {**settings.RUNTIME, "AUDIT_KEY": KEY}


@pytest.fixture
def runs(database, tmp_path, clock):
    """Two plain runs of agent "an" an hour apart, then a gated run alice approves and one bob
    rejects, each an hour later again."""
    ledger = Ledger(tmp_path / "ledger")
    plain = make_agent("an", [ToolCall("read", {"key": "a"}), FinalAnswer("ok")], ledger)
    gated = Agent("gated", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("done")]),
                  make_tools(ledger), policy=charges_need_approval)
    with registry.override(plain, gated):
        for i in range(2):
            resume(start("an", {"n": i}, created_by="carol", clock=clock).pk, clock=clock,
                   lease_seconds=5)
            clock.advance(3600)
        for who in ("alice", "bob"):
            paused = resume(start("gated", {}, created_by="carol", clock=clock).pk,
                            clock=clock, lease_seconds=5)
            clock.advance(60)
            approval = Approval.objects.get(run_id=paused.pk)
            if who == "alice":
                approve(approval.pk, by=who, note="fine", now=clock.now())
                resume(paused.pk, clock=clock, lease_seconds=5)
            else:
                reject(approval.pk, by=who, note="no", now=clock.now())
            clock.advance(3600)
    return list(Run.objects.order_by("pk"))


def export(clock, **kwargs) -> tuple[str, AuditExport]:
    out = io.StringIO()
    row = audit_export(out, by=kwargs.pop("by", "auditor"), now=clock.now(), **kwargs)
    return out.getvalue(), row


def parsed(text: str, fmt: str) -> list[dict]:
    if fmt == "jsonl":
        return [json.loads(line) for line in text.splitlines()]
    return list(csv.DictReader(io.StringIO(text, newline="")))


def key(line: dict) -> tuple[int, int]:
    return int(line["run"]), int(line["seq"])


# -- the lines ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_whole_export_holds_every_event_and_verifies_by_itself(runs, clock, fmt):
    text, row = export(clock, format=fmt)
    lines = parsed(text, fmt)
    stored = list(Event.objects.order_by("run_id", "seq"))
    assert [key(line) for line in lines] == [(e.run_id, e.seq) for e in stored]
    for line, e in zip(lines, stored, strict=True):
        assert line["hash"] == e.hash and line["kind"] == e.kind and line["at"] == iso_time(e.at)
    # Each line's hash is the chain's own (the reference function, from the previous line).
    prev = ""
    for line, e in zip(lines, stored, strict=True):
        prev = "" if e.seq == 1 else prev
        payload = line["payload"] if fmt == "jsonl" else json.loads(line["payload"])
        step = line["step"] if fmt == "jsonl" else (int(line["step"]) if line["step"] else None)
        prev = event_hash(prev, run_id=e.run_id, seq=e.seq, kind=line["kind"], step_index=step,
                          payload=payload, actor=line["actor"], at=e.at)
        assert prev == line["hash"]
    result = audit_export_verify(io.StringIO(text, newline=""))
    assert result.ok, result.problems
    assert (result.lines, result.verified, result.runs) == (len(stored), len(stored), len(runs))
    assert row.rows == len(stored) and row.complete and row.last_hash == stored[-1].hash
    assert row.sha256 == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_filters_pick_the_rows_they_name(runs, clock, fmt):
    everything = list(Event.objects.order_by("run_id", "seq").select_related("run"))
    middle = everything[len(everything) // 2].at
    cases = {
        "run": ({"run": runs[1].pk}, lambda e: e.run_id == runs[1].pk),
        "agent": ({"agent": "gated"}, lambda e: e.run.agent == "gated"),
        "actor": ({"actor": "alice"}, lambda e: e.actor == "alice"),
        "since": ({"since": iso_time(middle)}, lambda e: e.at >= middle),
        "window": ({"since": middle - timedelta(hours=1), "until": middle},
                   lambda e: middle - timedelta(hours=1) <= e.at < middle),
    }
    for name, (filters, wanted) in cases.items():
        text, row = export(clock, format=fmt, **filters)
        expected = [(e.run_id, e.seq) for e in everything if wanted(e)]
        assert expected, name  # each case selects something, and not everything
        assert len(expected) < len(everything), name
        assert [key(line) for line in parsed(text, fmt)] == expected, name
        assert row.rows == len(expected)
        assert set(row.filters) == set(filters)
        assert audit_export_verify(io.StringIO(text, newline="")).ok, name
    text, row = export(clock, format=fmt, actor="nobody-at-all")
    assert parsed(text, fmt) == [] and row.rows == 0


def test_a_filtered_export_proves_its_pieces_only_with_a_checkpoint(runs, clock, tmp_path):
    path = tmp_path / "cp.json"
    call_command("auditcheckpoint", "--out", str(path), stderr=io.StringIO())
    doc = checkpoint_load(path)
    last_start = Event.objects.filter(run_id=runs[-1].pk, seq=1).get().at
    text, _ = export(clock, format="jsonl", since=last_start)  # the last run, whole
    lines = parsed(text, "jsonl")
    alone = audit_export_verify(text.splitlines())
    assert alone.ok and alone.verified == len(lines)
    later = Event.objects.filter(run_id=runs[-1].pk, at__gt=last_start).order_by("seq")[0]
    assert later.seq > 1
    text, _ = export(clock, format="jsonl", run=runs[-1].pk, since=later.at)  # the decision on
    pieces = parsed(text, "jsonl")
    alone = audit_export_verify(text.splitlines())
    assert alone.ok and (alone.verified, alone.unchecked, alone.linked) == (
        0, 1, len(pieces) - 1)
    anchored = audit_export_verify(text.splitlines(), doc)
    assert anchored.ok and anchored.heads == 1
    assert (anchored.verified, anchored.unchecked) == (len(pieces) - 1, 1)
    # The same piece with its last hash not the checkpoint's head.
    forged = [*text.splitlines()[:-1], json.dumps({**pieces[-1], "hash": "0" * 64})]
    found = audit_export_verify(forged, doc)
    assert not found.ok and any("not the head checkpoint" in p for p in found.problems)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_tampered_line_is_caught(runs, clock, fmt):
    text, _ = export(clock, format=fmt)
    lines = text.splitlines(keepends=True)
    victim = len(lines) // 2
    edited = lines[victim].replace("2026-01-01T", "2025-12-31T")  # an event back-dated
    assert edited != lines[victim]
    tampered = [*lines[:victim], edited, *lines[victim + 1:]]
    found = audit_export_verify(io.StringIO("".join(tampered), newline=""))
    assert found.problem_count == 1
    assert found.problems[0].startswith(f"line {victim + 1}:")
    moved = [*lines[:victim], lines[victim + 1], lines[victim], *lines[victim + 2:]]
    assert not audit_export_verify(io.StringIO("".join(moved), newline="")).ok


def test_decisions_name_the_event_that_recorded_them(runs, clock):
    for fmt in ("csv", "jsonl"):
        text, row = export(clock, what="decisions", format=fmt)
        lines = parsed(text, fmt)
        decided = list(Approval.objects.filter(decided_at__isnull=False).order_by("run_id", "id"))
        assert [int(line["approval"]) for line in lines] == [a.pk for a in decided]
        assert {line["decided_by"] for line in lines} == {"alice", "bob"}
        for line, approval in zip(lines, decided, strict=True):
            recorded = Event.objects.get(run_id=approval.run_id, seq=int(line["event_seq"]))
            assert recorded.hash == line["event_hash"]
            assert recorded.payload["approval_id"] == approval.pk
            assert line["status"] == approval.status
        assert row.what == "decisions" and row.rows == len(decided)
    text, _ = export(clock, what="decisions", format="jsonl", actor="bob")
    assert [json.loads(t)["decided_by"] for t in text.splitlines()] == ["bob"]
    with pytest.raises(ExportRefused, match="no chain of its own"):
        audit_export_verify(text.splitlines())


def test_a_cancelled_approval_names_its_cancellation_event(runs, clock, tmp_path):
    """A person cancelling a run decides its approvals too (cancelled, by them, at that time):
    the decisions export names the ``approval.cancelled`` event that recorded it; one approved
    and then cancelled names its cancellation, not the grant before it."""
    ledger = Ledger(tmp_path / "ledger2")
    gated = Agent("gated", ScriptedLLM([ToolCall("charge", {"amount": 9}), FinalAnswer("done")]),
                  make_tools(ledger), policy=charges_need_approval)
    with registry.override(gated):
        pending = resume(start("gated", {}, created_by="carol", clock=clock).pk, clock=clock,
                         lease_seconds=5)
        granted = resume(start("gated", {}, created_by="carol", clock=clock).pk, clock=clock,
                         lease_seconds=5)
        approve(Approval.objects.get(run_id=granted.pk).pk, by="alice", now=clock.now())
        clock.advance(60)
        for run in (pending, granted):
            cancel(run.pk, by="dora", reason="not today", clock=clock)
    text, row = export(clock, what="decisions", format="jsonl")
    lines = {json.loads(t)["approval"]: json.loads(t) for t in text.splitlines()}
    for run in (pending, granted):
        approval = Approval.objects.get(run_id=run.pk)
        line = lines[approval.pk]
        assert line["status"] == "cancelled" and line["decided_by"] == "dora"
        recorded = Event.objects.get(run_id=run.pk, seq=line["event_seq"])
        assert recorded.kind == "approval.cancelled" and recorded.hash == line["event_hash"]
        assert recorded.payload["approval_id"] == approval.pk
    assert row.last_hash == lines[max(lines)]["event_hash"] != ""


# -- the record ---------------------------------------------------------------------------------


def test_each_export_is_recorded_chained_after_the_one_before(runs, clock):
    _, first = export(clock, by="dora", run=runs[0].pk)
    clock.advance(5)
    _, second = export(clock, by="eve", what="decisions", format="jsonl")
    rows = list(AuditExport.objects.order_by("seq"))
    assert [(r.seq, r.by, r.what, r.format) for r in rows] == [
        (1, "dora", "events", "csv"), (2, "eve", "decisions", "jsonl")]
    assert [first.pk, second.pk] == [r.pk for r in rows]
    assert rows[0].prev_hash == "" and rows[1].prev_hash == rows[0].hash
    assert rows[0].filters == {"run": runs[0].pk} and rows[1].at == clock.now()
    assert list(exports_problems()) == []
    verifyaudit()
    with connection.cursor() as cur:  # what someone who dropped the triggers could do
        for op in ("update", "delete") if connection.vendor == "sqlite" else ():
            cur.execute(f"DROP TRIGGER runtime_auditexport_no_{op}")
        if connection.vendor == "postgresql":
            cur.execute("DROP TRIGGER runtime_auditexport_no_update_delete ON "
                        "runtime_auditexport")
        cur.execute("UPDATE runtime_auditexport SET by = 'mallory' WHERE seq = 1")
    assert [p for p in exports_problems()] == [
        "exports: record #1 does not hash after the one before: records were altered, "
        "removed or reordered"]


def test_the_record_of_exports_is_append_only(runs, clock):
    export(clock)
    assert triggers_problems() == []
    for sql in ("UPDATE runtime_auditexport SET rows = 0",
                "DELETE FROM runtime_auditexport"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
                connection.cursor() as cur:
            cur.execute(sql)
    assert AuditExport.objects.get().rows > 0


def test_an_export_that_fails_part_way_is_recorded_as_incomplete(runs, clock, monkeypatch):
    monkeypatch.setattr(export_module, "CHUNK", 3)

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            if self.tell():
                raise OSError(28, "No space left on device")
            return super().write(text)

    with pytest.raises(OSError):
        audit_export(Full(), by="auditor", format="jsonl", now=clock.now())
    row = AuditExport.objects.get()
    assert not row.complete and 3 <= row.rows < Event.objects.count()


def test_a_stream_closed_by_its_reader_is_recorded_with_what_it_sent(runs, clock, monkeypatch):
    monkeypatch.setattr(export_module, "CHUNK", 2)
    stream = audit_export_stream(by="auditor", format="jsonl", now=clock.now())
    sent = next(iter(stream))
    stream.close()
    assert stream.record is not None and not stream.record.complete
    assert stream.record.rows == len(sent.splitlines())
    assert stream.record.sha256 == hashlib.sha256(sent.encode()).hexdigest()


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"since": "yesterday"}, "since"),
    ({"until": "2026-13-01"}, "until"),
    ({"since": "2026-02-01", "until": "2026-01-01"}, "until"),
    ({"since": "2026-01-01T" + "0" * 80}, "since"),
    ({"run": "12a"}, "run"),
    ({"run": 0}, "run"),
    ({"run": str(2**64)}, "run"),
    ({"agent": "a" * 201}, "agent"),
    ({"actor": "x" * 256}, "actor"),
    ({"format": "xml"}, "format"),
    ({"what": "steps"}, "what"),
    ({"by": " "}, "by"),
])
def test_a_bad_input_is_refused_before_anything_is_written(runs, clock, kwargs, field):
    out = io.StringIO()
    with pytest.raises(ExportRefused) as caught:
        audit_export(out, **{"by": "auditor", "now": clock.now(), **kwargs})
    assert caught.value.field == field
    assert out.getvalue() == "" and not AuditExport.objects.exists()


def test_filter_times_read_as_utc(database):
    f = export_filters(since="2026-01-01", until="2026-01-01T10:00:00+02:00")
    assert iso_time(f.since) == "2026-01-01T00:00:00.000000+00:00"
    assert iso_time(f.until) == "2026-01-01T08:00:00.000000+00:00"


# -- the command --------------------------------------------------------------------------------


def test_the_command_writes_a_private_file_that_verifies(runs, clock, tmp_path):
    path = tmp_path / "export.jsonl"
    err = io.StringIO()
    call_command("auditexport", "--format", "jsonl", "--out", str(path), "--by", "dora",
                 stderr=err)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    row = AuditExport.objects.get()
    assert row.by == "dora" and row.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert f"export #{row.seq}: {row.rows} events" in err.getvalue()
    cp = tmp_path / "cp.json"
    call_command("auditcheckpoint", "--out", str(cp), stderr=io.StringIO())
    out = io.StringIO()
    call_command("auditexport", "--verify", str(path), "--checkpoint", str(cp), stdout=out)
    assert f"export #{row.seq} by dora" in out.getvalue() and "unaltered" in out.getvalue()
    assert f"{len(runs)} checkpoint heads matched" in out.getvalue()
    # A whole-run export missing a line in the middle of a run: the gap is a problem.
    lines = path.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:2] + lines[3:]))
    out = io.StringIO()
    call_command("auditexport", "--verify", str(cut), stdout=out)  # could be a filtered one
    assert "no export on record" in out.getvalue() and "1 unchecked" in out.getvalue()
    err = io.StringIO()
    with pytest.raises(CommandError, match="problem"):
        call_command("auditexport", "--verify", str(cut), "--whole-runs", stdout=io.StringIO(),
                     stderr=err)
    assert err.getvalue() == "line 3: run 1 event #3 is missing from an export of whole runs\n"


def test_a_file_that_fails_after_its_last_byte_is_not_on_record_as_complete(runs, tmp_path,
                                                                             monkeypatch):
    """The disk full when the file is synced or renamed (after the export read its last row):
    no file, and the record says the export did not complete, as the command says."""
    from runtime.host import files

    def full(temporary, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "publish", full)
    path = tmp_path / "export.csv"
    with pytest.raises(CommandError, match="incomplete export #1"):
        call_command("auditexport", "--out", str(path), "--by", "dora", stderr=io.StringIO())
    assert not path.exists()
    row = AuditExport.objects.get()
    assert not row.complete and row.rows == Event.objects.count()
    assert list(exports_problems()) == []


def test_the_command_refuses_bad_inputs_in_one_line_and_writes_nothing(runs, tmp_path):
    path = tmp_path / "out.csv"
    for args in (["--since", "soon"], ["--run", "x"], ["--checkpoint", "cp.json"]):
        with pytest.raises(CommandError) as caught:
            call_command("auditexport", "--out", str(path), *args)
        assert "\n" not in str(caught.value)
    assert not path.exists() and not AuditExport.objects.exists()
    with pytest.raises(CommandError, match="nothing written"):
        call_command("auditexport", "--out", str(tmp_path / "no-such-dir" / "out.csv"))
    assert not AuditExport.objects.exists()  # it never read a row
    with pytest.raises(CommandError, match="not an events export"):
        junk = tmp_path / "junk.txt"
        junk.write_text("hello\n")
        call_command("auditexport", "--verify", str(junk), stdout=io.StringIO())


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_awkward_text_survives_the_file(database, clock, tmp_path, fmt):
    """Line and paragraph separators, carriage returns, quotes and commas inside a payload."""
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("odd", [FinalAnswer("ok")], ledger)
    with registry.override(agent):
        run = start("odd", {"text": 'a\u2028b\u2029c\nd\re "q", \u00e9 \U0001f600'},
                    created_by="carol", clock=clock)
        resume(run.pk, clock=clock, lease_seconds=5)
    path = tmp_path / f"odd.{fmt}"
    call_command("auditexport", "--format", fmt, "--out", str(path), stderr=io.StringIO())
    out = io.StringIO()
    call_command("auditexport", "--verify", str(path), stdout=out)
    count = Event.objects.filter(run_id=run.pk).count()
    assert f"ok: {count} lines of 1 runs: {count} verified" in out.getvalue()
