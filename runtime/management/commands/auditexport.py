"""``manage.py auditexport``: export events or decisions for an auditor, streamed and on record;
``--verify FILE`` checks such an export by itself, against its record and a checkpoint."""

from __future__ import annotations

import getpass
import hashlib
from collections.abc import Iterator
from typing import IO, Any

from django.core.management.base import BaseCommand, CommandError

from runtime.audit.checkpoint import checkpoint_load
from runtime.audit.export import FORMATS, WHATS, audit_export_stream, export_filters
from runtime.audit.export_check import audit_export_verify
from runtime.clock import SYSTEM_CLOCK
from runtime.errors import AuditKeyError, CheckpointRefused, ExportRefused
from runtime.host.files import write_whole
from runtime.models import AuditExport

MAX_LINE = 256 * 1024 * 1024  # a line longer than any event's is not an export's
# The filters that cut runs into pieces: an export without them holds each run it names whole.
PIECEMEAL = ("since", "until", "actor")


class Command(BaseCommand):
    help = ("Export the audit log's events (or its decisions) for an auditor, as CSV or JSON "
            "lines, streamed, filtered by time, agent, run or actor; each line carries its "
            "chain hash. The export is recorded (who, which rows, the SHA-256 of the bytes). "
            "With --verify FILE, re-chain an events export and compare it with its record and "
            "(--checkpoint) a signed checkpoint's heads; exits non-zero on any problem.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--what", choices=WHATS, default="events")
        parser.add_argument("--format", choices=FORMATS, default="csv")
        parser.add_argument("--since", metavar="ISO", help="from this time (inclusive, UTC "
                            "when no zone is given)")
        parser.add_argument("--until", metavar="ISO", help="to this time (exclusive)")
        parser.add_argument("--agent", help="runs of this agent only")
        parser.add_argument("--run", metavar="ID", help="this run only")
        parser.add_argument("--actor", help="events by this actor (decisions by this person)")
        parser.add_argument("--out", metavar="FILE", default="-",
                            help="write here (0600, whole or not at all); - for stdout")
        parser.add_argument("--by", default="", help="who exports (default: this OS user)")
        parser.add_argument("--verify", metavar="FILE",
                            help="check this events export instead of writing one")
        parser.add_argument("--checkpoint", metavar="FILE",
                            help="with --verify: a file `manage.py auditcheckpoint` wrote "
                                 "(needs RUNTIME_AUDIT_KEY)")
        parser.add_argument("--whole-runs", action="store_true",
                            help="with --verify: the export should hold each of its runs from "
                                 "event #1 without a gap (it had no time or actor filter); "
                                 "implied when the file is an export on record")

    def handle(self, *args: Any, **o: Any) -> None:
        if o["verify"]:
            self._verify(o["verify"], o["checkpoint"], o["whole_runs"])
            return
        if o["checkpoint"] or o["whole_runs"]:
            raise CommandError("--checkpoint and --whole-runs go with --verify FILE")
        try:
            filters = export_filters(since=o["since"], until=o["until"], agent=o["agent"],
                                     run=o["run"], actor=o["actor"])
            # Held: a file is whole only once synced and renamed, after its last chunk.
            stream = audit_export_stream(what=o["what"], format=o["format"], filters=filters,
                                         by=o["by"] or getpass.getuser(),
                                         now=SYSTEM_CLOCK.now(), held=True)
        except ExportRefused as exc:
            raise CommandError(f"auditexport refused: {exc}") from None
        kept = False
        try:
            try:
                if o["out"] == "-":
                    for chunk in stream:
                        self.stdout.write(chunk, ending="")
                else:
                    write_whole(o["out"], (chunk.encode() for chunk in stream))
                kept = True
            finally:
                stream.finish(kept)
        except OSError as exc:
            noted = "" if stream.record is None else (
                f"; on record as incomplete export #{stream.record.seq}")
            raise CommandError(f"{o['out']}: {exc.strerror or exc} (nothing written{noted})"
                               ) from None
        except ExportRefused as exc:
            raise CommandError(str(exc)) from None
        row = stream.record
        assert row is not None, "recorded when the stream ended"
        where = "" if o["out"] == "-" else f" to {o['out']}"
        self.stderr.write(f"export #{row.seq}: {row.rows} {row.what}{where}, sha256 "
                          f"{row.sha256}, last hash {row.last_hash or '-'}")

    def _verify(self, path: str, checkpoint_path: str | None, whole_runs: bool) -> None:
        doc = None
        if checkpoint_path:
            try:
                doc = checkpoint_load(checkpoint_path)
            except (AuditKeyError, CheckpointRefused) as exc:
                raise CommandError(str(exc)) from None
        try:
            digest = _sha256(path)
            record = AuditExport.objects.filter(sha256=digest).order_by("seq").first()
            whole = whole_runs or (record is not None
                                   and not any(k in record.filters for k in PIECEMEAL))
            with open(path, encoding="utf-8", newline="") as fh:
                result = audit_export_verify(_lines(fh, path), doc, whole_runs=whole)
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise CommandError(f"{path}: not UTF-8 text: not an export") from None
        except ExportRefused as exc:
            raise CommandError(f"{path}: {exc}") from None
        for line in result.problems:
            self.stderr.write(line)
        if result.problem_count > len(result.problems):
            self.stderr.write(f"... and {result.problem_count - len(result.problems)} more")
        if record is None:
            self.stdout.write("note: no export on record has this file's SHA-256: it was "
                              "altered, or exported from another database")
        else:
            self.stdout.write(f"export #{record.seq} by {record.by or '-'} at "
                              f"{record.at.isoformat()}: this file, unaltered"
                              + ("" if record.complete else " (stopped part-way)"))
        if not result.ok:
            raise CommandError(f"{result.problem_count} problem(s): {result.summary()}")
        self.stdout.write(f"ok: {result.summary()}")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _lines(fh: IO[str], path: str) -> Iterator[str]:
    """The file's lines, each at most ``MAX_LINE`` characters (a longer one is refused)."""
    number = 0
    while True:
        line = fh.readline(MAX_LINE + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE:
            raise CommandError(f"{path}: line {number} is longer than {MAX_LINE} characters: "
                               "not an export")
        yield line
