"""WSGI entry point for gunicorn."""

import os

from django.core.wsgi import get_wsgi_application

from runtime.host.files import restrict_umask

# Before settings make var/: what the console creates is private to this account (see
# manage.py; runtime/files.py). gunicorn's --umask covers only its socket and temporary files.
restrict_umask()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
application = get_wsgi_application()
