"""WSGI entry point for gunicorn."""

import os
import sys

from django.core.wsgi import get_wsgi_application

from runtime import conf
from runtime.host.files import restrict_umask

# A bad setting stops the server with one line naming it (manage.py does the same).
try:
    conf.read(os.environ)
except conf.ConfigError as exc:
    sys.exit(f"configuration error: {exc}")
# Before settings make var/: what the console creates is private to this account (see
# manage.py; runtime.host.files). gunicorn's --umask covers only its socket and temporary files.
restrict_umask()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
application = get_wsgi_application()
