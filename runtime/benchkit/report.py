"""The bench's verdicts and its table: each target met or not, with the figure it rests on."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

RSS_TOLERANCE = 0.05  # resident memory may wobble (allocator arenas) by this fraction


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target the bench checks: name, met, and the figure it was judged on."""
    out: list[dict[str, Any]] = []

    def add(name: str, met: bool, figure: str) -> None:
        out.append({"target": name, "met": bool(met), "figure": figure})

    ceiling = r["ceiling"]["commits_per_s"]
    bare = r["floor"]["steps_per_s"]
    for s in r["steps"]:
        ratio = s["steps_per_s"] / ceiling
        add(f"{s['effect']}: steps/s >= 0.25 x ceiling", ratio >= 0.25,
            f"{s['steps_per_s']:.0f} steps/s = {ratio:.2f} x {ceiling:.0f} commits/s "
            f"(the bare SQL: {bare:.0f} = {bare / ceiling:.2f} x)")
        add(f"{s['effect']}: 2 synced commits per step (steady state)",
            s["steady_commits_per_step"] == 2 and s["late_commits_per_step"] == 2,
            f"{s['steady_commits_per_step']:g} then {s['late_commits_per_step']:g}")
        add(f"{s['effect']}: statements per step constant as a run grows",
            s["steady_statements_per_step"] == s["late_statements_per_step"],
            f"{s['steady_statements_per_step']:g} at {s['run_lengths'][0]}-"
            f"{s['run_lengths'][1]} steps, {s['late_statements_per_step']:g} at "
            f"{s['run_lengths'][1]}-{s['run_lengths'][2]}")
    procs = {c["processes"]: c for c in r["concurrency"] if c["threads"] == 1}
    if 1 in procs and 2 in procs:
        gain = procs[2]["steps_per_s"] / max(procs[1]["steps_per_s"], 1e-9)
        add("2 processes >= 1.6 x 1 process", gain >= 1.6,
            f"{procs[2]['steps_per_s']:.0f} vs {procs[1]['steps_per_s']:.0f} steps/s "
            f"= {gain:.2f}x (the machine: {r['cpu_scaling']:.2f}x for two busy processes)")
    locked = (sum(c["locked_errors"] for c in r["concurrency"])
              + r["approvals"]["locked_errors"] + r["rss"]["locked_errors"])
    add('no "database is locked" in any worker\'s output', locked == 0, f"{locked} found")
    ok_runs = all(c["succeeded"] == c["runs"] and not c["overran"] for c in r["concurrency"])
    add("every bench run succeeded, no worker overran", ok_runs,
        "yes" if ok_runs else "no (see the concurrency section)")
    p95 = r["approvals"]["p95_ms"]
    add("approval-to-restart p95 < 500 ms", p95 < 500, f"p95 {p95:.0f} ms")
    sizes = r["scale"]
    if len(sizes) >= 2:
        lo, hi = sizes[0], sizes[-1]
        for name, q in hi["queries"].items():
            ratio = q["ms"] / max(lo["queries"][name]["ms"], 1e-9)
            add(f"flat within 2x: {name}", ratio <= 2.0,
                f"{lo['queries'][name]['ms']:.2f} ms at {lo['finished_runs']:,} -> "
                f"{q['ms']:.2f} ms at {hi['finished_runs']:,} ({ratio:.2f}x)")
    m = r["rss"]
    limit = RSS_TOLERANCE * m["rss_first_kib"]
    add(f"no worker RSS growth ({m['first_runs']:,} -> {m['total_runs']:,} runs, "
        f"within {RSS_TOLERANCE:.0%})", m["growth_kib"] <= limit,
        f"{m['rss_first_kib'] / 1024:.1f} -> {m['rss_total_kib'] / 1024:.1f} MiB "
        f"({m['growth_kib'] / 1024:+.1f} MiB)")
    return out


def writer_limit(r: dict[str, Any]) -> str:
    """Where adding writers stops paying, and whether the disk, the CPUs or the lock is why."""
    ceiling = r["ceiling"]["commits_per_s"]
    cps = max(s["commits_per_step"] for s in r["steps"])
    cpus = r["machine"]["cpus"]
    lines = []
    for key, label in (("threads", "threads in one process"), ("processes", "processes")):
        rows = sorted((c for c in r["concurrency"]
                       if (c["processes"] == 1 if key == "threads" else c["threads"] == 1)),
                      key=lambda c: c[key])
        flat = None
        for prev, cur in itertools.pairwise(rows):
            if cur["steps_per_s"] < 1.25 * prev["steps_per_s"]:
                flat = (prev, cur)
                break
        if flat is None:
            lines.append(f"{label}: throughput still rising at {rows[-1][key]}.")
            continue
        prev, cur = flat
        disk = cur["steps_per_s"] * cps / ceiling
        busy = cur["cpu_ms_per_step"] * cur["steps_per_s"] / 1000 / cpus
        writer = cur.get("writer_busy", 0.0)
        alone = rows[0].get("writer_busy", 0.0)  # one process, one thread
        why = (f"the single writer: the write lock is held {writer:.0%} of the time "
               f"(one worker alone holds it {alone:.0%}), each write waits "
               f"{cur.get('writer_wait_ms', 0.0):.2f} ms for it" if writer > 0.7
               else f"the disk: commits run at {disk:.0%} of the ceiling" if disk > 0.7
               else f"the CPUs: workers use {busy:.0%} of {cpus} cores" if busy > 0.8
               else f"neither the disk ({disk:.0%} of the ceiling's commits/s), the CPUs "
                    f"({busy:.0%}) nor the write lock ({writer:.0%} held) alone")
        lines.append(f"{label}: {prev[key]} -> {cur[key]} gains only "
                     f"{cur['steps_per_s'] / prev['steps_per_s']:.2f}x; the limit is {why}.")
    return " ".join(lines)


def render(r: dict[str, Any]) -> str:
    """The table, as printed."""
    m, c = r["machine"], r["ceiling"]
    out = [f"agent-runtime bench{' (--quick)' if r['quick'] else ''}: SQLite {m['sqlite']}, "
           f"Python {m['python']}, {m['cpus']} CPUs, database in {m['directory']}", ""]
    out += ["1. Ceiling: plain sqlite3, WAL + synchronous=FULL, one small INSERT per commit",
            f"   {c['commits_per_s']:,.0f} commits/s (median of "
            + ", ".join(f"{x:,.0f}" for x in c["samples"]) + ")",
            "   Floor: the loop's own statements per step (2 commits), nothing around them",
            f"   {r['floor']['steps_per_s']:,.0f} steps/s = "
            f"{r['floor']['steps_per_s'] / c['commits_per_s']:.2f} x the ceiling (median of "
            + ", ".join(f"{x:,.0f}" for x in r["floor"]["samples"]) + ")", ""]
    out += ["2. Durable steps in process: one driver, concurrency 1, zero-latency scripted LLM, "
            "no-op tools", "   effect        steps/s  commits/step  stmts/step  steady commits"
            "  steady stmts  efficiency"]
    for s in r["steps"]:
        out.append(f"   {s['effect']:<12} {s['steps_per_s']:8.0f} {s['commits_per_step']:13.2f}"
                   f" {s['statements_per_step']:11.2f} {s['steady_commits_per_step']:15g}"
                   f" {s['steady_statements_per_step']:13g} {s['efficiency']:11.2f}")
    out += ["   (all-in figures include the claim and the final answer of each "
            f"{r['steps'][0]['steps_per_run']}-step run; efficiency = steps/s x commits/step"
            " / ceiling)",
            "   of the floor: " + ", ".join(
                f"{s['effect']} {s['steps_per_s'] / r['floor']['steps_per_s']:.2f}"
                for s in r["steps"]), ""]
    out += ["3. Worker processes (runworker --burst, 10-step read-only runs); two busy "
            f"processes get {r['cpu_scaling']:.2f}x the work of one on this machine",
            "   procs threads  steps/s  p50 ms  p99 ms  cpu ms/step  writer held  wait ms"
            "  locked  runs ok"]
    for x in r["concurrency"]:
        out.append(f"   {x['processes']:5} {x['threads']:7} {x['steps_per_s']:8.0f}"
                   f" {x['p50_ms']:7.1f} {x['p99_ms']:7.1f} {x['cpu_ms_per_step']:12.2f}"
                   f" {x.get('writer_busy', 0.0):12.0%} {x.get('writer_wait_ms', 0.0):8.2f}"
                   f" {x['locked_errors']:7} {x['succeeded']:4}/{x['runs']}")
    out += ["   (latency: a step's start to its tool's result, both commits included; writer "
            "held: share of the time a worker held SQLite's write lock; wait: per write "
            "transaction)",
            f"   Single writer: {r['writer_limit']}", ""]
    a = r["approvals"]
    out += [f"4. Approval to restart: default runworker, {a['approvals']} approvals at random "
            "moments", f"   p50 {a['p50_ms']:.0f} ms   p95 {a['p95_ms']:.0f} ms   "
            f"max {a['max_ms']:.0f} ms   (approve() returning -> step.tool_started)", ""]
    sizes = r["scale"]
    head = "".join(f"{s['finished_runs']:>11,}" for s in sizes)
    out += ["5. Query time (ms, fastest of the repetitions) by finished runs in the table",
            f"   {'':38}{head}"]
    for name in sizes[0]["queries"]:
        out.append(f"   {name:<38}" + "".join(f"{s['queries'][name]['ms']:11.2f}"
                                             for s in sizes))
    out.append("   plans at the largest size:")
    for name, q in sizes[-1]["queries"].items():
        out.append(f"     {name}: {q['plan']}")
    rs = r["rss"]
    out += ["", f"6. Worker memory (default runworker, one-step runs): "
            f"{rs['rss_first_kib'] / 1024:.1f} MiB after {rs['first_runs']:,} runs, "
            f"{rs['rss_total_kib'] / 1024:.1f} MiB after {rs['total_runs']:,}", ""]
    out.append("Targets")
    for t in r["targets"]:
        out.append(f"   [{'met' if t['met'] else 'NOT MET':>7}] {t['target']}: {t['figure']}")
    out.append(f"\nTotal {r['seconds']:.0f} s.")
    return "\n".join(out)


def render_console(r: dict[str, Any]) -> str:
    """The ``--console`` section's table, as printed."""
    m, b, db, s = r["machine"], r["built"], r["counted"], r["sizes"]
    statuses = ", ".join(f"{k} {v:,}" for k, v in sorted(b["runs_by_status"].items(),
                                                         key=lambda kv: -kv[1]))
    kinds: Counter[str] = Counter()
    for key, n in b["approvals_by_kind_status"].items():
        if key.endswith(" pending"):
            kinds[key.split()[0]] += n
    pending = ", ".join(f"{k} {v:,}" for k, v in kinds.most_common())
    server = m.get("server", 0)
    engine = (f"PostgreSQL {server // 10_000}.{server % 10_000}" if r["engine"] == "postgresql"
              else f"SQLite {m['sqlite']}")
    out = [f"agent-runtime bench --console{' (--quick)' if r['quick'] else ''}: {engine}, "
           f"Python {m['python']}, {m['cpus']} CPUs (load average "
           f"{m['load_before']:.1f} before, {m['load_after']:.1f} after), database "
           f"{m['database']}", "",
           f"Data set, built in {r['build_seconds']:.0f} s ({r['database_mib']:,.0f} MiB):",
           f"   {b['runs']:,} runs ({statuses})",
           f"   {b['pending']:,} pending approvals ({pending}) of {b['approvals']:,}",
           f"   {b['events']:,} events ({len(b['event_kinds'])} kinds, payloads of "
           f"{b['payload_bytes_avg']:.0f} bytes on average; actors: {b['people']} people, "
           f"{b['worker_owners']} worker owners, {b['dead_owners']} of them long dead)",
           f"   {b['steps']:,} steps; {b['workers']} workers ({b['workers_live']} live, "
           f"{b['workers_dead']} dead)",
           f"   the long run #{b['long_run']}: {b['long_run_steps']:,} steps, "
           f"{b['long_run_events']:,} events"]
    asked = {"runs": s["runs"], "pending": s["pending"], "events": s["events"],
             "long_run_steps": s["long_run_steps"]}
    wrong = [f"{k}: asked {v:,}, the database holds {db[k]:,}" for k, v in asked.items()
             if db[k] != v]
    out.append("   counted in the database afterwards: " + (
        "; ".join(wrong) if wrong else "runs, pending approvals, events and the long run's "
        "steps are what was asked"))
    out += ["", f"Pages: {s['reps']} requests each, in process through Django's test client as "
            "a superuser, each on a fresh database", "connection; p50 and p95 of the server "
            "time (cpu: the request's own CPU time, p50); queries, their time (sql ms) and",
            f"the size from one more request. Target: p95 < {r['target_ms']:.0f} ms.", "",
            f"   {'page':<56}{'answer':>7}{'p50 ms':>9}{'p95 ms':>9}{'cpu ms':>8}"
            f"{'queries':>9}{'sql ms':>8}{'KB':>8}"]
    group = None
    for p in r["pages"]:
        if p["group"] != group:
            group = p["group"]
            out.append(f"   {group}")
        flag = "  > target" if p["over_target"] else ""
        answer = p["answer"] if p["status"] == 200 else f"{p['status']}!"
        out.append(f"     {p['page'][:54]:<54}{answer:>7}{p['p50_ms']:9.1f}{p['p95_ms']:9.1f}"
                   f"{p['cpu_p50_ms']:8.1f}{p['queries']:9}{p['sql_ms']:8.1f}"
                   f"{p['bytes'] / 1024:8.1f}{flag}")
    odd = [p for p in r["pages"] if p["status"] != 200]
    for p in odd:
        out.append(f"   ! {p['page']}: {p['answer']} ({p['path']})")
    out += ["", "Targets"]
    for t in r["targets"]:
        out.append(f"   [{'met' if t['met'] else 'NOT MET':>7}] {t['target']}: {t['figure']}")
    out.append(f"\nTotal {r['seconds']:.0f} s (build {r['build_seconds']:.0f} s, pages "
               f"{r['pages_seconds']:.0f} s).")
    return "\n".join(out)


def render_inflight(r: dict[str, Any]) -> str:
    """The ``--inflight`` section's table, as printed."""
    m, z = r["machine"], r["sizes"]
    fs = "" if r["fsyncs_measured"] else " (fsyncs: not measured, no C compiler)"
    out = [f"agent-runtime bench --inflight{' (--quick)' if r['quick'] else ''}"
           f" (runworker --cpu {r.get('cpu', 'off')}): SQLite "
           f"{m['sqlite']}, Python {m['python']}, {m['cpus']} CPUs, database in "
           f"{m['directory']}{fs}", "",
           f"Real runworker processes on a fresh SQLite file per line; runs of "
           f"{r['steps_per_run']} steps ({r['steps_per_run'] - 1} no-op reads, then the final "
           f"answer); {z['warm']:g} s warm-up,", f"then a {z['window']:g} s window: steps/s and "
           "latency from the events in it; commits and fsyncs per step over the "
           "workers' whole life.", ""]

    def na(v: float | None, fmt: str) -> str:
        return "n/m" if v is None else format(v, fmt)

    head = ("  in flight  avg  steps/s  {extra}  p50 ms  p99 ms  cpu ms/step  plans/step"
            "  commits/step  plans/commit  fsyncs/step  writer held  locked")

    def row(x: dict[str, Any], extra: str) -> str:
        return (f"  {x['in_flight']:9} {x['in_flight_avg']:5.0f} {x['steps_per_s']:8.0f}  "
                f"{extra}  {x['p50_ms']:6.1f} {x['p99_ms']:7.1f} {x['cpu_ms_per_step']:12.2f}"
                f" {x['plans_per_step']:11.2f} {na(x['commits_per_step'], '.2f'):>13}"
                f" {na(x['plans_per_group'], '.1f'):>13}"
                f" {na(x['fsyncs_per_step'], '.2f'):>12} {x['writer_held']:12.0%}"
                f" {x['locked_errors']:7}")

    out += [f"1. In flight: one process, runworker --concurrency N, LLM answers after "
            f"{r['wait_ms']:.0f} ms (ideal: N x {1000 / r['wait_ms']:.0f} steps/s)"
            + (f", median of {z['rounds']} interleaved rounds" if z["rounds"] > 1 else ""),
            head.format(extra="  ideal  % ideal")]
    def rounds_line(line: list[dict[str, Any]]) -> None:
        if z["rounds"] > 1:
            out.append("   rounds (steps/s): " + "; ".join(
                f"{x['in_flight']}: " + ", ".join(f"{v:.0f}" for v in x["rounds_steps_per_s"])
                for x in line))

    for x in r["levels"]:
        out.append(row(x, f"{x['ideal_steps_per_s']:6.0f} {x['percent_of_ideal']:7.1f}%"))
    rounds_line(r["levels"])
    out.append("   worker RSS at the window's end (MiB): " + "; ".join(
        f"{x['in_flight']}: {x.get('rss_mib', 0):.0f}" for x in r["levels"]))
    rounds = f", median of {z['rounds']} interleaved rounds" if z["rounds"] > 1 else ""
    for key, title in (("nowait", f"2. No wait: one process, zero-latency LLM{rounds}"),
                       ("processes", f"3. Processes: N processes x {r['process_in_flight']} "
                                     f"in flight, zero-latency LLM{rounds}")):
        out += ["", title, head.format(extra="  x first")]
        for x in r[key]:
            out.append(row(x, f"{x['ratio']:8.2f}"))
        rounds_line(r[key])
        if z["rounds"] > 1:
            out.append("   x first: the median of each round's ratio (" + "; ".join(
                f"{x['in_flight']}: " + ", ".join(f"{v:.2f}" for v in x["rounds_ratio"])
                for x in r[key][1:]) + "); of the median rounds: " + ", ".join(
                f"{x['ratio_of_medians']:.2f}" for x in r[key][1:]))
    if r.get("loops"):
        out += ["", f"4. Loops: one process, {r['loops'][0]['in_flight']} in flight, zero-latency "
                f"LLM, runworker --loop threads then asyncio{rounds}",
                head.format(extra="  x first").replace("  in flight", "       loop")]
        for x in r["loops"]:
            out.append(row(x, f"{x['ratio']:8.2f}").replace(
                f"  {x['in_flight']:9}", f"  {x['loop']:>9}", 1))
        rounds_line(r["loops"])
    if r.get("agents"):
        out += ["", f"5. Agents: one process, {r['agents'][0]['in_flight']} in flight, model "
                f"answers after {r['wait_ms']:.0f} ms; steps counted as model requests "
                f"(ideal: N x {1000 / r['wait_ms']:.0f}/s){rounds}",
                head.format(extra="  ideal  % ideal").replace("  in flight", "      agent")]
        for x in r["agents"]:
            out.append(row(x, f"{x['ideal_steps_per_s']:6.0f} {x['percent_of_ideal']:7.1f}%")
                       .replace(f"  {x['in_flight']:9}", f"  {x['agent']:>11}", 1))
        rounds_line(r["agents"])
        out.append("   worker RSS at the window's end (MiB): " + "; ".join(
            f"{x['agent']}: {x.get('rss_mib', 0):.0f}" for x in r["agents"]))
        if r.get("pydantic_ai_own_cpu_ms"):
            out.append(f"   Pydantic AI's own CPU per model request, without the runtime (the "
                       f"same agent in this process): {r['pydantic_ai_own_cpu_ms']:.2f} ms")
    out += ["", "   avg: runs in flight on average in the window (claim to last event); latency:"
            " a step.started to the run's next step.started (or its end);",
            "   plans: distinct (run, time) of the window's events; commits: the workers' "
            "writer-queue count (their stop line; a group commit counts once);",
            "   plans/commit: plans per group commit; fsyncs: fsync + fdatasync",
            "   counted in the workers (LD_PRELOAD); writer held: share of the workers' active "
            "span some worker held the write lock; n/m: not measured.", "", "Targets"]
    for t in r["targets"]:
        out.append(f"   [{'met' if t['met'] else 'NOT MET':>7}] {t['target']}: {t['figure']}")
    out.append(f"\nTotal {r['seconds']:.0f} s.")
    return "\n".join(out)
