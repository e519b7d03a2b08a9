"""``python runtime/testkit/skew.py SECONDS COMMAND [ARGS...]``: run a ``manage.py`` command in
a process whose own clock reads ``SECONDS`` ahead (negative: behind) of the machine's.

The runtime's system clock (``runtime.clock.SystemClock``) stamps events and fires schedules;
leases are judged by the database server's clock (design §6), so a worker whose clock is hours
off must neither take over a live lease nor let its own lapse. This is how a test gives one
worker such a clock without touching the machine's. Run it as a script from the project's
directory (not with ``-m``: the kit's package imports models, which need the settings this
sets up first).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python runtime/testkit/skew.py SECONDS COMMAND [ARGS...]")
    offset = timedelta(seconds=float(argv[0]))
    sys.path.insert(0, os.getcwd())
    from runtime.host.files import restrict_umask

    restrict_umask()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    from runtime.clock import SystemClock

    own = SystemClock.now
    SystemClock.now = lambda self: own(self) + offset  # type: ignore[method-assign]
    execute_from_command_line(["manage.py", *argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
