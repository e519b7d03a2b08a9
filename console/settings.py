"""Settings for the console project and the runtime app.

Configuration comes from the environment so the same code runs on a laptop (SQLite under
``var/``) and on several worker machines (PostgreSQL via ``DATABASE_URL``).
"""

import os
import secrets
import time
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("RUNTIME_VAR_DIR", BASE_DIR / "var"))



def _secret_key() -> str:
    """``DJANGO_SECRET_KEY``, or a random key made once for this install and kept (0600) in
    ``var/secret_key``, so no deployment ever runs on a key that is public in the source.
    Several machines serving one console must share a key: set the variable there."""
    key = os.environ.get("DJANGO_SECRET_KEY")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # another process may be writing it right now
            key = path.read_text().strip()
            if key:
                return key
            time.sleep(0.01)
        raise RuntimeError(f"{path} is empty: delete it, or set DJANGO_SECRET_KEY") from None
    key = secrets.token_urlsafe(50)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key


SECRET_KEY = _secret_key()
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = [
    h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h
]

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
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Every page needs a login except those marked @login_not_required (login, healthz).
    "console.middleware.LoginRequiredMiddleware",
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
    "timeout": float(os.environ.get("RUNTIME_SQLITE_TIMEOUT", "20")),
}


def _database() -> dict:
    url = os.environ.get("DATABASE_URL")
    if url:
        config = dj_database_url.parse(url, conn_max_age=0)
    else:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        config = {"ENGINE": "django.db.backends.sqlite3", "NAME": VAR_DIR / "runtime.sqlite3"}
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["OPTIONS"] = {**SQLITE_OPTIONS, **config.get("OPTIONS", {})}
        # Tests use files too: WAL and the heartbeat's own connection need a shared file.
        config.setdefault("TEST", {"NAME": str(VAR_DIR / "test-runtime.sqlite3")})
        # Writers queue on a flock instead of sleeping in SQLite's busy handler (the runtime's
        # backend, runtime/backends/sqlite3); RUNTIME_SQLITE_WRITER_QUEUE=0 turns that off.
        if os.environ.get("RUNTIME_SQLITE_WRITER_QUEUE", "1") != "0":
            config["ENGINE"] = "runtime.backends.sqlite3"
    return config


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
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
CONSOLE_CHECK_URL = os.environ.get("CONSOLE_CHECK_URL", "/demo/world/?key={key}")

# How long a dead worker stays on the Workers page's first tab, next to the live ones, counted
# from its last heartbeat (default one hour); older dead ones are on the second tab
# (/workers/?show=old). Every killed or restarted worker process leaves a row behind.
CONSOLE_RECENT_DEAD_WORKERS_SECONDS = float(
    os.environ.get("CONSOLE_RECENT_DEAD_WORKERS_SECONDS", "3600"))

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = os.environ.get("DJANGO_SECURE_COOKIES", "") == "1"
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"runtime": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
}

# The runtime app's own settings. AGENTS lists dotted paths to Agent objects;
# RUNTIME_AGENTS (comma-separated) adds more without editing this file.
RUNTIME = {
    "AGENTS": ["console.agents.hello", "demo.agents.AGENTS"]
    + [p for p in os.environ.get("RUNTIME_AGENTS", "").split(",") if p],
    "LEASE_SECONDS": float(os.environ.get("RUNTIME_LEASE_SECONDS", "30")),
    "MAX_PAYLOAD_BYTES": int(os.environ.get("RUNTIME_MAX_PAYLOAD_BYTES", str(1024 * 1024))),
    # Four-eyes: whoever started a run may not approve or resolve its side effects.
    "FOUR_EYES": os.environ.get("RUNTIME_FOUR_EYES", "") == "1",
    # Retries of a failed LLM request (timeouts, 429, 5xx, malformed answers), with backoff.
    "LLM_RETRIES": int(os.environ.get("RUNTIME_LLM_RETRIES", "3")),
    "LLM_RETRY_BASE_SECONDS": float(os.environ.get("RUNTIME_LLM_RETRY_BASE_SECONDS", "1")),
    "LLM_RETRY_MAX_SECONDS": float(os.environ.get("RUNTIME_LLM_RETRY_MAX_SECONDS", "30")),
}
