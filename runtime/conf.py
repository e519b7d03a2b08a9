"""Settings, in one place: every environment variable the project reads, with its type, its
default and the values it accepts, and the ``RUNTIME`` settings the runtime app reads, each
default written once.

``console/settings.py`` builds Django's settings from ``read(os.environ)``; the runtime reads
its own with ``setting(KEY)`` (a project that embeds the app sets ``RUNTIME`` itself, and
every key it leaves out has its default here). A bad value stops start-up with one line that
names the variable and what it accepts (``ConfigError``; ``manage.py`` and the WSGI entry
point print it and exit). The configuration reference in the docs is generated from
``VARIABLES`` (``manage.py configreference``) and a test keeps the two equal.

Importable before Django's settings exist (``manage.py`` checks the environment first).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dj_database_url
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class ConfigError(ImproperlyConfigured, ValueError):
    """A setting's value is not one the project accepts; the message names both."""

    def __init__(self, name: str, raw: str | None, accepted: str) -> None:
        """``raw`` None: the value is a secret, and the message does not repeat it."""
        self.name, self.raw, self.accepted = name, raw, accepted
        given = "the value given is not (it is not shown: it may hold a secret)" \
            if raw is None else f"not {raw!r}"
        super().__init__(f"{name} must be {accepted}; {given}" if raw is None
                         else f"{name} must be {accepted}, {given}")


# -- kinds of value ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """How a variable's text becomes a value, and what it accepts, in words."""

    accepted: str
    parse: Callable[[str], Any]


def _number(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(text)
    return value


def integer(low: int, high: int, what: str = "a whole number", low_means: str = "") -> Kind:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(text)
        return value
    means = f" ({low_means})" if low_means else ""
    return Kind(f"{what} from {low}{means} to {high}", parse)


def number(low: float, high: float, what: str = "a number of seconds") -> Kind:
    def parse(text: str) -> float:
        value = _number(text)
        if not low <= value <= high:
            raise ValueError(text)
        return value
    return Kind(f"{what} from {low:g} to {high:g}", parse)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(text)


FLAG = Kind("1 or 0 (or true/false, yes/no, on/off)", _flag)
TEXT = Kind("text", str)
LIST = Kind("a comma-separated list", lambda text: [i.strip() for i in text.split(",")
                                                     if i.strip()])


def _umask(text: str) -> int:
    value = int(text, 8)
    if not 0 <= value <= 0o777:
        raise ValueError(text)
    return value


UMASK = Kind("an octal umask from 000 to 777 (e.g. 027)", _umask)


def choice(*values: str) -> Kind:
    def parse(text: str) -> str:
        if text not in values:
            raise ValueError(text)
        return text
    return Kind("one of " + ", ".join(values), parse)


def _cpu(text: str) -> str | int:
    if text in ("auto", "off"):
        return text
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


CPU = Kind("auto, off, or a CPU's number (0, 1, ...)", _cpu)


def _token(text: str) -> str:
    if text and (len(text) < 16 or any(c.isspace() for c in text)):
        raise ValueError(text)
    return text


TOKEN = Kind("a token of 16 characters or more, without spaces", _token)


def _proxy_header(text: str) -> tuple[str, str]:
    name, _, value = text.partition("=")
    if not name.strip() or not all(c.isalnum() or c in "-_" for c in name.strip()):
        raise ValueError(text)
    return "HTTP_" + name.strip().upper().replace("-", "_"), value.strip() or "https"


def _database_url(text: str) -> str:
    engine = dj_database_url.parse(text).get("ENGINE", "")  # ValueError: an unknown scheme
    if not engine.endswith((".sqlite3", ".postgresql")):  # the runtime's two engines
        raise ValueError(text)
    return text


DATABASE_URL = Kind("a database URL such as postgres://user:password@host:5432/name or "
                    "sqlite:////path/to/file", _database_url)
PROXY_HEADER = Kind("a header name, optionally with its value (X-Forwarded-Proto or "
                    "X-Forwarded-Ssl=on)", _proxy_header)


# -- the variables ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variable:
    """One environment variable: its kind, its default (used when it is unset or empty), what
    it does, its group in the reference, and the ``RUNTIME`` key it sets, if any."""

    name: str
    kind: Kind
    default: Any
    help: str
    group: str
    key: str = ""
    secret: bool = False  # never shown in an error or the reference

    def read(self, environ: Mapping[str, str] = os.environ) -> Any:
        """The variable's value in ``environ``, or its default; ``ConfigError`` for a bad one."""
        raw = environ.get(self.name, "")
        text = raw if self.kind is TEXT else raw.strip()
        if text == "":
            return self.default
        try:
            return self.kind.parse(text)
        except (ValueError, TypeError):
            raise ConfigError(self.name, None if self.secret else raw,
                              self.kind.accepted) from None


MiB = 1024 * 1024
PG_NETWORK_TIMEOUTS = (2.0, 3600.0)  # seconds: the shortest and longest network bound
PG_POOL_MAX = 1000

VARIABLES: tuple[Variable, ...] = (
    # The runtime: its RUNTIME settings.
    Variable("RUNTIME_AGENTS", LIST, [], "More agents, as dotted paths to Agent objects (or "
             "lists of them), beside those the settings module names.", "runtime"),
    Variable("RUNTIME_LEASE_SECONDS", number(1, 86400), 30.0, "How long a worker's lease on a "
             "run lasts; its heartbeat renews it every third of that.", "runtime",
             key="LEASE_SECONDS"),
    Variable("RUNTIME_MAX_PAYLOAD_BYTES", integer(1, 64 * MiB, "a number of bytes"), MiB,
             "The largest JSON value stored: a run's input, a tool's arguments or result, a "
             "decision's result.", "runtime", key="MAX_PAYLOAD_BYTES"),
    Variable("RUNTIME_MAX_PAYLOAD_DEPTH", integer(4, 200, "a number of levels"), 32,
             "How deep objects and arrays may nest in a stored value.", "runtime",
             key="MAX_PAYLOAD_DEPTH"),
    Variable("RUNTIME_FOUR_EYES", FLAG, False, "Four-eyes: whoever started a run may not "
             "approve or resolve its side effects (rejecting stays open).", "runtime",
             key="FOUR_EYES"),
    Variable("RUNTIME_LLM_RETRIES", integer(0, 100), 3, "How many times a failed LLM request "
             "is asked again (timeouts, 429, 5xx, malformed answers).", "runtime",
             key="LLM_RETRIES"),
    Variable("RUNTIME_LLM_RETRY_BASE_SECONDS", number(0, 3600), 1.0, "The first wait before "
             "an LLM retry; it doubles each time, with jitter.", "runtime",
             key="LLM_RETRY_BASE_SECONDS"),
    Variable("RUNTIME_LLM_RETRY_MAX_SECONDS", number(0, 86400), 30.0, "The longest wait "
             "before an LLM retry (a server's Retry-After included).", "runtime",
             key="LLM_RETRY_MAX_SECONDS"),
    Variable("RUNTIME_APPROVAL_URL", TEXT, "http://127.0.0.1:8000/approvals/{id}/",
             "Where a notification sends a person to decide; {id} is the approval's id.",
             "runtime", key="APPROVAL_URL"),
    Variable("RUNTIME_APPROVAL_WARN_BEFORE", number(0, 30 * 86400), 900.0, "How long before "
             "an approval's deadline the channels told of it are warned, once, if nobody has "
             "decided (0: no warning).", "runtime", key="APPROVAL_WARN_BEFORE"),
    Variable("RUNTIME_APPROVAL_ESCALATE_BEFORE", number(0, 30 * 86400), 300.0, "How long "
             "before an approval's deadline it is escalated, once, to the channels that ask for "
             "approval.escalated, if nobody has decided (0: no escalation); less than the "
             "warning's.", "runtime", key="APPROVAL_ESCALATE_BEFORE"),
    Variable("RUNTIME_NOTIFY_WEBHOOK", TEXT, "", "A webhook (http or https URL) told of "
             "every approval requested.", "runtime"),
    Variable("RUNTIME_NOTIFY_SLACK", TEXT, "", "A Slack incoming-webhook URL told of every "
             "approval requested.", "runtime"),
    Variable("RUNTIME_NOTIFY_EMAIL", TEXT, "", "Comma-separated addresses mailed about every "
             "approval requested.", "runtime"),
    Variable("RUNTIME_SLACK_BOT_TOKEN", TOKEN, "", "The Slack app's bot token (xoxb-...): "
             "slack_app channels post approvals with it and update them with the outcome.",
             "runtime", key="SLACK_BOT_TOKEN", secret=True),
    Variable("RUNTIME_SLACK_SIGNING_SECRET", TOKEN, "", "The Slack app's signing secret: the "
             "console's /slack/interactions accepts only requests signed with it (unset: it "
             "answers 404).", "runtime", key="SLACK_SIGNING_SECRET", secret=True),
    Variable("RUNTIME_SLACK_API_URL", TEXT, "https://slack.com/api", "Slack's Web API.",
             "runtime", key="SLACK_API_URL"),
    Variable("RUNTIME_RETAIN_NOTIFICATIONS_DAYS", integer(0, 36500, "a number of days",
                                                          low_means="kept for ever"), 0,
             "`manage.py prune` removes notifications delivered or given up this many days "
             "ago, with their attempts.", "runtime", key="RETAIN_NOTIFICATIONS_DAYS"),
    Variable("RUNTIME_AUDIT_KEY", TEXT, "", "The key (32 characters or more) that signs audit "
             "checkpoints; keep it off the database's machine.", "runtime", key="AUDIT_KEY",
             secret=True),
    Variable("RUNTIME_CHECKPOINT_DIR", TEXT, "", "A directory (ideally on another machine's "
             "disk) holding signed audit checkpoints: `manage.py backup` writes one there, and a "
             "worker refuses to start on a database that is behind the newest one (it was "
             "restored by hand) until `manage.py restore --acknowledge` fences it. Empty: no "
             "such check.", "runtime", key="CHECKPOINT_DIR"),
    Variable("RUNTIME_WORKER_LOOP", choice("asyncio", "threads"), "asyncio", "How a worker "
             "runs its runs in flight: as tasks on one event loop (asyncio), or a thread each "
             "(threads). runworker's --loop default.", "runtime", key="WORKER_LOOP"),
    Variable("RUNTIME_WORKER_BLOCKING_THREADS", integer(0, 4096, low_means="as many as runs "
             "in flight"), 0, "The event-loop worker's threads for sync tools and model "
             "clients, made as calls block: how many may block at once (the rest queue).",
             "runtime", key="WORKER_BLOCKING_THREADS"),
    Variable("RUNTIME_WORKER_CPU", CPU, "off", "runworker's --cpu default: confine a worker's "
             "threads to one CPU.", "runtime"),
    Variable("RUNTIME_UMASK", UMASK, None, "The umask of every process (default: the one it "
             "found, made at least 077).", "runtime"),
    Variable("RUNTIME_VAR_DIR", TEXT, "", "Where the SQLite database, the secret key and the "
             "demo's files live (default: var/ beside manage.py).", "runtime"),
    Variable("RUNTIME_METRICS_TOKEN", TOKEN, "", "The bearer token Prometheus sends to the "
             "console's /metrics (Authorization: Bearer ...). Unset: /metrics answers 404.",
             "runtime", key="METRICS_TOKEN", secret=True),
    # The database.
    Variable("DATABASE_URL", DATABASE_URL, "", "The database: postgres://user:password@host/"
             "name for several machines (default: SQLite under var/).", "database",
             secret=True),
    Variable("RUNTIME_SQLITE_TIMEOUT", number(0.1, 3600), 20.0, "How long an SQLite writer "
             "waits for the write lock before 'database is locked'.", "database"),
    Variable("RUNTIME_SQLITE_WRITER_QUEUE", FLAG, True, "Queue SQLite writers on a lock file "
             "(0: SQLite's busy handler alone).", "database"),
    Variable("RUNTIME_PG_NETWORK_TIMEOUT", number(*PG_NETWORK_TIMEOUTS), 15.0, "The longest "
             "any wait on PostgreSQL's network lasts (connect, keepalives, a silent server).",
             "database"),
    Variable("RUNTIME_PG_POOL_SIZE", integer(0, PG_POOL_MAX, low_means="no pool"), 20,
             "The most PostgreSQL connections a worker process opens.", "database"),
    # The OpenAI-compatible LLM client (OpenAIChat.from_env).
    Variable("RUNTIME_LLM_BASE_URL", TEXT, "", "The chat-completions server, e.g. "
             "http://127.0.0.1:8000/v1.", "llm"),
    Variable("RUNTIME_LLM_MODEL", TEXT, "", "The model to ask.", "llm"),
    Variable("RUNTIME_LLM_API_KEY", TEXT, "", "The API key, if the server wants one.", "llm",
             secret=True),
    Variable("RUNTIME_LLM_TIMEOUT", number(0.1, 3600), 60.0, "How long one LLM request may "
             "take.", "llm"),
    # The console.
    Variable("DJANGO_SECRET_KEY", TEXT, "", "Signs sessions; default: a key made once and "
             "kept in var/secret_key. Machines serving one console share it.", "console",
             secret=True),
    Variable("DJANGO_DEBUG", FLAG, False, "Django's debug mode (never in production).",
             "console"),
    Variable("DJANGO_ALLOWED_HOSTS", LIST, ["127.0.0.1", "localhost"], "The host names the "
             "console answers to.", "console"),
    Variable("DJANGO_CSRF_TRUSTED_ORIGINS", LIST, [], "Origins (https://console.example.com) "
             "trusted for forms behind a proxy.", "console"),
    Variable("DJANGO_SECURE_COOKIES", FLAG, False, "Session and CSRF cookies over HTTPS "
             "only.", "console"),
    Variable("DJANGO_SSL_REDIRECT", FLAG, False, "Redirect plain HTTP to HTTPS (/healthz "
             "excepted).", "console"),
    Variable("DJANGO_HSTS_SECONDS", integer(0, 2 * 365 * 86400, "a number of seconds"), 0,
             "Strict-Transport-Security's max-age (0: not sent).", "console"),
    Variable("DJANGO_HSTS_INCLUDE_SUBDOMAINS", FLAG, False, "HSTS for subdomains too.",
             "console"),
    Variable("DJANGO_HSTS_PRELOAD", FLAG, False, "Ask browsers to preload HSTS.", "console"),
    Variable("DJANGO_PROXY_SSL_HEADER", PROXY_HEADER, None, "The header the TLS proxy sets "
             "to say the browser used HTTPS.", "console"),
    Variable("DJANGO_PROXY_COUNT", integer(0, 10), 0, "How many proxies append the client's "
             "address to X-Forwarded-For (0: the header is ignored).", "console"),
    Variable("CONSOLE_CHECK_URL", TEXT, "", "Where an operator checks whether a call took "
             "effect: a URL with {key} (the idempotency key) and {tool}.", "console"),
    Variable("CONSOLE_SESSION_IDLE_SECONDS", integer(60, 30 * 86400, "a number of seconds"),
             1800, "A session unused this long ends.", "console"),
    Variable("CONSOLE_PASSWORD_MIN_LENGTH", integer(8, 128, "a number of characters"), 12,
             "The shortest password the console accepts.", "console"),
    Variable("CONSOLE_LOGIN_FAILURE_LIMIT", integer(1, 1000), 5, "Failed logins from one "
             "address or for one name before both are locked out.", "console"),
    Variable("CONSOLE_LOGIN_COOLOFF_SECONDS", integer(1, 30 * 86400, "a number of seconds"),
             900, "How long a lockout lasts, from the last failure.", "console"),
    Variable("CONSOLE_RECENT_DEAD_WORKERS_SECONDS", number(0, 365 * 86400), 3600.0, "How "
             "long a dead worker stays on the Workers page's first tab.", "console"),
    Variable("CONSOLE_RETAIN_IDEMPOTENCY_DAYS", integer(0, 36500, "a number of days",
                                                        low_means="kept for ever"), 0,
             "`manage.py pruneapi` removes the answers kept for Idempotency-Key requests this "
             "many days old.", "console"),
    Variable("CONSOLE_RETAIN_API_TOKENS_DAYS", integer(0, 36500, "a number of days",
                                                       low_means="kept for ever"), 0,
             "`manage.py pruneapi` removes API tokens unused (and not issued or revoked) for "
             "this many days.", "console"),
    # Email (notifications by mail).
    Variable("EMAIL_HOST", TEXT, "localhost", "The SMTP server.", "email"),
    Variable("EMAIL_PORT", integer(1, 65535, "a port"), 25, "Its port.", "email"),
    Variable("EMAIL_HOST_USER", TEXT, "", "Its user name.", "email"),
    Variable("EMAIL_HOST_PASSWORD", TEXT, "", "Its password.", "email", secret=True),
    Variable("EMAIL_USE_TLS", FLAG, False, "STARTTLS to the SMTP server.", "email"),
    Variable("DEFAULT_FROM_EMAIL", TEXT, "agent-runtime@localhost", "The sender of "
             "notification mails.", "email"),
    # The demo (manage.py demo).
    Variable("RUNTIME_DEMO", FLAG, False, "Serve the demo's outside world at /demo/ (manage.py "
             "demo sets it).", "demo"),
    Variable("RUNTIME_DEMO_LLM", choice("scripted", "openai"), "scripted", "The demo agent's "
             "LLM: scripted, or the OpenAI-compatible server of RUNTIME_LLM_*.", "demo"),
    Variable("RUNTIME_DEMO_APPROVAL_CENTS", integer(0, 10**9, "a number of cents"), 15000,
             "Refunds above this need a person's approval.", "demo"),
    Variable("RUNTIME_DEMO_DIR", TEXT, "", "Where the demo's outside world keeps its ledgers "
             "(default: var/demo).", "demo"),
    Variable("CONSOLE_PASSWORD", TEXT, "", "The demo's admin password (default: a random one, "
             "printed).", "demo", secret=True),
)
BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}
GROUPS = {"runtime": "The runtime", "database": "The database",
          "llm": "The OpenAI-compatible LLM client (OpenAIChat.from_env)",
          "console": "The console", "email": "Email (notifications by mail)",
          "demo": "The demo (manage.py demo)"}


def read(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Every variable's value, by name; the first bad one raises ``ConfigError``."""
    return {v.name: v.read(environ) for v in VARIABLES}


def value(name: str, environ: Mapping[str, str] = os.environ) -> Any:
    """One variable's value (``ConfigError`` if it is bad)."""
    return BY_NAME[name].read(environ)


# -- the RUNTIME settings -----------------------------------------------------------------------

@dataclass(frozen=True)
class Key:
    """One ``RUNTIME`` setting: its default, and what it is, for the reference."""

    name: str
    default: Any
    help: str
    variable: str = ""  # the environment variable that sets it in this project, if any


def _from_variable(key: str) -> Key:
    variable = next(v for v in VARIABLES if v.key == key)
    return Key(key, variable.default, variable.help, variable.name)


KEYS: tuple[Key, ...] = (
    Key("AGENTS", [], "Dotted paths to Agent objects (or lists of them) the runtime may run."),
    *(_from_variable(v.key) for v in VARIABLES if v.key),
    Key("NOTIFY", [], "Notification channels: {name, kind (webhook, slack, slack_app, email), "
        "target, agents, events, group (email: a Django auth group mailed too)} each."),
    Key("SLACK_USERS", {}, "Who may decide from Slack: Slack user id (U...) to console user "
        "name; anyone else is refused."),
    Key("NOTIFY_BACKOFF_SECONDS", 5.0, "The first wait before a failed notification is sent "
        "again; it doubles each time, up to an hour."),
    Key("NOTIFY_MAX_ATTEMPTS", 30, "Attempts before a notification is given up as failed."),
    Key("APPROVAL_EXPIRES_SECONDS", {}, "Deadlines of interrupted-side-effect and reconcile "
        "approvals: agent name (or \"*\") to seconds; none by default."),
)
DEFAULTS: dict[str, Any] = {k.name: k.default for k in KEYS}


def setting(key: str) -> Any:
    """The runtime setting ``key``: ``settings.RUNTIME[key]`` where the project sets it, else
    its default."""
    return getattr(settings, "RUNTIME", {}).get(key, DEFAULTS[key])


def runtime_problems(runtime: Mapping[str, Any]) -> list[str]:
    """What is wrong with a ``RUNTIME`` dict (unknown keys, values of the wrong kind), one
    line each; ``manage.py check`` reports them (``runtime.E002``)."""
    out = [f"RUNTIME[{key!r}] is not a runtime setting (known: {', '.join(DEFAULTS)})"
           for key in runtime if key not in DEFAULTS]
    for key, variable in ((v.key, v) for v in VARIABLES if v.key):
        if key not in runtime:
            continue
        given = runtime[key]
        try:
            variable.kind.parse(str(int(given) if isinstance(given, bool) else given))
        except (ValueError, TypeError):
            out.append(f"RUNTIME[{key!r}] must be {variable.kind.accepted}, not {given!r}")
    return out + [p for p in [deadline_problem(runtime)] if p and not out]


def deadline_problem(runtime: Mapping[str, Any]) -> str | None:
    """Why the warning and escalation points before an approval's deadline do not fit
    together (the escalation comes after the warning: fewer seconds before the deadline), or
    None."""
    warn = runtime.get("APPROVAL_WARN_BEFORE", DEFAULTS["APPROVAL_WARN_BEFORE"])
    escalate = runtime.get("APPROVAL_ESCALATE_BEFORE", DEFAULTS["APPROVAL_ESCALATE_BEFORE"])
    for key, given in (("APPROVAL_WARN_BEFORE", warn), ("APPROVAL_ESCALATE_BEFORE", escalate)):
        if isinstance(given, bool) or not isinstance(given, int | float) or not (
                0 <= given <= 30 * 86400):
            accepted = next(v.kind.accepted for v in VARIABLES if v.key == key)
            return f"RUNTIME[{key!r}] must be {accepted}, not {given!r}"
    if warn and escalate and escalate >= warn:
        return (f"RUNTIME['APPROVAL_ESCALATE_BEFORE'] ({escalate:g} s) must be less than "
                f"RUNTIME['APPROVAL_WARN_BEFORE'] ({warn:g} s): the escalation comes after the "
                "warning")
    return None
