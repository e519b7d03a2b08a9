#!/usr/bin/env python3
"""Django's command-line utility for the console and the runtime."""

import os
import sys

from django.core.management import execute_from_command_line

from runtime import conf
from runtime.host.files import restrict_umask


def main() -> None:
    # Every setting from the environment first: a bad one stops here with one line naming it
    # and what it accepts, before Django would turn it into a traceback.
    try:
        conf.read(os.environ)
    except conf.ConfigError as exc:
        sys.exit(f"configuration error: {exc}")
    # Before settings make var/: whatever this process and its children (workers, gunicorn,
    # collectstatic, the demo's world) create is private to this account. The database, its
    # lock, the secret key and var/ are created 0600/0700 anyway (runtime.host.files); this
    # covers everything else. RUNTIME_UMASK=027 (say) chooses another umask.
    restrict_umask()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
