"""Settings for the console project and the runtime app.

Configuration comes from the environment so the same code runs on a laptop (SQLite under
``var/``) and on several worker machines (PostgreSQL via ``DATABASE_URL``). Every variable is
read through ``runtime.conf`` (its type, default and accepted values, written once there); a
bad one stops start-up with a line naming it (``runtime.conf.ConfigError``).
"""

import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url

from runtime import conf
from runtime.host.files import private_dir, secret_key_file
from runtime.storage.postgres.network import with_network_options

ENV = conf.read(os.environ)
BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(ENV["RUNTIME_VAR_DIR"] or BASE_DIR / "var")


def _secret_key() -> str:
    """``DJANGO_SECRET_KEY``, or a random key made once for this install and kept (0600) in
    ``var/secret_key`` (var/ 0700), so no deployment ever runs on a key that is public in the
    source. Several machines serving one console must share a key: set the variable there."""
    return ENV["DJANGO_SECRET_KEY"] or secret_key_file(VAR_DIR / "secret_key")


SECRET_KEY = _secret_key()
DEBUG = ENV["DJANGO_DEBUG"]
ALLOWED_HOSTS = ENV["DJANGO_ALLOWED_HOSTS"]

# The demo (its outside world at /demo/world/) is served only by `manage.py demo` (which sets
# RUNTIME_DEMO=1, or at least RUNTIME_DEMO_LLM, for the gunicorn it starts) or in development.
CONSOLE_DEMO = DEBUG or ENV["RUNTIME_DEMO"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "runtime",
    "console",
    "demo",
    "axes",  # login throttling and lockout (AXES_* below)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Content-Security-Policy and Permissions-Policy on every response (SECURE_CSP below).
    "console.middleware.SecurityHeadersMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A session unused for CONSOLE_SESSION_IDLE_SECONDS ends (background polls do not count).
    "console.middleware.IdleSessionMiddleware",
    # Every page needs a login except those marked @login_not_required (login, healthz).
    "console.middleware.LoginRequiredMiddleware",
    # Last, as django-axes asks: turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

# django-axes' backend goes first: it refuses every login of a locked-out client before the
# password is even checked; ModelBackend then authenticates as before.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
            ],
        },
    },
]

# SQLite: WAL, synced commits, a busy timeout and BEGIN IMMEDIATE for every write transaction.
# Every connection Django opens (request threads, worker threads, the lease heartbeat's own)
# runs init_command, so the PRAGMAs hold everywhere.
SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;",
    "transaction_mode": "IMMEDIATE",
    "timeout": ENV["RUNTIME_SQLITE_TIMEOUT"],
}


def _database(environ: Mapping[str, str] = os.environ) -> dict:
    """The default database's entry from ``environ`` (the test suite reads it again for
    each database it makes, as a process started with that environment would)."""
    url = conf.value("DATABASE_URL", environ)
    config: dict[str, Any]  # keys beyond dj_database_url's DBConfig are added below
    if url:
        config = dict(dj_database_url.parse(url, conn_max_age=0))
    else:
        private_dir(VAR_DIR)  # 0700 whatever the umask (runtime.host.files)
        config = {"ENGINE": "django.db.backends.sqlite3", "NAME": VAR_DIR / "runtime.sqlite3"}
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["OPTIONS"] = {**SQLITE_OPTIONS, **config.get("OPTIONS", {})}
        # Tests use files too: WAL and the heartbeat's own connection need a shared file.
        config.setdefault("TEST", {"NAME": str(VAR_DIR / "test-runtime.sqlite3")})
        # Writers queue on a flock instead of sleeping in SQLite's busy handler (the runtime's
        # backend, runtime.storage.sqlite); RUNTIME_SQLITE_WRITER_QUEUE=0 turns that off.
        # The refusal of network file systems and the private file modes hold either way.
        config["ENGINE"] = "runtime.storage.sqlite"
        if not conf.value("RUNTIME_SQLITE_WRITER_QUEUE", environ):
            config["OPTIONS"]["writer_queue"] = False
    # PostgreSQL: every wait on a dead link bounded (runtime.storage.postgres.network); the URL's
    # options win. A worker's threads share a pool (runtime.storage.postgres.pool).
    return with_network_options(config)


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": ENV["CONSOLE_PASSWORD_MIN_LENGTH"]}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# Production serves hashed, compressed files from STATIC_ROOT (run `collectstatic` on deploy);
# with DJANGO_DEBUG=1 they come straight from the app and static/ directories instead.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage" if DEBUG
                    else "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

# Where an operator checks whether an interrupted call took effect: a URL with {key} (the
# step's idempotency key) and {tool}, linked from every approval. The demo's outside world by
# default; point it at your payment provider's dashboard, your mail logs, ...
CONSOLE_CHECK_URL = ENV["CONSOLE_CHECK_URL"] or ("/demo/world/?key={key}" if CONSOLE_DEMO
                                                  else "")
# The agents whose approvals link there: every agent for a URL you set; for the demo's own
# outside world, only the demo's refund desks (no other agent calls it).
CONSOLE_CHECK_AGENTS: tuple[str, ...] | None = (
    None if ENV["CONSOLE_CHECK_URL"] else ("refund-desk", "refund-desk-pai"))

# How long a dead worker stays on the Workers page's first tab, next to the live ones, counted
# from its last heartbeat (default one hour); older dead ones are on the second tab
# (/workers/?show=old). Every killed or restarted worker process leaves a row behind.
CONSOLE_RECENT_DEAD_WORKERS_SECONDS = ENV["CONSOLE_RECENT_DEAD_WORKERS_SECONDS"]

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# -- Sessions: they end when the browser closes, and after CONSOLE_SESSION_IDLE_SECONDS
# (default 30 minutes) without a request of the person's own (console.middleware
# .IdleSessionMiddleware; the pages' background polls do not keep a session alive).
SESSION_EXPIRE_AT_BROWSER_CLOSE = True
CONSOLE_SESSION_IDLE_SECONDS = ENV["CONSOLE_SESSION_IDLE_SECONDS"]
SESSION_COOKIE_AGE = CONSOLE_SESSION_IDLE_SECONDS  # the server forgets an idle session too
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"

# -- HTTPS, behind a TLS-terminating proxy (docs/operations/production.md). Each is off
# unless set, so a laptop on http://127.0.0.1:8000 works as before.
SESSION_COOKIE_SECURE = ENV["DJANGO_SECURE_COOKIES"]
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = ENV["DJANGO_SSL_REDIRECT"]
# Load balancers probe /healthz over plain HTTP, straight at gunicorn.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = ENV["DJANGO_HSTS_SECONDS"]
SECURE_HSTS_INCLUDE_SUBDOMAINS = ENV["DJANGO_HSTS_INCLUDE_SUBDOMAINS"]
SECURE_HSTS_PRELOAD = ENV["DJANGO_HSTS_PRELOAD"]
# The header the proxy sets to say the browser used HTTPS, e.g. X-Forwarded-Proto (value
# "https"), or "X-Forwarded-Ssl=on". Only set it if the proxy always sets or strips it.
if ENV["DJANGO_PROXY_SSL_HEADER"]:
    SECURE_PROXY_SSL_HEADER = ENV["DJANGO_PROXY_SSL_HEADER"]
CSRF_TRUSTED_ORIGINS = ENV["DJANGO_CSRF_TRUSTED_ORIGINS"]
# How many proxies in front of gunicorn append the client's address to X-Forwarded-For: the
# client is the address that many entries from the right. 0 (the default): the header is
# ignored and the socket's peer is the client (console.middleware.client_ip).
CONSOLE_PROXY_COUNT = ENV["DJANGO_PROXY_COUNT"]

# -- Content-Security-Policy (console.middleware.SecurityHeadersMiddleware): nothing inline,
# nothing evaluated; every script and stylesheet is a static file. The shape of Django 6.0's
# SECURE_CSP, so the built-in middleware can take over after an upgrade.
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}
# Browser features no console page uses, denied to every page (and to anything it embeds).
PERMISSIONS_POLICY = [
    "accelerometer", "autoplay", "camera", "display-capture", "geolocation",
    "gyroscope", "hid", "idle-detection", "magnetometer", "microphone", "midi", "payment",
    "publickey-credentials-get", "screen-wake-lock", "serial", "usb", "xr-spatial-tracking",
]

# -- Login throttling (django-axes, on /login/ and /admin/login/ alike): after
# CONSOLE_LOGIN_FAILURE_LIMIT failed logins from one client address, or for one username, both
# are refused (even with the right password) for CONSOLE_LOGIN_COOLOFF_SECONDS, counted from
# the last failure; the lockout page says so (HTTP 429). A success resets the count. Superusers
# lift a lockout in the admin (Axes > Access attempts) or with `manage.py axes_reset`.
AXES_FAILURE_LIMIT = ENV["CONSOLE_LOGIN_FAILURE_LIMIT"]
AXES_COOLOFF_TIME = timedelta(seconds=ENV["CONSOLE_LOGIN_COOLOFF_SECONDS"])
AXES_LOCKOUT_PARAMETERS = ["ip_address", "username"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_CLIENT_IP_CALLABLE = "console.middleware.client_ip"
AXES_SENSITIVE_PARAMETERS: list[str] = []  # log the username and address tried (never the password)

# -- Logging: everything at WARNING and above to stderr, with a timestamp: errors, every 4xx
# and 5xx answer (django.request), django.security.* (CSRF failures, bad hosts), failed logins
# and lockouts (axes). Gunicorn passes stderr on to its own log (or journald under systemd).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"refusals_on_one_line": {"()": "console.logs.RefusalsOnOneLine"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain",
                            "filters": ["refusals_on_one_line"]}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {
        "runtime": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        # Django's own default sends these to ADMINS by mail when DEBUG is off (nobody here):
        # to stderr through the root logger instead.
        "django": {"handlers": [], "level": "INFO" if DEBUG else "WARNING", "propagate": True},
        "axes": {"handlers": [], "level": "WARNING", "propagate": True},
    },
}

# The runtime app's own settings (runtime.conf lists every key and its default). AGENTS lists
# dotted paths to Agent objects; RUNTIME_AGENTS (comma-separated) adds more without editing
# this file. Each RUNTIME_* variable sets its key; notification channels come from
# RUNTIME_NOTIFY_WEBHOOK, _SLACK and _EMAIL.
RUNTIME = {
    "AGENTS": ["console.agents.hello", "demo.agents.AGENTS", *ENV["RUNTIME_AGENTS"]],
    **{v.key: ENV[v.name] for v in conf.VARIABLES if v.key},
    "NOTIFY": [
        {"name": kind, "kind": kind, "target": ENV[f"RUNTIME_NOTIFY_{kind.upper()}"]}
        for kind in ("webhook", "slack", "email") if ENV[f"RUNTIME_NOTIFY_{kind.upper()}"]
    ],
}

# Email notifications go through Django's email backend (SMTP unless configured otherwise).
EMAIL_HOST = ENV["EMAIL_HOST"]
EMAIL_PORT = ENV["EMAIL_PORT"]
EMAIL_HOST_USER = ENV["EMAIL_HOST_USER"]
EMAIL_HOST_PASSWORD = ENV["EMAIL_HOST_PASSWORD"]
EMAIL_USE_TLS = ENV["EMAIL_USE_TLS"]
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = ENV["DEFAULT_FROM_EMAIL"]
