"""Signed checkpoints of the audit log, to keep off the database's machine.

Someone who can drop the triggers can rewrite a run's whole chain (or the global one) so that
every hash inside the database follows again. A checkpoint defeats that: it records each run's
chain head and the global chain's head at one moment, signed with an HMAC whose key is not in
the database (``RUNTIME_AUDIT_KEY``). Events are append-only, so every head it names must still
be there with the same hash; with the chains verified, nothing before the checkpoint changed.

No snapshot is needed to take one: each head read is an event that existed when it was read,
and events are never removed, so heads read a little apart are all still facts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction

from runtime.canonical import chain_hash, dumps, iso_time
from runtime.conf import setting
from runtime.errors import AuditKeyError, CheckpointRefused
from runtime.host.files import write_whole
from runtime.models import AuditCheckpoint, Event, PrunedRun, Run, RunCreation
from runtime.storage.creations import creations_head

FORMAT = "runtime-audit-checkpoint"
VERSION = 1
MIN_KEY_LENGTH = 32
MAX_FILE_BYTES = 2 * 1024**3  # 1 M runs take about 80 MB; anything far larger is not ours
_CHUNK = 2000


def audit_key() -> bytes:
    """The signing key from settings (``RUNTIME_AUDIT_KEY``); refused when missing or short."""
    key = str(setting("AUDIT_KEY") or "")
    if len(key) < MIN_KEY_LENGTH:
        raise AuditKeyError(
            "RUNTIME_AUDIT_KEY is not set" if not key else
            f"RUNTIME_AUDIT_KEY is {len(key)} characters; at least {MIN_KEY_LENGTH} are needed")
    return key.encode()


def _sign(body: dict[str, Any], key: bytes) -> str:
    return hmac.new(key, dumps(body).encode(), hashlib.sha256).hexdigest()


def _row_hash(prev: str, fields: dict[str, Any]) -> str:
    return chain_hash(prev, dumps(fields))


def heads_digest(heads: list[list]) -> str:
    """One hash over every run's head, in run id order (what the checkpoint row keeps)."""
    digest = hashlib.sha256()
    for run_id, seq, head in heads:
        digest.update(f"{run_id}:{seq}:{head}\n".encode())
    return digest.hexdigest()


def checkpoint_take(*, by: str, now: datetime, using: str = "default") -> dict[str, Any]:
    """Read every chain head, record the checkpoint in the database and return it signed."""

    key = audit_key()  # refuse before reading anything
    creations = creations_head(using)
    heads: list[list] = []
    runs = Run.objects.using(using).order_by("pk").values_list("pk", "event_seq", "event_hash")
    for run_id, seq, head in runs.iterator(chunk_size=_CHUNK):
        heads.append([run_id, seq, head])
    at = now.astimezone(UTC)
    digest = heads_digest(heads)
    fields = {"at": iso_time(at), "by": by,
              "creations_seq": creations[0], "creations_hash": creations[1],
              "runs": len(heads), "heads_digest": digest}
    try:
        with transaction.atomic(using=using):
            last = AuditCheckpoint.objects.using(using).order_by("-seq").values_list(
                "seq", "hash").first()
            seq, prev = (last[0] + 1, last[1]) if last else (1, "")
            row_hash = _row_hash(prev, {"seq": seq, **fields})
            AuditCheckpoint.objects.using(using).create(
                seq=seq, at=at, by=by, creations_seq=creations[0],
                creations_hash=creations[1], runs=len(heads), heads_digest=digest,
                prev_hash=prev, hash=row_hash)
    except IntegrityError:
        raise CheckpointRefused("", "another checkpoint was taken at the same moment; "
                                "run the command again") from None
    body = {"format": FORMAT, "version": VERSION, "checkpoint": seq, "hash": row_hash,
            **fields, "heads": heads}
    return {**body, "signature": _sign(body, key)}


def checkpoint_write(doc: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the checkpoint to ``path`` (0600, whole or not at all: a temporary file renamed)."""
    write_whole(path, [(json.dumps(doc, separators=(",", ":")) + "\n").encode()])


def checkpoint_load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint file and check its signature; ``CheckpointRefused`` says why not."""
    key = audit_key()
    try:
        size = os.stat(path).st_size
        if size > MAX_FILE_BYTES:
            raise CheckpointRefused(str(path), f"{size} bytes is more than a checkpoint holds")
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise CheckpointRefused(str(path), exc.strerror or str(exc)) from None
    except (ValueError, RecursionError):
        raise CheckpointRefused(str(path), "not a checkpoint file (not JSON)") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointRefused(str(path), "not a checkpoint file")
    if doc.get("version") != VERSION:
        raise CheckpointRefused(str(path), f"checkpoint version {doc.get('version')!r} is not "
                                f"{VERSION}")
    body = {k: v for k, v in doc.items() if k != "signature"}
    try:
        expected = _sign(body, key)
    except (TypeError, ValueError):
        raise CheckpointRefused(str(path), "not a checkpoint file") from None
    if not hmac.compare_digest(expected, str(doc.get("signature", ""))):
        raise CheckpointRefused(str(path), "the signature does not match: the file was altered, "
                                "or RUNTIME_AUDIT_KEY is not the key it was signed with")
    if heads_digest(doc["heads"]) != doc["heads_digest"]:  # signed, so only a bug gets here
        raise CheckpointRefused(str(path), "the heads do not match their digest")
    return doc


def checkpoint_verify(doc: dict[str, Any], using: str = "default") -> Iterator[str]:
    """Every way the database disagrees with a loaded checkpoint. Together with the chains'
    own verification, none means nothing recorded before the checkpoint changed."""

    n = doc["checkpoint"]
    row = AuditCheckpoint.objects.using(using).filter(seq=n).values_list("hash", flat=True).first()
    if row != doc["hash"]:
        yield (f"checkpoint #{n}: " + ("its record is missing from the database" if row is None
                                        else "its record in the database was altered"))
    c_seq, c_hash = doc["creations_seq"], doc["creations_hash"]
    if c_seq:
        found = RunCreation.objects.using(using).filter(seq=c_seq).values_list(
            "hash", flat=True).first()
        if found != c_hash:
            yield (f"global chain: entry #{c_seq} is not the one checkpoint #{n} recorded: "
                   "runs' creations were removed or rewritten")
    heads = doc["heads"]
    for lo in range(0, len(heads), _CHUNK):
        chunk = heads[lo:lo + _CHUNK]
        wanted = {(r, s): h for r, s, h in chunk if s}
        found_hashes = {
            (r, s): h for r, s, h in Event.objects.using(using).filter(
                run_id__in=[r for r, _, _ in chunk], seq__in={s for _, s, _ in chunk}
            ).values_list("run_id", "seq", "hash") if (r, s) in wanted}
        missing = [run_id for (run_id, seq) in wanted if (run_id, seq) not in found_hashes]
        # A run archived and removed by `manage.py prune` is checked against the checkpoint in
        # its archive (`verifyaudit --archive`); here only its recorded head can be.
        pruned = {r: (s, h) for r, s, h in PrunedRun.objects.using(using).filter(
            run_id__in=missing).values_list("run_id", "event_seq", "event_hash")} \
            if missing else {}
        for (run_id, seq), head in wanted.items():
            got = found_hashes.get((run_id, seq))
            if got is None and run_id in pruned:
                last_seq, last_hash = pruned[run_id]
                if last_seq < seq or (last_seq == seq and last_hash != head):
                    yield (f"run {run_id}: pruned with its chain at event #{last_seq}, which "
                           f"does not follow its head at checkpoint #{n} (#{seq})")
            elif got is None:
                yield (f"run {run_id}: event #{seq}, its last at checkpoint #{n}, is gone "
                       "(the run was deleted or rolled back)")
            elif got != head:
                yield (f"run {run_id}: its chain up to event #{seq} differs from checkpoint "
                       f"#{n} (events before the checkpoint were rewritten)")
