"""``manage.py bench --inflight``: many runs in flight per worker, measured as the runtime is.

Each level runs real ``manage.py runworker`` processes on a fresh copy of a freshly migrated
SQLite file (``var/bench-<pid>/``), with enough runs queued beforehand to keep every slot busy
through a warm-up and a measured window; then the workers are stopped (SIGTERM by pid) and
everything is read from the database and from the workers' own stop lines:

- steps/s: ``step.started`` events whose time falls in the window, over the window;
- step latency: a ``step.started`` to the run's next ``step.started`` (or to ``run.succeeded``
  / ``run.failed`` for its last step), for the steps started in the window;
- runs in flight: each run's time between its first event after ``run.created`` (its claim)
  and its last one, overlapping the window, summed, over the window;
- plans per step: distinct (run, time) pairs among the events in the window (a plan is one
  run's commit), over the steps in the window;
- commits per step: the workers' own count of write transactions (their stop line: transactions
  that took SQLite's write lock through the runtime's writer queue; a group commit counts once
  however many plans it carries) over every step they ran; and plans per group commit;
- fsyncs per step: ``fsync`` + ``fdatasync`` calls counted in the worker processes by a tiny
  ``LD_PRELOAD`` library compiled here with the system's C compiler (none: "not measured"),
  over every step they ran;
- "database is locked" and tracebacks: counted in the workers' output.

Four lines: **in flight** (one process, ``--concurrency N``, an async LLM answering after 100 ms:
the ideal is N x 10 steps/s), **no wait** (zero-latency LLM, 1 and 16 in flight),
**processes** (1, 2, 4 processes with ``PROCESS_IN_FLIGHT`` runs in flight each, zero-latency
LLM) and **loops** (16 in flight, zero-latency LLM, ``--loop threads`` then the default event
loop). Each line is measured in three interleaved rounds and each configuration reported by its
median round: the machine's speed drifts within minutes. A ratio is the median of the ratios
within each round, whose configurations were measured one after the other (``paired_ratios``).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import statistics
import subprocess
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db.models import Max, Min

from runtime.benchkit.agents import WAIT_SECONDS, WAIT_TOOL_CALLS
from runtime.benchkit.db import point_default_at
from runtime.benchkit.steps import create_runs
from runtime.benchkit.workers import LOCKED, WorkerProc, group_use, pct, writer_use
from runtime.models import Event, Run

STEPS_PER_RUN = WAIT_TOOL_CALLS + 1  # tool steps, then the final answer's step
WAITING = ("bench_wait", "bench_pai_wait")  # agents whose model waits (runs take no input)
PAI_AGENTS = "runtime.benchkit.pai_agents.AGENTS"  # loaded by the agents line's workers only
# (default, --quick)
SIZES: dict[str, tuple[Any, Any]] = {
    "levels": ((1, 16, 64, 256), (1, 16, 64)),
    "nowait": ((1, 16), (1, 16)),
    "processes": ((1, 2, 4), (1, 2)),
    "warm": (3.0, 0.5),
    "window": (10.0, 2.0),
    "rounds": (3, 1),  # interleaved rounds of every line
}
# Runs queued for a level with no LLM wait: enough for this many steps/s through the warm-up and
# the window (above what one SQLite file gives: about 3,600 steps/s on the 2-CPU VM with 2
# event-loop processes); a queue that runs dry is reported.
NOWAIT_STEPS_PER_S = 5_000
PROCESS_IN_FLIGHT = 16  # runs in flight per process on the processes line
LOOPS = ("threads", "asyncio")  # the loops line: a thread per run, then the event loop
LOOPS_IN_FLIGHT = 16
# The agents line: the native bench_wait against its Pydantic AI twin, this many in flight,
# counted in model requests (one per step for the native agent; a Pydantic AI run's last
# request gives its answer and starts no step).
AGENTS_IN_FLIGHT = 64
AGENT_KINDS = (("native", "bench_wait"), ("pydantic-ai", "bench_pai_wait"))
RAMP_TIMEOUT = 10.0  # seconds given a level's workers to have every slot busy (reported)

FSYNC_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static unsigned long n_fsync, n_fdatasync;
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
int fsync(int fd) {
    if (!real_fsync) real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    __atomic_add_fetch(&n_fsync, 1, __ATOMIC_RELAXED);
    return real_fsync(fd);
}
int fdatasync(int fd) {
    if (!real_fdatasync) real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    __atomic_add_fetch(&n_fdatasync, 1, __ATOMIC_RELAXED);
    return real_fdatasync(fd);
}
__attribute__((destructor)) static void bench_fsync_report(void) {
    const char *dir = getenv("BENCH_FSYNC_DIR");
    char path[4096];
    FILE *f;
    if (!dir) return;
    snprintf(path, sizeof path, "%s/fsync-%d.txt", dir, (int)getpid());
    f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "%lu %lu\n", n_fsync, n_fdatasync);
    fclose(f);
}
"""


def fsync_counter(directory: Path) -> dict[str, str] | None:
    """Environment that makes a worker count its fsyncs, or None when no C compiler works."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source, lib = directory / "fsyncount.c", directory / "fsyncount.so"
    source.write_text(FSYNC_SOURCE)
    made = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(source), "-ldl"],
                          capture_output=True, text=True, timeout=60)
    if made.returncode != 0 or not lib.exists():
        return None
    counts = directory / "fsyncs"
    counts.mkdir(exist_ok=True)
    return {"LD_PRELOAD": str(lib), "BENCH_FSYNC_DIR": str(counts)}


def _fsyncs(env: dict[str, str] | None, workers: list[WorkerProc]) -> int | None:
    """fsync + fdatasync calls of these workers (None if any of them did not report)."""
    if env is None:
        return None
    total = 0
    for w in workers:
        found = Path(env["BENCH_FSYNC_DIR"]) / f"fsync-{w.pid}.txt"
        if not found.exists():
            return None
        total += sum(int(x) for x in found.read_text().split())
    return total


def level(template: Path, directory: Path, tag: str, *, agent: str, processes: int,
          concurrency: int, warm: float, window: float, fsync_env: dict[str, str] | None,
          steps_per_s_bound: float, cpu: str = "off", loop: str = "asyncio",
          count: str = "step.started", env: dict[str, str] | None = None) -> dict[str, Any]:
    """One configuration on a fresh copy of ``template``: queue, run, measure, stop.
    ``count``: the event kind counted as a step (``llm.requested``: model requests)."""
    db = directory / f"{tag}.sqlite3"
    shutil.copyfile(template, db)
    point_default_at(db)
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)
    slots = processes * concurrency
    runs = slots + math.ceil(steps_per_s_bound * (warm + window + 3) / STEPS_PER_RUN)
    ids = create_runs(agent, runs, None if agent in WAITING else WAIT_TOOL_CALLS)
    lo, hi = min(ids), max(ids)
    workers = [WorkerProc(db, logs, ["--concurrency", str(concurrency), "--cpu", cpu,
                                     "--loop", loop],
                          f"{tag}-{i}", env={**(fsync_env or {}), **(env or {})})
               for i in range(processes)]
    try:
        began = time.monotonic()
        running = Run.objects.filter(pk__gte=lo, pk__lte=hi, status="running")
        while running.count() < slots and time.monotonic() - began < RAMP_TIMEOUT:
            if any(w.exited() for w in workers):
                raise RuntimeError(f"a worker of {tag} exited early:\n"
                                   + next(w for w in workers if w.exited()).output()[-2000:])
            time.sleep(0.05)
        ramp = time.monotonic() - began
        time.sleep(warm)
        cpu0, t0 = sum(w.cpu_seconds_now() for w in workers), datetime.now(UTC)
        time.sleep(window)
        cpu1, t1 = sum(w.cpu_seconds_now() for w in workers), datetime.now(UTC)
        rss = sum(w.rss_kib() for w in workers if not w.exited())  # at the window's end
    finally:
        for w in workers:  # one SIGTERM each (a second one makes a worker leave at once)
            if not w.exited():
                os.kill(w.pid, signal.SIGTERM)
        codes = [w.wait(60) for w in workers]
    seconds = (t1 - t0).total_seconds()
    mine = Event.objects.filter(run_id__gte=lo, run_id__lte=hi)
    rows = list(mine.filter(kind__in=(count, "run.succeeded", "run.failed"))
                .order_by("run_id", "seq").values_list("run_id", "kind", "at"))
    by_run: dict[int, list[tuple[str, datetime]]] = defaultdict(list)
    for run_id, kind, at in rows:
        by_run[run_id].append((kind, at))
    counted, latencies, all_steps = 0, [], 0
    for events in by_run.values():
        for i, (kind, at) in enumerate(events):
            if kind != count:
                continue
            all_steps += 1
            if not t0 <= at < t1:
                continue
            counted += 1
            if i + 1 < len(events):  # a step ended by a release (the stop) has no latency
                latencies.append((events[i + 1][1] - at).total_seconds() * 1000)
    spans = list(mine.exclude(kind="run.created").values("run_id")
                 .annotate(first=Min("at"), last=Max("at")).values_list("first", "last"))
    in_flight = sum(max(0.0, (min(b, t1) - max(a, t0)).total_seconds()) for a, b in spans)
    starts = sorted(a for a, _ in spans)
    commits = (mine.filter(at__gte=t0, at__lt=t1).exclude(kind="run.created")
               .values_list("run_id", "at").distinct().count())
    outputs = [w.output() for w in workers]
    transactions, held, _waited = writer_use(outputs)
    groups, grouped = group_use(outputs)
    fsyncs = _fsyncs(fsync_env, workers)
    # The workers' active span: the first claim to the last event (start-up and stop aside).
    active = (max(b for _, b in spans) - starts[0]).total_seconds() if spans else 0.0
    return {
        "processes": processes, "concurrency": concurrency, "in_flight": slots, "loop": loop,
        "rss_mib": rss / 1024,
        "agent": agent, "runs_queued": runs,
        "unclaimed": runs - bisect_left(starts, t1),  # never started before the window's end
        "ramp_seconds": ramp, "window_seconds": seconds, "steps": counted,
        "steps_per_s": counted / seconds if seconds else 0.0,
        "in_flight_avg": in_flight / seconds if seconds else 0.0,
        "p50_ms": pct(latencies, 0.50), "p99_ms": pct(latencies, 0.99),
        "max_ms": max(latencies, default=0.0),
        "cpu_ms_per_step": 1000 * (cpu1 - cpu0) / max(counted, 1),
        "plans_per_step": commits / max(counted, 1),
        "worker_steps": all_steps, "write_transactions": transactions,
        "commits_per_step": transactions / all_steps if all_steps else None,
        "group_commits": groups, "plans_per_group": grouped / groups if groups else None,
        "writer_held": held / active if active else 0.0,
        "fsyncs": fsyncs, "fsyncs_per_step": (fsyncs / all_steps if fsyncs is not None
                                              and all_steps else None),
        "failed_runs": sum(1 for e in by_run.values() if e and e[-1][0] == "run.failed"),
        "locked_errors": sum(o.count(LOCKED) for o in outputs),
        "tracebacks": sum(o.count("Traceback") for o in outputs),
        "exit_codes": codes, "overran": any(w.overran for w in workers),
    }


def measure(path: Path, quick: bool, step: Callable[[str], None],
            cpu: str = "auto") -> dict[str, Any]:
    """Every line of the section; ``path`` is the bench's freshly migrated database; ``cpu``
    is every worker's ``runworker --cpu``."""
    size = {k: v[1] if quick else v[0] for k, v in SIZES.items()}
    directory = path.parent
    template = directory / "inflight-template.sqlite3"
    point_default_at(path)  # closes every connection: the copy is the migrated file as is
    shutil.copyfile(path, template)
    fsync_env = fsync_counter(directory)
    common = {"template": template, "directory": directory, "warm": size["warm"],
              "window": size["window"], "fsync_env": fsync_env, "cpu": cpu}
    r: dict[str, Any] = {"section": "inflight", "quick": quick, "sizes": size, "cpu": cpu,
                         "process_in_flight": PROCESS_IN_FLIGHT,
                         "wait_ms": WAIT_SECONDS * 1000, "steps_per_run": STEPS_PER_RUN,
                         "fsyncs_measured": fsync_env is not None}
    try:
        # This machine's speed drifts by a third within minutes, and the ratios of a line
        # compare configurations measured in turn: each line is measured in interleaved
        # rounds and each configuration reported by its median round (steps/s).
        waits: dict[int, list[dict[str, Any]]] = {n: [] for n in size["levels"]}
        for k in range(size["rounds"]):
            for n in size["levels"]:
                step(f"in flight: {n}, LLM {WAIT_SECONDS * 1000:.0f} ms, round {k + 1}")
                waits[n].append(level(tag=f"wait-{n}-{k}", agent="bench_wait", processes=1,
                                      concurrency=n, steps_per_s_bound=n / WAIT_SECONDS,
                                      **common))
        r["levels"] = []
        for n in size["levels"]:
            x = _median_round(waits[n])
            x["ideal_steps_per_s"] = n / WAIT_SECONDS
            x["percent_of_ideal"] = 100 * x["steps_per_s"] / x["ideal_steps_per_s"]
            r["levels"].append(x)
        for key, agent_sizes, procs in (("nowait", size["nowait"], False),
                                        ("processes", size["processes"], True)):
            rounds: dict[int, list[dict[str, Any]]] = {n: [] for n in agent_sizes}
            for k in range(size["rounds"]):
                for n in agent_sizes:
                    step(f"{key}: {n}{' processes' if procs else ' in flight'}, round {k + 1}")
                    rounds[n].append(level(
                        tag=f"{key}-{n}-{k}", agent="bench_read",
                        processes=n if procs else 1,
                        concurrency=PROCESS_IN_FLIGHT if procs else n,
                        steps_per_s_bound=NOWAIT_STEPS_PER_S, **common))
            r[key] = [_median_round(rounds[n]) for n in agent_sizes]
            paired_ratios(r[key], [rounds[n] for n in agent_sizes])
        # The event loop against a thread per run, LOOPS_IN_FLIGHT runs in flight, no wait.
        kinds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in LOOPS}
        for k in range(size["rounds"]):
            for kind in LOOPS:
                step(f"loops: {kind}, {LOOPS_IN_FLIGHT} in flight, round {k + 1}")
                kinds[kind].append(level(
                    tag=f"loop-{kind}-{k}", agent="bench_read", processes=1,
                    concurrency=LOOPS_IN_FLIGHT, steps_per_s_bound=NOWAIT_STEPS_PER_S,
                    loop=kind, **common))
        r["loops"] = [_median_round(kinds[kind]) for kind in LOOPS]
        paired_ratios(r["loops"], [kinds[kind] for kind in LOOPS])
        # A Pydantic AI agent beside its native twin, AGENTS_IN_FLIGHT in flight, 100 ms model.
        agents: dict[str, list[dict[str, Any]]] = {kind: [] for kind, _ in AGENT_KINDS}
        pai = {"RUNTIME_AGENTS": f"runtime.benchkit.agents.AGENTS,{PAI_AGENTS}"}
        for k in range(size["rounds"]):
            for kind, name in AGENT_KINDS:
                step(f"agents: {kind}, {AGENTS_IN_FLIGHT} in flight, round {k + 1}")
                agents[kind].append(level(
                    tag=f"agent-{kind}-{k}", agent=name, processes=1,
                    concurrency=AGENTS_IN_FLIGHT, count="llm.requested", env=pai,
                    steps_per_s_bound=AGENTS_IN_FLIGHT / WAIT_SECONDS, **common))
        from runtime.benchkit.pai_agents import own_cpu_ms_per_request  # (Pydantic AI: 1 s)

        r["pydantic_ai_own_cpu_ms"] = own_cpu_ms_per_request()
        r["agents"] = []
        for kind, _ in AGENT_KINDS:
            x = _median_round(agents[kind])
            x["agent"] = kind
            x["ideal_steps_per_s"] = AGENTS_IN_FLIGHT / WAIT_SECONDS
            x["percent_of_ideal"] = 100 * x["steps_per_s"] / x["ideal_steps_per_s"]
            r["agents"].append(x)
    finally:
        point_default_at(path)
    r["targets"] = targets(r)
    return r


def paired_ratios(line: list[dict[str, Any]], rounds: list[list[dict[str, Any]]]) -> None:
    """Each configuration of ``line`` against the first: ``ratio`` is the median over the
    rounds of the ratio within each round (configurations measured one after the other, a
    minute apart, so the machine's drift between rounds cancels out); ``rounds_ratio`` every
    round's; ``ratio_of_medians`` the median rounds' steps/s divided, which may pair rounds
    measured minutes apart (both reported)."""
    first = rounds[0]
    for x, mine in zip(line, rounds, strict=True):
        each = [a["steps_per_s"] / max(b["steps_per_s"], 1e-9)
                for a, b in zip(mine, first, strict=True)]
        x["rounds_ratio"] = each
        x["ratio"] = statistics.median(each)
        x["ratio_of_medians"] = x["steps_per_s"] / max(line[0]["steps_per_s"], 1e-9)


def _median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median steps/s (all rounds' steps/s kept beside it)."""
    ordered = sorted(rounds, key=lambda x: x["steps_per_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["rounds_steps_per_s"] = [x["steps_per_s"] for x in rounds]
    chosen["locked_errors"] = sum(x["locked_errors"] for x in rounds)
    chosen["tracebacks"] = sum(x["tracebacks"] for x in rounds)
    chosen["failed_runs"] = sum(x["failed_runs"] for x in rounds)
    chosen["overran"] = any(x["overran"] for x in rounds)
    chosen["exit_codes"] = [c for x in rounds for c in x["exit_codes"]]
    chosen["unclaimed"] = min(x["unclaimed"] for x in rounds)
    return chosen


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets for this section, each met or not, with its figure."""
    out: list[dict[str, Any]] = []

    def add(name: str, met: bool, figure: str) -> None:
        out.append({"target": name, "met": bool(met), "figure": figure})

    at = {x["in_flight"]: x for x in r["levels"]}
    top = at.get(64) or r["levels"][-1]
    add(f">= 80% of the ideal steps/s at {top['in_flight']} in flight "
        f"(LLM {r['wait_ms']:.0f} ms)", top["percent_of_ideal"] >= 80,
        f"{top['steps_per_s']:.0f} of {top['ideal_steps_per_s']:.0f} steps/s = "
        f"{top['percent_of_ideal']:.0f}%")
    most = r["levels"][-1]
    if most is not top:
        add(f">= 80% of the ideal steps/s at {most['in_flight']} in flight "
            f"(LLM {r['wait_ms']:.0f} ms)", most["percent_of_ideal"] >= 80,
            f"{most['steps_per_s']:.0f} of {most['ideal_steps_per_s']:.0f} steps/s = "
            f"{most['percent_of_ideal']:.0f}%, the worker's RSS {most['rss_mib']:.0f} MiB")
    one = at.get(1)
    if one is not None and one.get("fsyncs_per_step") is not None:
        # A step is two commits, each one sync; the checkpointer's passes add a little.
        commits = one.get("commits_per_step") or 0
        add("fsyncs per step at one in flight (LLM wait) <= 2.6", one["fsyncs_per_step"] <= 2.6,
            f"{one['fsyncs_per_step']:.2f} ({commits:.2f} commits per step)")
    nw = {x["in_flight"]: x for x in r["nowait"]}
    if 1 in nw and 16 in nw:
        add("no wait: 16 in flight >= 2.5 x one in flight", nw[16]["ratio"] >= 2.5,
            _ratio_figure(nw[16], nw[1]))
        add("no wait: CPU per step at 16 in flight <= 0.3 ms", nw[16]["cpu_ms_per_step"] <= 0.3,
            f"{nw[16]['cpu_ms_per_step']:.2f} ms (one in flight: "
            f"{nw[1]['cpu_ms_per_step']:.2f} ms)")
    if len(r.get("loops", [])) == 2:
        threads, loop = r["loops"]
        add(f"event loop >= thread per run at {LOOPS_IN_FLIGHT} in flight (no wait)",
            loop["ratio"] >= 1, _ratio_figure(loop, threads)
            + f"; CPU {loop['cpu_ms_per_step']:.2f} vs {threads['cpu_ms_per_step']:.2f} ms/step")
    for x in r.get("agents", []):
        if x["agent"] != "native":
            add(f">= 80% of the ideal model requests/s, a {x['agent']} agent at "
                f"{x['in_flight']} in flight (model {r['wait_ms']:.0f} ms)",
                x["percent_of_ideal"] >= 80,
                f"{x['steps_per_s']:.0f} of {x['ideal_steps_per_s']:.0f} requests/s = "
                f"{x['percent_of_ideal']:.0f}% (native: "
                f"{r['agents'][0]['percent_of_ideal']:.0f}%), RSS {x['rss_mib']:.0f} MiB; "
                f"CPU {x['cpu_ms_per_step']:.1f} ms per request, of which Pydantic AI's own "
                f"{r['pydantic_ai_own_cpu_ms']:.1f} ms (alone, at most "
                f"{1000 / r['pydantic_ai_own_cpu_ms']:.0f} requests/s per CPU)")
    pr = {x["processes"]: x for x in r["processes"]}
    if 1 in pr and 2 in pr:
        add("2 processes >= 1.6 x one", pr[2]["ratio"] >= 1.6, _ratio_figure(pr[2], pr[1]))
    every = (r["levels"] + r["nowait"] + r["processes"] + r.get("loops", [])
             + r.get("agents", []))
    locked = sum(x["locked_errors"] for x in every)
    add('no "database is locked" in any worker\'s output', locked == 0, f"{locked} found")
    bad = [f"{x['in_flight']} ({x['processes']} proc)" for x in every
           if x["failed_runs"] or x["tracebacks"] or x["overran"] or any(x["exit_codes"])]
    add("no failed run, traceback or unclean worker exit", not bad,
        "none" if not bad else "at " + ", ".join(bad))
    dry = [str(x["in_flight"]) for x in every if x["unclaimed"] == 0]
    add("the queue never ran dry during a window", not dry,
        "never" if not dry else "ran dry at " + ", ".join(dry))
    return out


def _ratio_figure(x: dict[str, Any], first: dict[str, Any]) -> str:
    each = x["rounds_ratio"]
    if len(each) == 1:
        return (f"{x['steps_per_s']:.0f} vs {first['steps_per_s']:.0f} steps/s = "
                f"{x['ratio']:.2f}x")
    return (f"{x['ratio']:.2f}x, the median of each round's ratio ("
            f"{', '.join(f'{v:.2f}' for v in each)}); median rounds "
            f"{x['steps_per_s']:.0f} vs {first['steps_per_s']:.0f} steps/s = "
            f"{x['ratio_of_medians']:.2f}x")
