"""The builder: plans the runs, tells each one's story and writes its rows (runs, steps,
approvals, events with their hash chain, then the workers), and sums up what it wrote for the
report and for finding the pages' ids."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from runtime.benchkit.pages.loaders import Table
from runtime.benchkit.pages.plan import Planner
from runtime.benchkit.pages.stories import LEASE, SEED, Owners, Sizes, Story
from runtime.canonical import dumps
from runtime.models import Approval, Event, Run, RunCreation, Step, Worker
from runtime.storage.creations import creation_hash
from runtime.storage.events import build_events


class Builder(Planner):
    """Plans the runs (what each did, within the totals asked), then writes them in order."""

    def __init__(self, loader: Any, sizes: Sizes, now: datetime) -> None:
        self.loader, self.sizes, self.now = loader, sizes, now
        self.rng = random.Random(SEED)
        self.owners = Owners(self.rng)
        self.tables = {m: Table(m) for m in (Run, Step, Approval, Event, RunCreation, Worker)}
        self._approval_id = 0
        self.counts: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.actors: set[str] = set()
        self.payload_bytes = 0
        self.ids: dict[str, Any] = {}
        self.held: Counter[str] = Counter()
        self._counts: dict[tuple, int] = {}

    # -- writing ---------------------------------------------------------------------------

    def build(self, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Plan, then write every run in id order, many runs per transaction."""
        shapes = self.plan()
        self._approval_id = 0
        self.rng = random.Random(SEED + 2)
        dt = self.loader.dt
        step_id = event_id = 0
        t_run, t_step, t_approval, t_event, t_creation = (
            self.tables[m] for m in (Run, Step, Approval, Event, RunCreation))
        chunk = 2_000
        creations = ""  # the global chain's head
        for lo in range(0, len(shapes), chunk):
            rows: dict[Table, list[tuple]] = {t_run: [], t_step: [], t_approval: [],
                                              t_event: [], t_creation: []}
            for run_id in range(lo + 1, min(lo + chunk, len(shapes)) + 1):
                shape = shapes[run_id - 1]
                st = self.story(run_id, shape, run_id / len(shapes))
                seq, head = 0, ""
                for at, actor, specs in st.commits:
                    built, seq, head = build_events(run_id, seq, head, specs, actor, at)
                    if built[0].seq == 1:
                        creations = creation_hash(
                            creations, seq=run_id, run_id=run_id, agent=st.agent,
                            created_by=st.creator, at=st.created, first_hash=built[0].hash)
                        rows[t_creation].append(t_creation.row({
                            "id": run_id, "seq": run_id, "run_id": run_id, "agent": st.agent,
                            "created_by": st.creator, "at": dt(st.created),
                            "first_hash": built[0].hash, "hash": creations}))
                    at_db = dt(at)
                    for e in built:
                        event_id += 1
                        rows[t_event].append(t_event.row({
                            "id": event_id, "run_id": run_id, "step_index": e.step_index,
                            "seq": e.seq, "kind": e.kind, "payload": e.payload_text,
                            "actor": e.actor, "at": at_db, "hash": e.hash}))
                        self.kinds[e.kind] += 1
                        self.payload_bytes += len(e.payload_text)
                    self.actors.add(actor)
                for s in st.steps:
                    step_id += 1
                    s["id"] = step_id
                    rows[t_step].append(t_step.row({
                        **s, "run_id": run_id, "arguments": _json(s["arguments"]),
                        "result": _json(s["result"]), "dispatches": int(s["dispatches"]),
                        "started_at": dt(s["started_at"]), "finished_at": dt(s["finished_at"])}))
                for a in st.approvals:
                    rows[t_approval].append(t_approval.row({
                        **a, "run_id": run_id, "step_id": a["step"]["id"],
                        "arguments": dumps(a["arguments"]), "result": _json(a["result"]),
                        "created_at": dt(a["created_at"]), "decided_at": dt(a["decided_at"]),
                        "consumed_at": dt(a["consumed_at"])}))
                    self.counts[f"approvals {a['kind']} {a['status']}"] += 1
                    self._note_approval(st, shape, a)
                r = st.row
                rows[t_run].append(t_run.row({
                    **r, "id": run_id, "agent": st.agent, "input": dumps(st.input),
                    "output": _json(r.get("output")), "lease_epoch": st.epoch,
                    "lease_expires_at": dt(r.get("lease_expires_at")), "event_seq": seq,
                    "event_hash": head, "llm_requests": st.llm_requests,
                    "tokens_in": st.tokens_in, "tokens_out": st.tokens_out,
                    "cost": str(st.cost), "created_by": st.creator,
                    "created_at": dt(st.created), "updated_at": dt(st.commits[-1][0])}))
                self.counts[f"runs {r['status']}"] += 1
                if r.get("lease_owner"):
                    self.held[r["lease_owner"]] += 1
                self._note_run(st, shape, seq)
            self.loader.write(rows)
            if progress is not None and (lo // chunk) % 10 == 9:
                progress(f"{min(lo + chunk, len(shapes)):,} runs, {event_id:,} events")
        self.loader.write({self.tables[Worker]: self._workers()})
        self.counts["runs"] = len(shapes)
        self.counts["events"] = event_id
        self.counts["steps"] = step_id
        self.counts["approvals"] = self._approval_id
        return self.summary()

    def _note_run(self, st: Story, shape: tuple, events: int) -> None:
        kind, agent = shape[0], shape[1]
        if kind == "long":
            self.ids.update(long_run=st.id, long_run_steps=len(st.steps),
                            long_run_events=events)
        elif kind == "plain" and agent == "refund-desk" and shape[2] == 2 and (
                "short_run" not in self.ids or self.ids["short_run"] < self.sizes.runs // 2):
            self.ids.update(short_run=st.id, short_run_steps=len(st.steps),
                            short_run_events=events)

    def _note_approval(self, st: Story, shape: tuple, a: dict[str, Any]) -> None:
        if a["status"] == "pending" and a["kind"] == "interrupted_side_effect" and \
                shape[1] == "refund-desk" and "pending_interrupted" not in self.ids:
            self.ids["pending_interrupted"] = a["id"]
        elif a["status"] == "consumed" and a["kind"] == "policy":
            if shape[0] == "long":
                self.ids["decided_policy_long"] = a["id"]
                self.ids["decided_policy_long_step"] = a["step"]["index"]
            elif "decided_policy" not in self.ids or (
                    shape[1] == "refund-desk" and not self.ids["decided_policy_refund"]):
                self.ids["decided_policy"] = a["id"]
                self.ids["decided_policy_refund"] = shape[1] == "refund-desk"

    def _workers(self) -> list[tuple]:
        table, dt, rng = self.tables[Worker], self.loader.dt, self.rng
        rows = []
        for n, owner in enumerate(self.owners.live + self.owners.dead_rows):
            host, pid = owner.split("@")[1].split(":")[:2]
            dead = owner in self.owners.dead_rows
            beat = self.now - timedelta(minutes=10 if dead else 0, seconds=rng.uniform(0, 2))
            rows.append(table.row({
                "id": n + 1, "owner": owner, "name": "worker", "host": host, "pid": int(pid),
                "boot_id": f"{rng.getrandbits(128):032x}", "proc_start": rng.randint(10**5, 10**8),
                "lease_seconds": LEASE, "started_at": dt(self.now - timedelta(hours=6 + n)),
                "heartbeat_at": dt(beat), "concurrency": 8, "runs_held": self.held[owner]}))
        self.counts["workers live"] = len(self.owners.live)
        self.counts["workers dead"] = len(self.owners.dead_rows)
        return rows

    def summary(self) -> dict[str, Any]:
        c = self.counts
        owners = set(self.owners.all())
        return {
            "runs": c["runs"], "steps": c["steps"], "events": c["events"],
            "approvals": c["approvals"], "pending": c["approvals policy pending"]
            + c["approvals interrupted_side_effect pending"],
            "workers": c["workers live"] + c["workers dead"],
            "workers_live": c["workers live"], "workers_dead": c["workers dead"],
            "runs_by_status": {k.split()[1]: v for k, v in sorted(c.items())
                               if k.startswith("runs ")},
            "approvals_by_kind_status": {k.removeprefix("approvals "): v
                                         for k, v in sorted(c.items())
                                         if k.startswith("approvals ")},
            "event_kinds": dict(self.kinds.most_common()),
            "actors": len(self.actors), "worker_owners": len(self.actors & owners),
            "people": len(self.actors - owners),
            "dead_owners": len(self.actors & set(self.owners.dead)),
            "payload_bytes_avg": round(self.payload_bytes / max(1, c["events"]), 1),
            **self.ids,
        }


def _json(value: Any) -> str | None:
    return None if value is None else dumps(value)
