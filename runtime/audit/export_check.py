"""Checking an events export by itself, and against a signed checkpoint.

An export is read in its own order (runs ascending, each run's events by seq). Each run's
lines fall into pieces of consecutive events. A piece's lines are re-hashed one after the
other: line k's hash must be the hash of line k's fields after line k-1's hash. What the
pieces prove depends on where they are anchored:

* a piece that starts at event #1 starts from the empty hash: every line in it is proved by
  the export alone (``verified``);
* a piece that reaches an event whose head a checkpoint recorded, with the same hash, is
  proved from its second line on: the chain runs from the line to a head signed elsewhere
  (``verified``); its first line's hash is proved too, but not its fields, which were hashed
  after an event the export does not hold (``unchecked``);
* any other piece only links line to line (``linked``): consistent with itself, but it takes
  the database (``verifyaudit``) or a later checkpoint to show it belongs to the chain.

Memory is one run's state and the checkpoint's heads, however long the export.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from runtime.audit.export import DECISION_FIELDS, EVENT_FIELDS
from runtime.canonical import chain_hash, dumps
from runtime.errors import ExportRefused

MAX_PROBLEMS = 100  # kept word for word; the rest are counted
MAX_FIELD = 256 * 1024 * 1024  # a CSV payload cell (payloads are capped far below this)


@dataclass
class ExportCheck:
    """What ``audit_export_verify`` found. ``ok`` is no problem; ``verified`` lines are proved
    (from event #1 or a checkpoint's head), ``linked`` only chain to each other, ``unchecked``
    open a piece whose previous hash the export does not hold."""

    lines: int = 0
    runs: int = 0
    verified: int = 0
    linked: int = 0
    unchecked: int = 0
    heads: int = 0  # checkpoint heads the export reached, with the checkpoint's hash
    problem_count: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def problem(self, line: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(line)

    def summary(self) -> str:
        return (f"{self.lines} lines of {self.runs} runs: {self.verified} verified, "
                f"{self.linked} linked only, {self.unchecked} unchecked; {self.heads} "
                f"checkpoint heads matched; {self.problem_count} problem(s)")


@dataclass
class _Piece:
    run: int
    next_seq: int
    prev: str
    anchored: bool  # proved up to here (from event #1, or a checkpoint head met)
    pending: int = 0  # lines linked but not yet proved


def _events(lines: Iterable[str], out: ExportCheck) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, event fields) for each line; a line that is not an event is a problem."""
    it = iter(lines)
    first = next(it, None)
    while first is not None and not first.strip():
        first = next(it, None)
    if first is None:
        return
    if first.lstrip().startswith("{"):
        for number, text in enumerate(chain([first], it), start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except ValueError:
                out.problem(f"line {number}: not JSON")
                continue
            if not isinstance(row, dict) or set(row) != set(EVENT_FIELDS):
                if isinstance(row, dict) and set(row) == set(DECISION_FIELDS):
                    raise ExportRefused("", _DECISIONS)
                out.problem(f"line {number}: not an event line (its keys are not "
                            f"{', '.join(EVENT_FIELDS)})")
                continue
            yield number, row
        return
    limit = csv.field_size_limit()
    csv.field_size_limit(min(MAX_FIELD, sys.maxsize))
    try:
        reader = csv.reader(chain([first], it))
        header = next(reader)
        if tuple(header) == DECISION_FIELDS:
            raise ExportRefused("", _DECISIONS)
        if tuple(header) != EVENT_FIELDS:
            raise ExportRefused("", "not an events export: its first line is neither a JSON "
                                f"line nor the CSV header {','.join(EVENT_FIELDS)}")
        for cells in reader:
            number = reader.line_num
            if len(cells) != len(EVENT_FIELDS):
                out.problem(f"line {number}: {len(cells)} cells, not {len(EVENT_FIELDS)}")
                continue
            try:
                row = dict(zip(EVENT_FIELDS, cells, strict=True))
                row["run"], row["seq"] = int(cells[0]), int(cells[1])
                row["step"] = None if cells[2] == "" else int(cells[2])
                row["payload"] = json.loads(cells[6])
            except ValueError:
                out.problem(f"line {number}: a run, seq or step that is not a number, or a "
                            "payload that is not JSON")
                continue
            yield number, row
    except csv.Error as exc:
        out.problem(f"line {reader.line_num}: not CSV ({exc})")
    finally:
        csv.field_size_limit(limit)


_DECISIONS = ("a decisions export has no chain of its own to recompute: each line names the "
              "event that recorded the decision (run, event_seq, event_hash); verify an "
              "events export of the same runs, or the database with `verifyaudit`")


def _heads(checkpoint: dict[str, Any] | None) -> dict[int, tuple[int, str]]:
    if checkpoint is None:
        return {}
    return {int(r): (int(s), str(h)) for r, s, h in checkpoint["heads"] if s}


def audit_export_verify(lines: Iterable[str], checkpoint: dict[str, Any] | None = None, *,
                        whole_runs: bool = False) -> ExportCheck:
    """Re-chain an events export (CSV or JSON lines, as ``audit_export`` writes them) and,
    given a loaded checkpoint (``checkpoint_load``, signature checked), compare every head it
    recorded that the export reaches. Problems are lines whose hash does not follow, lines out
    of order, heads that differ and, for an export of ``whole_runs`` (no time or actor filter),
    events missing from a run. ``ExportRefused`` for a file that is no events export."""
    out = ExportCheck()
    heads = _heads(checkpoint)
    piece: _Piece | None = None
    last_run = -1
    for number, row in _events(lines, out):
        out.lines += 1
        run, seq, stated = row["run"], row["seq"], row["hash"]
        if not isinstance(run, int) or not isinstance(seq, int) or not isinstance(stated, str):
            out.problem(f"line {number}: run, seq or hash of the wrong type")
            continue
        if run < last_run or (piece is not None and run == piece.run and seq < piece.next_seq):
            out.problem(f"line {number}: run {run} event #{seq} is out of order (the export "
                        "runs by run id, then sequence): lines were moved or repeated")
            continue
        if piece is None or run != piece.run or seq != piece.next_seq:
            if piece is not None:
                _close(piece, out)
            if run != last_run:
                out.runs += 1
                last_run = run
            if whole_runs:
                first = piece.next_seq if piece is not None and piece.run == run else 1
                if seq != first:
                    gone = f"event #{first} is" if seq == first + 1 else \
                        f"events #{first}..#{seq - 1} are"
                    out.problem(f"line {number}: run {run} {gone} missing from an export of "
                                "whole runs")
            piece = _Piece(run, seq + 1, stated, anchored=seq == 1)
            if seq == 1:
                _link(piece, row, "", number, out)
            else:
                out.unchecked += 1
            _head(piece, seq, stated, heads, checkpoint, number, out)
            continue
        _link(piece, row, piece.prev, number, out)
        piece.next_seq, piece.prev = seq + 1, stated
        _head(piece, seq, stated, heads, checkpoint, number, out)
    if piece is not None:
        _close(piece, out)
    return out


def _link(piece: _Piece, row: dict[str, Any], prev: str, number: int,
          out: ExportCheck) -> None:
    """Line ``row`` re-hashed after ``prev``: the line without its hash is what was hashed."""
    body = {k: row[k] for k in EVENT_FIELDS if k != "hash"}
    try:
        want = chain_hash(prev, dumps(body))
    except (TypeError, ValueError):
        want = ""
    if want != row["hash"]:
        out.problem(f"line {number}: run {row['run']} event #{row['seq']} ({row['kind']}) does "
                    "not hash after the line before: the line was altered, or lines were "
                    "removed or reordered")
    if piece.anchored:
        out.verified += 1
    else:
        piece.pending += 1


def _head(piece: _Piece, seq: int, stated: str, heads: dict[int, tuple[int, str]],
          checkpoint: dict[str, Any] | None, number: int, out: ExportCheck) -> None:
    head = heads.get(piece.run)
    if head is None or head[0] != seq:
        return
    if head[1] != stated:
        out.problem(f"line {number}: run {piece.run} event #{seq} is not the head checkpoint "
                    f"#{checkpoint['checkpoint'] if checkpoint else '?'} recorded: the chain "
                    "was rewritten, or the line altered")
        return
    out.heads += 1
    piece.anchored = True
    out.verified += piece.pending
    piece.pending = 0


def _close(piece: _Piece, out: ExportCheck) -> None:
    out.linked += piece.pending
    piece.pending = 0
