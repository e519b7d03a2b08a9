"""One run as the runtime writes it (``Story``), who ran it (``Owners``), and the constants the
data set is drawn from: kept apart from the planning and the writing so what a run's events
look like can be read in one place."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from runtime.canonical import iso_time, request_digest
from runtime.storage.events import EventSpec

SEED = 14
SPAN = timedelta(days=30)  # the runs were created over the last 30 days
LEASE = 30.0
REFUND_LIMIT_CENTS = 15_000  # refund-desk's policy: refunds above 150.00 need a person
USERS = ("alice", "bob", "carol", "dmitri", "erin", "ops-bot")


@dataclass(frozen=True)
class Sizes:
    """The data set's totals, met exactly, and the timed requests per page."""

    runs: int  # every run, the long one included
    pending: int  # runs waiting on a pending approval (one each)
    events: int
    long_steps: int  # the one long run's steps
    reps: int  # timed requests per page


FULL = Sizes(runs=100_000, pending=10_000, events=1_000_000, long_steps=5_000, reps=30)
QUICK = Sizes(runs=2_000, pending=200, events=25_000, long_steps=500, reps=8)

# Shares of the runs (the rest succeeded); of the pending approvals, INTERRUPTED are
# interrupted side effects and the rest policy approvals.
SHARES = {"queued": 0.01, "cancelled": 0.02, "failed": 0.04, "approved": 0.008,
          "resolved": 0.0015}
INTERRUPTED = 0.25
# Agents of the finished runs with no approval, by weight (all registered by default or by
# the bench: see settings.RUNTIME["AGENTS"] and runtime.benchkit.agents).
PLAIN_AGENTS = {"refund-desk": 35, "hello": 20, "bench_read": 15, "bench_write": 10,
                "bench_final": 20}
NATURAL_STEPS = {"refund-desk": 2, "hello": 2, "bench_read": 3, "bench_write": 3,
                 "bench_final": 0}  # tool steps a run of each agent makes when it can
POLICY_STORIES = ("pending_policy", "requeued", "cancelled_waiting", "rejected", "approved")
MAX_EXTRA = 3  # tool steps a bench_read or bench_write run may get to meet the event total

CUSTOMERS = [("Ada Lovelace", "ada@example.com"), ("Grace Hopper", "grace@example.com"),
             ("Alan Turing", "alan@example.com"), ("Edsger Dijkstra", "edsger@example.com"),
             ("Barbara Liskov", "barbara@example.com"), ("Donald Knuth", "don@example.com"),
             ("Margaret Hamilton", "margaret@example.com"), ("Ken Thompson", "ken@example.com")]
ITEMS = [("Walnut desk, 160 x 80 cm", "WD-160-80", 34_900),
         ("Ergonomic chair, graphite", "EC-GR-02", 28_900),
         ("Bookshelf, oak, 5 shelves", "BO-5-OAK", 21_900),
         ("Monitor arm, dual", "MA-D-01", 8_900), ("Desk lamp, brass", "DL-BR-01", 6_900),
         ("Standing mat, 90 x 60 cm", "SM-90-60", 4_900)]
CHEAP = [i for i in ITEMS if i[2] <= REFUND_LIMIT_CENTS]
DEAR = [i for i in ITEMS if i[2] > REFUND_LIMIT_CENTS]
REASONS = ["Arrived damaged: the left leg was split along the grain.",
           "Wrong colour delivered (ordered graphite, received beige).",
           "The customer changed their mind within the 30-day window.",
           "Parcel lost in transit according to the carrier's tracking.",
           "Duplicate order placed by mistake; the customer kept the first one."]
LANGUAGES = {"en": "Hello", "fr": "Bonjour", "de": "Hallo"}
LLM_ERRORS = ["LLM HTTP 400: context_length_exceeded: this model's maximum context length is "
              "128000 tokens", "LLM HTTP 401: invalid_api_key: Incorrect API key provided",
              "ReadTimeout: the LLM did not answer within 60 s"]


def long_duration(steps: int) -> timedelta:
    """How long ago the long run started: ~3 s a step, its approvals decided in seconds."""
    return timedelta(seconds=3.2 * steps + 1_800)


class Teller(Protocol):
    """What a story needs of whoever tells it (the builder): the shared seeded random source,
    the present, and approval ids unique across the data set. A protocol, so this module need
    not import the builder that imports it."""

    rng: random.Random
    now: datetime

    def next_approval(self) -> int: ...


class Owners:
    """The lease owners seen in the audit log: a few live workers (with rows in the workers
    table), a few dead ones that still have rows, a couple of dozen recent ones and ~200 long
    gone; each was the owner of the runs of its own stretch of time."""

    def __init__(self, rng: random.Random) -> None:
        def owner(host: str) -> str:
            return f"worker@{host}:{rng.randint(2_000, 4_000_000)}:{rng.getrandbits(32):08x}"

        hosts = [f"worker-{n:02d}" for n in range(1, 9)]
        self.dead = [owner(hosts[n % 8]) for n in range(200)]
        self.recent = [owner(hosts[n % 8]) for n in range(20)]
        self.live = [owner(hosts[n]) for n in range(4)]
        self.dead_rows = self.recent[-3:]  # died lately: their rows are still there
        self.hosts = hosts

    def at(self, rng: random.Random, frac: float) -> str:
        """Who ran a run created at ``frac`` of the timeline (0 oldest, 1 newest)."""
        if frac < 0.85:
            pool, pos = self.dead, frac / 0.85
        else:
            pool, pos = self.recent[:-3] + self.live, (frac - 0.85) / 0.15
        i = min(len(pool) - 1, max(0, int(pos * len(pool)) + rng.randint(-2, 1)))
        return pool[i]

    def all(self) -> list[str]:
        return self.dead + self.recent + self.live


class Story:
    """One run as the runtime writes it: the row, its steps, its approvals and its events,
    committed in groups (one time and one actor per commit, as a plan is committed)."""

    def __init__(self, b: Teller, run_id: int, agent: str, created: datetime, creator: str,
                 data: Any) -> None:
        self.b, self.id, self.agent, self.rng = b, run_id, agent, b.rng
        self.t = self.created = created
        self.creator, self.input = creator, data
        self.commits: list[tuple[datetime, str, list[EventSpec]]] = []
        self.steps: list[dict[str, Any]] = []
        self.approvals: list[dict[str, Any]] = []
        self.epoch, self.owner, self.started = 0, "", False
        self.llm_requests = self.tokens_in = self.tokens_out = 0
        self.cost = Decimal(0)
        self.row: dict[str, Any] = {"status": "queued"}
        self.commit(creator, ("run.created", {"agent": agent, "input": data,
                                               "created_by": creator}, None))

    # time and commits
    def later(self, lo: float, hi: float) -> None:
        self.t += timedelta(seconds=self.rng.uniform(lo, hi))

    def commit(self, actor: str, *events: tuple[str, Any, int | None]) -> None:
        self.commits.append((self.t, actor, [EventSpec(k, p, i) for k, p, i in events]))

    # leases
    def take(self, owner: str) -> None:
        self.later(0.05, 2.0)
        self.epoch += 1
        self.owner = owner
        self.commit(owner, ("lease.taken", {"owner": owner, "epoch": self.epoch,
                                            "lease_seconds": LEASE}, None),
                    ("run.resumed" if self.started else "run.started", {"owner": owner}, None))
        self.started = True
        self.row["status"] = "running"

    def take_over(self, owner: str, step: dict[str, Any]) -> None:
        """The owner died mid-call; after its lease expired another took the run over."""
        previous, expired = self.owner, self.t + timedelta(seconds=LEASE)
        self.t = expired + timedelta(seconds=self.rng.uniform(0.2, 4.0))
        self.epoch += 1
        self.owner = owner
        step["status"] = "interrupted"
        self.commit(owner, ("lease.taken_over", {
            "owner": owner, "epoch": self.epoch, "lease_seconds": LEASE,
            "previous_owner": previous, "previous_epoch": self.epoch - 1,
            "previous_expires_at": iso_time(expired),
            "reason": "lease expired"}, None),
            ("run.resumed", {"owner": owner, "after": "takeover"}, None),
            ("step.interrupted", {
                "was": "executing", "tool": step["tool"], "effect": step["effect"],
                "attempt": step["attempt"], "previous_owner": previous,
                "dispatched": step["dispatched_attempt"] == step["attempt"]}, step["index"]))

    def released(self, status: str) -> tuple[str, Any, None]:
        event = ("lease.released", {"owner": self.owner, "epoch": self.epoch}, None)
        self.row["status"] = status
        self.owner = ""
        return event

    # steps
    def start_step(self) -> dict[str, Any]:
        """``step.started`` and ``llm.requested``, one commit."""
        index = len(self.steps) + 1
        key = f"run{self.id}-step{index}-{self.rng.getrandbits(48):012x}"
        self.later(0.01, 0.4)
        step = {"index": index, "status": "deciding", "tool": "", "arguments": None,
                "effect": "", "idempotency_key": key, "result": None, "error": "", "attempt": 0,
                "dispatches": False, "dispatched_attempt": None, "started_at": self.t,
                "finished_at": None}
        self.steps.append(step)
        self.llm_requests += 1
        self.commit(self.owner, ("step.started", {"idempotency_key": key}, index),
                    ("llm.requested", {"request": self.llm_requests}, index))
        return step

    def _responded(self, step: dict[str, Any]) -> tuple[str, Any, int]:
        self.later(0.4, 3.5)
        tokens_in = 900 + 350 * step["index"] + self.rng.randint(0, 400)
        tokens_out = self.rng.randint(30, 220)
        cost = (Decimal(tokens_in * 150 + tokens_out * 600) / 1_000_000_000).quantize(
            Decimal("0.000001"))
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cost += cost
        return ("llm.responded", {"tokens_in": tokens_in, "tokens_out": tokens_out,
                                  "cost": str(cost), "decisions": 1}, step["index"])

    def decide(self, step: dict[str, Any], tool: str, arguments: Any, effect: str,
               *more: tuple[str, Any, int | None]) -> None:
        """``llm.responded`` and ``step.decided`` (and what follows in the same commit)."""
        step.update(tool=tool, arguments=arguments, effect=effect)
        self.commit(self.owner, self._responded(step), ("step.decided", {
            "tool": tool, "arguments": arguments, "effect": effect,
            "idempotency_key": step["idempotency_key"]}, step["index"]), *more)

    def start_tool(self, step: dict[str, Any], dispatches: bool = False,
                   approval: dict[str, Any] | None = None, decided: bool = False) -> None:
        """``step.tool_started`` (after ``approval.consumed`` when a person approved it); in
        the commit of ``step.decided`` unless ``decided`` is False."""
        step["attempt"] += 1
        step.update(status="executing", dispatches=dispatches)
        events: list[tuple[str, Any, int | None]] = []
        if approval is not None:
            events.append(("approval.consumed", {"approval_id": approval["id"],
                                                 "kind": approval["kind"],
                                                 "decided_by": approval["decided_by"]},
                           step["index"]))
        events.append(("step.tool_started", {"tool": step["tool"], "effect": step["effect"],
                                             "attempt": step["attempt"],
                                             "dispatches": dispatches}, step["index"]))
        if decided:
            self.commits[-1][2].extend(EventSpec(k, p, i) for k, p, i in events)
        else:
            self.later(0.01, 0.2)
            self.commit(self.owner, *events)
        if approval is not None:  # at the time of the commit that consumed it
            approval.update(status="consumed", consumed_at=self.commits[-1][0])
        if dispatches:
            self.later(0.001, 0.02)
            step["dispatched_attempt"] = step["attempt"]
            self.commit(self.owner, ("step.tool_dispatched", {"attempt": step["attempt"]},
                                     step["index"]))

    def finish_tool(self, step: dict[str, Any], result: Any) -> None:
        self.later(0.02, 1.5)
        step.update(status="succeeded", result=result, finished_at=self.t)
        self.commit(self.owner, ("step.tool_finished", {"attempt": step["attempt"],
                                                        "result": result}, step["index"]))

    def tool_step(self, tool: str, arguments: Any, effect: str, result: Any,
                  dispatches: bool = False) -> dict[str, Any]:
        step = self.start_step()
        self.decide(step, tool, arguments, effect)
        self.start_tool(step, dispatches, decided=True)
        self.finish_tool(step, result)
        return step

    def succeed(self, output: Any) -> None:
        """The final answer: a step deciding it, the run succeeded, the lease released."""
        step = self.start_step()
        self.later(0.4, 3.0)
        responded = self._responded(step)  # moves the clock to the commit's time
        step.update(status="succeeded", result=output, finished_at=self.t)
        self.commit(self.owner, responded,
                    ("step.decided", {"final": True, "output": output}, step["index"]),
                    ("run.succeeded", {"output": output}, None), self.released("succeeded"))
        self.row["output"] = output

    def fail_llm(self) -> None:
        step = self.start_step()
        self.later(0.5, 60)
        message = self.rng.choice(LLM_ERRORS)
        step.update(status="failed", error=message, finished_at=self.t)
        self.row.update(failure_code="error", failure_message=f"LLM request failed: {message}")
        self.commit(self.owner, ("llm.failed", {"error": message, "attempt": 1,
                                                "retryable": False}, step["index"]),
                    ("run.failed", {"code": "error",
                                    "message": f"LLM request failed: {message}"}, None),
                    self.released("failed"))

    # approvals
    def pause(self, step: dict[str, Any], kind: str, title: str, detail: str) -> dict[str, Any]:
        """The request put to a person: ``approval.requested``, the run waiting."""
        if kind == "policy":
            self.later(0.001, 0.05)
        digest = request_digest(step["tool"], step["arguments"], step["effect"])
        approval = {"id": self.b.next_approval(), "step": step, "kind": kind,
                    "status": "pending", "tool": step["tool"], "arguments": step["arguments"],
                    "effect": step["effect"], "digest": digest, "title": title[:300],
                    "detail": detail, "created_at": self.t, "decided_by": "",
                    "decided_at": None, "note": "", "result": None, "consumed_at": None}
        self.approvals.append(approval)
        step["status"] = "waiting" if kind == "policy" else "interrupted"
        self.commit(self.owner, ("approval.requested", {
            "kind": kind, "title": approval["title"], "tool": step["tool"],
            "arguments": step["arguments"], "effect": step["effect"], "digest": digest,
            "attempt": step["attempt"], "idempotency_key": step["idempotency_key"],
            "approval_id": approval["id"]}, step["index"]),
            ("run.paused", {"reason": kind}, step["index"]), self.released("waiting"))
        return approval

    def decide_approval(self, approval: dict[str, Any], status: str, note: str = "",
                        result: Any = None, within: tuple[float, float] = (30, 7_200)) -> str:
        """A person decides, some time later (before now); returns who."""
        room = max(1.0, (self.b.now - self.t).total_seconds() * 0.3)
        self.t += timedelta(seconds=min(self.rng.uniform(*within), room))
        by = self.rng.choice([u for u in USERS[:5] if u != self.creator])
        approval.update(status=status, decided_by=by, decided_at=self.t, note=note)
        step = approval["step"]
        base = {"approval_id": approval["id"], "kind": approval["kind"], "decided_by": by,
                "note": note}
        if status == "approved":
            self.commit(by, ("approval.granted", base, step["index"]))
            self.row["status"] = "queued"
        elif status == "resolved":
            approval["result"] = result
            step.update(status="succeeded", result=result, finished_at=self.t)
            self.commit(by, ("approval.resolved", {**base, "result": result}, step["index"]),
                        ("step.tool_finished", {"result": result, "attempt": step["attempt"],
                                                "recovered_by": by}, step["index"]))
            self.row["status"] = "queued"
        elif status == "rejected":
            message = f"rejected by {by}: {note}"
            step.update(status="rejected", finished_at=self.t)
            self.row.update(status="failed", failure_code="rejected", failure_message=message)
            self.commit(by, ("approval.rejected", base, step["index"]),
                        ("run.failed", {"code": "rejected", "message": message}, None))
        return by

    def cancel(self, reason: str) -> None:
        room = max(1.0, (self.b.now - self.t).total_seconds() * 0.3)
        self.t += timedelta(seconds=min(self.rng.uniform(60, 3_600), room))
        by = self.rng.choice(USERS[:5])
        events: list[tuple[str, Any, int | None]] = []
        for a in self.approvals:
            if a["status"] == "pending":
                a.update(status="cancelled", decided_by=by, decided_at=self.t, note=reason)
                events.append(("approval.cancelled", {"approval_id": a["id"],
                                                      "reason": "run cancelled"},
                               a["step"]["index"]))
        events.append(("run.cancelled", {"by": by, "reason": reason}, None))
        self.commit(by, *events)
        self.row["status"] = "cancelled"
