"""``manage.py demo``: the whole system in one foreground command.

Sets up the SQLite database, the operator account, static files and the refund desk's outside
world; queues refund runs; then serves the console with gunicorn and keeps two workers alive,
restarting any that die. With ``--chaos P`` each worker is armed to SIGKILL itself at
side-effect crash points (each call crashes with probability about P), so the approval queue
fills with real interrupted side effects next to the policy approvals. Ctrl-C stops everything;
workers release their leases on the way out.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count, Q

from demo import world
from runtime import conf
from runtime.agents.agent import registry
from runtime.host.files import private_dir, private_file
from runtime.host.pids import die_with_parent
from runtime.loop.control import start
from runtime.models import Approval, ApprovalStatus, Run, RunStatus

# Where a side-effect call can die: (crash point, step) of the refund desk's two side effects.
SIDE_EFFECT_POINTS = [("after_tool_started", 2), ("after_tool_dispatched", 2),
                      ("after_tool_effect", 2), ("after_tool_started", 3),
                      ("after_tool_effect", 3)]
# Given to the demo's operator besides the operators group.
DEMO_EXTRA_RUNTIME = ["manage_schedule", "add_run"]
DEMO_EXTRA_CONSOLE = ["view_apitoken", "add_apitoken", "change_apitoken"]
TOKEN_COMMAND = ".venv/bin/python manage.py apitoken create operator --name try-the-api"
REASONS = ["arrived broken", "never arrived", "wrong size", "changed my mind", "double charged"]


class Command(BaseCommand):
    help = ("Run the console, two supervised workers and the refund-desk agent on the embedded "
            "SQLite database (Ctrl-C stops everything).")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--runs", type=int, default=20, help="refund runs to queue now")
        parser.add_argument("--chaos", type=float, default=0.3,
                            help="probability that a side-effect call kills its worker")
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--llm", choices=["scripted", "openai"], default="scripted")
        parser.add_argument("--agent", choices=["native", "pydantic-ai"], default="native",
                            help="the refund desk written for the runtime, or with Pydantic AI")
        parser.add_argument("--no-server", action="store_true", help="workers only, no console")
        parser.add_argument("--until-quiet", action="store_true",
                            help="exit once no run is queued or running (for scripts and tests)")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["runs"] < 0 or opts["workers"] < 1 or not 0 <= opts["chaos"] <= 1:
            raise CommandError("--runs >= 0, --workers >= 1 and 0 <= --chaos <= 1, please")
        if opts["llm"] == "openai":
            missing = [v for v in ("RUNTIME_LLM_BASE_URL", "RUNTIME_LLM_MODEL")
                       if not conf.value(v).strip()]
            if missing:
                raise CommandError(f"--llm openai needs {', '.join(missing)} in the environment")
        self.rng = random.Random(opts["seed"])
        self.opts = opts
        self.setup()
        self.queue(opts["runs"])
        self.children: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, list[str]] = {}  # what to run again when a child dies
        self.stopping = False
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.on_signal)
        try:
            if not opts["no_server"]:
                self.spawn("console", [sys.executable, "-m", "gunicorn", "console.wsgi",
                                       "--bind", f"{opts['host']}:{opts['port']}",
                                       "--workers", "2", "--threads", "4",
                                       "--log-level", "warning"],
                           arm=False)
                self.stdout.write(self.style.SUCCESS(
                    f"console: http://{opts['host']}:{opts['port']}/  (Ctrl-C stops everything)"))
            for n in range(opts["workers"]):
                self.spawn(f"worker-{n + 1}", self.worker_args(n), arm=True)
            self.supervise()
        finally:
            self.stop()

    # -- setup ------------------------------------------------------------------------------------

    def setup(self) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        # The outside world's ledgers name customers: private like the runtime's own files
        # (0700 directory, 0600 files whatever the umask; existing ones keep their modes).
        private_dir(world.world_dir())
        for name in world.SCHEMA:
            private_file(world.world_dir() / f"{name}.sqlite3")
        world.setup()
        if not self.opts["no_server"]:
            call_command("collectstatic", verbosity=0, interactive=False)
        user_model = get_user_model()
        user = user_model.objects.filter(username="operator").first()
        if user is None:
            given = conf.value("CONSOLE_PASSWORD")
            password = given or secrets.token_urlsafe(12)
            user = user_model.objects.create_user("operator", password=password,
                                                  is_staff=True)
            shown = "from CONSOLE_PASSWORD" if given else password
            self.stdout.write(f"created the operator account: username operator, password "
                              f"{shown} (shown once)")
        else:
            self.stdout.write("operator account: operator (password as set before)")
        # The operators group (runtime migrations 0008, 0011) gives what an operator of a
        # deployment has; the demo's one account may also try what people are given one by
        # one there: schedules, starting runs and its own API tokens (the README's steps).
        user.groups.add(Group.objects.get(name="operators"))
        user.user_permissions.add(*Permission.objects.filter(
            Q(content_type__app_label="runtime", codename__in=DEMO_EXTRA_RUNTIME)
            | Q(content_type__app_label="console", codename__in=DEMO_EXTRA_CONSOLE)))
        self.stdout.write(f"database: {settings.DATABASES['default']['NAME']}; outside world: "
                          f"{world.world_dir()}")
        self.stdout.write(f"an API token for operator: {TOKEN_COMMAND} (prints it once)")

    def queue(self, runs: int) -> None:
        orders = world.order_ids()
        name, agents = self.desk()
        with registry.override(*agents):
            for _ in range(runs):
                start(name, {"order_id": self.rng.choice(orders),
                             "reason": self.rng.choice(REASONS)}, created_by="demo")
        if runs:
            self.stdout.write(f"queued {runs} refund runs")

    def desk(self) -> tuple[str, list[Any]]:
        """The refund desk's agent name, and the agents to register for it here."""
        if self.opts["agent"] == "native":
            return "refund-desk", []
        os.environ["RUNTIME_DEMO_LLM"] = self.opts["llm"]  # read as the agent is made
        from demo.pydantic_agent import AGENTS, NAME  # Pydantic AI loads where used

        return NAME, AGENTS

    # -- children ---------------------------------------------------------------------------------

    def worker_args(self, n: int) -> list[str]:
        return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "runworker",
                "--name", f"demo{n + 1}", "--concurrency", "2", "--poll-interval", "0.2",
                "-v", "0"]

    def arms(self) -> list[dict[str, Any]]:
        """A crash point for a (re)started worker: one side-effect point, firing on a
        geometrically distributed occurrence, so each pass through it dies with probability
        about ``--chaos``."""
        p = self.opts["chaos"]
        if p <= 0:
            return []
        point, step = self.rng.choice(SIDE_EFFECT_POINTS)
        occurrence = 1
        while self.rng.random() > p and occurrence < 1000:
            occurrence += 1
        return [{"point": point, "step_index": step, "occurrence": occurrence}]

    def spawn(self, name: str, args: list[str], *, arm: bool) -> None:
        site = f"http://{self.opts['host']}:{self.opts['port']}"
        env = {"RUNTIME_NOTIFY_WEBHOOK": f"{site}/demo/notifications/hook/",  # the ops chat
               "RUNTIME_APPROVAL_URL": f"{site}/approvals/{{id}}/", **os.environ,
               "PYTHONUNBUFFERED": "1", "RUNTIME_DEMO": "1", "RUNTIME_DEMO_LLM": self.opts["llm"]}
        if self.opts["agent"] == "pydantic-ai":  # the console and the workers know it too
            env["RUNTIME_AGENTS"] = ",".join(
                p for p in (os.environ.get("RUNTIME_AGENTS", ""), "demo.pydantic_agent.AGENTS")
                if p)
        env.pop("RUNTIME_CRASH_POINTS", None)
        arms = self.arms() if arm else []
        if arms:
            env["RUNTIME_CRASH_POINTS"] = json.dumps(arms)
        self.children[name] = subprocess.Popen(args, cwd=settings.BASE_DIR, env=env,
                                               stdin=subprocess.DEVNULL,
                                               start_new_session=True,
                                               preexec_fn=die_with_parent)
        self.commands[name] = args

    def status(self) -> str:
        counts = dict(Run.objects.values_list("status").order_by().annotate(n=Count("pk")))
        pending = Approval.objects.filter(status=ApprovalStatus.PENDING).values_list("kind")
        kinds = dict(pending.order_by().annotate(n=Count("pk")))
        return (f"runs {json.dumps(counts, sort_keys=True)}; approvals waiting for you "
                f"{json.dumps(kinds, sort_keys=True)}")

    def supervise(self) -> None:
        last = ""
        while not self.stopping:
            now = self.status()
            if now != last:
                self.stdout.write(now)
                last = now
            for name, proc in list(self.children.items()):
                code = proc.poll()
                if code is None or self.stopping:
                    continue
                if name == "console":
                    raise CommandError(f"the console server exited with status {code}")
                how = "was killed (SIGKILL)" if code == -signal.SIGKILL else f"exited {code}"
                self.stdout.write(f"{name} {how}; restarting it")
                self.spawn(name, self.commands[name], arm=True)
            if self.opts["until_quiet"] and not Run.objects.filter(
                    status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).exists():
                self.stdout.write("quiet: no run is queued or running")
                return
            time.sleep(0.2)  # the supervisor's own pace

    def on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def stop(self) -> None:
        self.stopping = True
        for proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.children.items():
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop in 40 s; killing it")
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.stdout.write(f"stopped. {self.status()}")
