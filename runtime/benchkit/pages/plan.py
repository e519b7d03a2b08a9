"""The plan: a shape per run (its story, agent, tool steps, in-flight events) such that the
totals asked for are met exactly; apart from the storytelling and the writing because meeting
the totals is its own small puzzle."""

from __future__ import annotations

import math
import random

from runtime.benchkit.pages.kinds import StoryKinds
from runtime.benchkit.pages.stories import (
    INTERRUPTED,
    MAX_EXTRA,
    NATURAL_STEPS,
    PLAIN_AGENTS,
    SEED,
    SHARES,
    SPAN,
    long_duration,
)


class Planner(StoryKinds):
    """Chooses every run's shape, counting each shape's events by telling its story once."""

    _counts: dict[tuple, int]
    long_id: int

    # -- the plan: one shape per run -----------------------------------------------------

    def plan(self) -> list[tuple]:
        """A shape per run id (1..runs): (story, agent, tool steps, in-flight events), its
        event count fixed by the shape; the totals asked are met exactly, or this says why
        they cannot be."""
        s, rng = self.sizes, random.Random(SEED + 1)
        n = s.runs
        if s.pending + 100 > n:
            raise ValueError(f"{s.pending:,} pending approvals need more than {n:,} runs")
        per_run = SPAN.total_seconds() / n
        self.long_id = max(1, n - math.ceil(long_duration(s.long_steps).total_seconds()
                                            / per_run) - 1)
        others = [i for i in range(1, n + 1) if i != self.long_id]
        live = max(5, min(24, n // 400))
        dead = max(2, min(6, n // 1_000))
        queued = max(5, int(n * SHARES["queued"]))
        newest = others[-(live + dead + queued):]  # the newest runs: not claimed or running
        older = others[:-(live + dead + queued)]
        shapes: dict[int, tuple] = {self.long_id: ("long", "refund-desk", s.long_steps, 0)}
        for i, run_id in enumerate(newest):
            if i < live + dead:
                agent = rng.choice(["refund-desk", "hello", "bench_read"])
                story = "running" if i < live else "running_dead"
                shapes[run_id] = (story, agent, rng.randint(0, 1), rng.choice([2, 5]))
            else:
                requeued = i % 10 == 5
                agent = "bench_approve" if requeued else rng.choice(list(PLAIN_AGENTS))
                shapes[run_id] = ("requeued" if requeued else "queued", agent, 0, 0)
        rng.shuffle(older)
        pos = 0

        def take(count: int) -> list[int]:
            nonlocal pos
            pos += count
            return older[pos - count:pos]

        for run_id in take(s.pending):
            if rng.random() < INTERRUPTED:
                shapes[run_id] = ("pending_interrupted",
                                  rng.choice(["refund-desk", "refund-desk", "hello"]), 0, 0)
            else:
                shapes[run_id] = ("pending_policy",
                                  rng.choice(["refund-desk", "bench_approve", "bench_approve",
                                              "bench_approve"]), 0, 0)
        for run_id in take(int(n * SHARES["cancelled"])):
            waiting = rng.random() < 0.2
            shapes[run_id] = ("cancelled_waiting" if waiting else "cancelled_queued",
                              "bench_approve" if waiting else rng.choice(list(PLAIN_AGENTS)),
                              0, 0)
        for run_id in take(int(n * SHARES["failed"])):
            if rng.random() < 0.3:
                shapes[run_id] = ("rejected", rng.choice(["refund-desk", "bench_approve"]), 0,
                                  0)
            else:
                shapes[run_id] = ("failed_llm", rng.choice(list(PLAIN_AGENTS)), 0, 0)
        for run_id in take(int(n * SHARES["approved"])):
            shapes[run_id] = ("approved", rng.choice(["refund-desk", "bench_approve"]), 0, 0)
        for run_id in take(max(1, int(n * SHARES["resolved"]))):
            shapes[run_id] = ("resolved", rng.choice(["refund-desk", "hello"]), 0, 0)
        agents, weights = list(PLAIN_AGENTS), list(PLAIN_AGENTS.values())
        plain = older[pos:]
        for run_id in plain:
            shapes[run_id] = ("plain", rng.choices(agents, weights)[0], 0, 0)
        self._fit(shapes, plain, rng)
        return [shapes[i] for i in range(1, n + 1)]

    def _fit(self, shapes: dict[int, tuple], plain: list[int], rng: random.Random) -> None:
        """Give finished runs tool steps until the events total is met exactly: first the
        steps their agents naturally take, while the budget allows, then an exact remainder
        (a refund, 13 events, and reads, 6 each: 13 = 1 mod 6 makes any total past 65)."""
        budget = self.sizes.events - sum(self.count(sh) for sh in shapes.values())
        if budget < 0:
            raise ValueError(f"{self.sizes.events:,} events are fewer than these runs make "
                             f"at the least ({self.sizes.events - budget:,})")
        order = plain[:]
        rng.shuffle(order)
        for run_id in order:
            story, agent, k, j = shapes[run_id]
            want = NATURAL_STEPS[agent] if agent in ("refund-desk", "hello") else \
                rng.randint(1, NATURAL_STEPS[agent]) if NATURAL_STEPS[agent] else 0
            cost = self.count((story, agent, want, j)) - self.count(shapes[run_id])
            if want and budget - cost >= 80:
                shapes[run_id] = (story, agent, want, j)
                budget -= cost
        bare_refunds = [r for r in order if shapes[r][1] == "refund-desk" and shapes[r][2] == 0]
        for run_id in bare_refunds[:budget % 6]:
            shapes[run_id] = ("plain", "refund-desk", 2, 0)
            budget -= 13
        for run_id in order:
            story, agent, k, j = shapes[run_id]
            while budget >= 6 and agent in ("bench_read", "bench_write") and k < MAX_EXTRA:
                k += 1
                budget -= 6
            shapes[run_id] = (story, agent, k, j)
        if budget != 0:
            raise ValueError(f"{self.sizes.events:,} events: {budget:,} more than "
                             f"{self.sizes.runs:,} runs of these shapes can hold")

    def count(self, shape: tuple) -> int:
        """Events a run of this shape writes (every run of a shape writes as many)."""
        if shape not in self._counts:
            keep = (self.rng, self._approval_id)
            self.rng = random.Random(0)
            try:
                story = self.story(1, shape, 0.5)
                self._counts[shape] = sum(len(c[2]) for c in story.commits)
            finally:
                self.rng, self._approval_id = keep
        return self._counts[shape]
