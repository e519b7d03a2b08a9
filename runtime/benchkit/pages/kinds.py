"""What each kind of run does (``_<kind>`` methods) and the tool calls, orders and outputs they
are made of: the builder's storytelling half, a base class apart from the planning and the
writing because it is most of the builder's code."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from runtime.benchkit.pages.stories import (
    CHEAP,
    CUSTOMERS,
    DEAR,
    LANGUAGES,
    LEASE,
    POLICY_STORIES,
    REASONS,
    REFUND_LIMIT_CENTS,
    SPAN,
    USERS,
    Owners,
    Sizes,
    Story,
    long_duration,
)
from runtime.effects import Effect


class StoryKinds:
    """Tells one run's story from its shape; ``Builder`` sets the state used here (its
    ``__init__``), the plan chooses the shapes."""

    rng: random.Random
    now: datetime
    sizes: Sizes
    owners: Owners
    _approval_id: int

    def next_approval(self) -> int:
        self._approval_id += 1
        return self._approval_id

    # -- the stories -----------------------------------------------------------------------

    def story(self, run_id: int, shape: tuple, frac: float) -> Story:
        kind, agent, k, j = shape
        rng = self.rng
        created = self.now - SPAN * (1 - frac) - timedelta(seconds=90)
        if kind == "long":
            created = self.now - long_duration(k)
        elif kind == "running_dead":  # its worker died 10 minutes ago, mid-run
            created = self.now - timedelta(minutes=11)
        creator = rng.choice(USERS)
        order = self._order(rng, dear=kind in POLICY_STORIES)
        data: Any = {}
        if agent == "refund-desk":
            data = {"order_id": order["order_id"], "reason": rng.choice(REASONS)}
            if kind == "long":
                data = {"batch": "returns-2026-11", "orders": k // 2,
                        "instructions": "Refund every approved return in the batch; mail "
                                        "nobody, the shop's nightly mailer does that."}
        elif agent == "hello":
            name = rng.choice(CUSTOMERS)[0].split()[0]
            data = {"name": name, "language": rng.choice(list(LANGUAGES))}
        elif agent in ("bench_read", "bench_write"):
            data = {"steps": k}
        st = Story(self, run_id, agent, created, creator, data)
        getattr(self, f"_{kind}")(st, agent, k, j, order, frac)
        return st

    @staticmethod
    def _order(rng: random.Random, dear: bool = False) -> dict[str, Any]:
        """An order as ``lookup_order`` returns it; ``dear`` ones need a person's approval
        to be refunded (refund-desk's policy), the others do not."""
        item, sku, cents = rng.choice(DEAR if dear else CHEAP)
        customer, email = rng.choice(CUSTOMERS)
        order_id = rng.randint(10_000, 99_999)
        placed = datetime(2026, 10, 1, tzinfo=UTC) + timedelta(minutes=rng.randint(0, 60_000))
        return {"order_id": order_id, "customer": customer, "email": email, "item": item,
                "amount_cents": cents, "currency": "EUR", "status": "delivered",
                "placed_at": placed.isoformat(timespec="seconds"),
                "lines": [{"sku": sku, "description": item, "qty": 1, "unit_cents": cents}],
                "shipping": {"carrier": rng.choice(["DHL", "UPS", "GLS"]),
                             "tracking": f"JD{rng.getrandbits(60):018d}",
                             "delivered_at": (placed + timedelta(days=3)).isoformat(
                                 timespec="seconds")}}

    def _read(self, st: Story, agent: str, n: int, order: dict[str, Any]) -> dict[str, Any]:
        """The agent's read-only tool, once."""
        if agent == "refund-desk":
            return st.tool_step("lookup_order", {"order_id": order["order_id"]}, Effect.READ_ONLY,
                                order)
        if agent == "hello":
            lang = st.input["language"]
            return st.tool_step("look_up_greeting", {"language": lang}, Effect.READ_ONLY,
                                LANGUAGES[lang])
        return st.tool_step("bench_read", {"n": n}, Effect.READ_ONLY, {"n": n})

    def _write_request(self, st: Story, agent: str, order: dict[str, Any],
                       n: int = 1) -> tuple[str, dict[str, Any], bool]:
        """(tool, arguments, dispatches) of the agent's side effect."""
        if agent == "refund-desk":
            return "issue_refund", {"order_id": order["order_id"],
                                    "amount_cents": order["amount_cents"]}, True
        if agent == "hello":
            return "send_greeting", {"name": st.input["name"],
                                     "greeting": LANGUAGES[st.input["language"]]}, False
        return "bench_write", {"n": n}, False

    def _write_result(self, st: Story, agent: str, order: dict[str, Any],
                      step: dict[str, Any]) -> Any:
        key = step["idempotency_key"]
        if agent == "refund-desk":
            return {"refund_id": f"re_{self.rng.getrandbits(96):024x}", "status": "succeeded",
                    "amount_cents": order["amount_cents"], "currency": "EUR", "key": key}
        if agent == "hello":
            return {"sent": f"{step['arguments']['greeting']}, {st.input['name']}!",
                    "key": key}
        return {"n": step["arguments"]["n"]}

    def _policy_title(self, agent: str, arguments: dict[str, Any]) -> tuple[str, str]:
        if agent == "refund-desk":
            return (f"Refund {arguments['amount_cents'] / 100:.2f} on order "
                    f"{arguments['order_id']}?", f"Refunds above {REFUND_LIMIT_CENTS / 100:.2f}"
                    " need a person's approval.")
        return "bench: approve a no-op write", f"n={arguments.get('n')}"

    def _to_policy(self, st: Story, agent: str, order: dict[str, Any]) -> dict[str, Any]:
        """Up to the policy's pause: the reads before, the side effect decided and put to a
        person."""
        st.take(self.owners.at(self.rng, self._frac(st)))
        if agent == "refund-desk":
            self._read(st, agent, 1, order)
        step = st.start_step()
        tool, arguments, _ = self._write_request(st, agent, order)
        st.decide(step, tool, arguments, Effect.SIDE_EFFECT)
        title, detail = self._policy_title(agent, arguments)
        return st.pause(step, "policy", title, detail)

    def _to_interrupted(self, st: Story, agent: str, order: dict[str, Any]) -> dict[str, Any]:
        """Up to a side effect's interruption put to a person: the call started (and was
        dispatched), its worker died, another took the run over."""
        first = self.owners.at(self.rng, self._frac(st))
        st.take(first)
        self._read(st, agent, 1, order)
        step = st.start_step()
        tool, arguments, dispatches = self._write_request(st, agent, order)
        st.decide(step, tool, arguments, Effect.SIDE_EFFECT)
        st.start_tool(step, dispatches, decided=True)
        started, who = st.t, st.owner
        st.take_over(self.rng.choice([o for o in self.owners.recent if o != first]), step)
        title = f"{tool} was interrupted: did it take effect?"
        detail = (f"The call to {tool} (side_effect) started at "
                  f"{started.isoformat(timespec='seconds')}, attempt {step['attempt']}, run "
                  f"by {who}, and the process stopped before its outcome was recorded, so "
                  "whether it took effect is unknown. Check the outside world for its "
                  "idempotency key.")
        return st.pause(step, "interrupted_side_effect", title, detail)

    def _frac(self, st: Story) -> float:
        return st.id / self.sizes.runs

    def _output(self, st: Story, agent: str, k: int, order: dict[str, Any]) -> Any:
        if agent == "refund-desk":
            if k >= 2:
                return {"order_id": order["order_id"], "refunded": order["amount_cents"]}
            why = ("The order was never delivered; the carrier's report comes first." if k else
                   f"Order {order['order_id']} is outside the 30-day return window.")
            return {"order_id": order["order_id"], "refunded": False, "why": why}
        if agent == "hello":
            greeting = LANGUAGES[st.input["language"]]
            return {"sent": f"{greeting}, {st.input['name']}!"} if k >= 2 else \
                f"{greeting}, {st.input['name']}!"
        if agent == "bench_final":
            return "done"
        return {"steps": k}

    # story kinds: each _<kind>(story, agent, tool steps, in-flight events, order, frac)
    def _plain(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float) -> None:
        st.take(self.owners.at(self.rng, frac))
        if agent in ("refund-desk", "hello"):
            if k >= 1:
                self._read(st, agent, 1, order)
            if k >= 2:
                tool, arguments, dispatches = self._write_request(st, agent, order)
                step = st.start_step()
                st.decide(step, tool, arguments, Effect.SIDE_EFFECT)
                st.start_tool(step, dispatches, decided=True)
                st.finish_tool(step, self._write_result(st, agent, order, step))
        else:
            for n in range(1, k + 1):
                if agent == "bench_write":
                    step = st.start_step()
                    st.decide(step, "bench_write", {"n": n}, Effect.SIDE_EFFECT)
                    st.start_tool(step, decided=True)
                    st.finish_tool(step, {"n": n})
                else:
                    self._read(st, agent, n, order)
        st.succeed(self._output(st, agent, k, order))

    def _queued(self, st: Story, *args: Any) -> None:
        st.row["status"] = "queued"

    def _requeued(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                  ) -> None:
        approval = self._to_policy(st, agent, order)
        st.decide_approval(approval, "approved", "ok")

    def _running(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float,
                 owner: str | None = None) -> None:
        st.take(owner or self.rng.choice(self.owners.live))
        for n in range(1, k + 1):
            self._read(st, agent, n, order)
        step = st.start_step()
        if j >= 5:
            tool = {"refund-desk": "lookup_order", "hello": "look_up_greeting"}.get(
                agent, "bench_read")
            arguments = {"order_id": order["order_id"]} if agent == "refund-desk" else \
                {"language": st.input["language"]} if agent == "hello" else {"n": k + 1}
            st.decide(step, tool, arguments, Effect.READ_ONLY)
            st.start_tool(step, decided=True)
        expires = st.t + timedelta(seconds=LEASE)
        st.row.update(lease_owner=st.owner, lease_expires_at=expires)

    def _running_dead(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                      ) -> None:
        owner = self.owners.dead_rows[st.id % len(self.owners.dead_rows)]
        self._running(st, agent, k, j, order, frac, owner)

    def _pending_policy(self, st: Story, agent: str, k: int, j: int, order: dict,
                        frac: float) -> None:
        self._to_policy(st, agent, order)

    def _pending_interrupted(self, st: Story, agent: str, k: int, j: int, order: dict,
                             frac: float) -> None:
        self._to_interrupted(st, agent, order)

    def _cancelled_queued(self, st: Story, *args: Any) -> None:
        st.cancel("Created by mistake.")

    def _cancelled_waiting(self, st: Story, agent: str, k: int, j: int, order: dict,
                           frac: float) -> None:
        self._to_policy(st, agent, order)
        st.cancel("Not needed any more: handled by hand.")

    def _failed_llm(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                    ) -> None:
        st.take(self.owners.at(self.rng, frac))
        st.fail_llm()

    def _rejected(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                  ) -> None:
        approval = self._to_policy(st, agent, order)
        st.decide_approval(approval, "rejected", "Not eligible: past the return window.")

    def _approved(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                  ) -> None:
        approval = self._to_policy(st, agent, order)
        st.decide_approval(approval, "approved", "Checked the photos: approved.")
        st.take(self.owners.at(self.rng, frac))
        step = approval["step"]
        st.start_tool(step, agent == "refund-desk", approval)
        st.finish_tool(step, self._write_result(st, agent, order, step))
        st.succeed(self._output(st, agent, 2 if agent == "refund-desk" else 1, order))

    def _resolved(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float
                  ) -> None:
        approval = self._to_interrupted(st, agent, order)
        step = approval["step"]
        st.decide_approval(approval, "resolved", "The provider's dashboard shows it went out.",
                           self._write_result(st, agent, order, step))
        st.take(self.owners.at(self.rng, frac))
        st.succeed(self._output(st, agent, 2, order))

    def _long(self, st: Story, agent: str, k: int, j: int, order: dict, frac: float) -> None:
        """A batch of refunds: lookups and refunds in turn, every 50th refund approved by a
        person first, one interrupted mid-call and resolved; the last step in flight."""
        rng = self.rng
        live = self.owners.live[0]
        st.take(self.owners.recent[0])
        interrupted_at = (k * 2 // 5) // 2 * 2 + 2
        for index in range(1, k):
            if index % 2:
                order = self._order(rng, dear=(index + 1) % 100 == 0)
                step = st.start_step()
                st.decide(step, "lookup_order", {"order_id": order["order_id"]}, Effect.READ_ONLY)
                st.start_tool(step, decided=True)
                st.finish_tool(step, order)
                continue
            step = st.start_step()
            arguments = {"order_id": order["order_id"], "amount_cents": order["amount_cents"]}
            st.decide(step, "issue_refund", arguments, Effect.SIDE_EFFECT)
            if index % 100 == 0:
                title, detail = self._policy_title("refund-desk", arguments)
                approval = st.pause(step, "policy", title, detail)
                st.decide_approval(approval, "approved", "Within the batch's budget.",
                                   within=(5, 40))
                st.take(live if index > interrupted_at else self.owners.recent[0])
                st.start_tool(step, True, approval)
            elif index == interrupted_at:
                st.start_tool(step, True, decided=True)
                st.take_over(live, step)
                title = "issue_refund was interrupted: did it take effect?"
                approval = st.pause(step, "interrupted_side_effect", title,
                                    "The process stopped before its outcome was recorded.")
                st.decide_approval(approval, "resolved", "Found it in the provider's log.",
                                   self._write_result(st, agent, order, step), within=(5, 40))
                st.take(live)
                continue
            else:
                st.start_tool(step, True, decided=True)
            st.finish_tool(step, self._write_result(st, agent, order, step))
        step = st.start_step()  # the step in flight: a lookup, started
        st.decide(step, "lookup_order", {"order_id": order["order_id"] + 1}, Effect.READ_ONLY)
        st.start_tool(step, decided=True)
        st.row.update(lease_owner=st.owner, lease_expires_at=st.t + timedelta(seconds=LEASE))
