"""Log filters of the console's own logging configuration (``console.settings.LOGGING``)."""

from __future__ import annotations

import logging


class RefusalsOnOneLine(logging.Filter):
    """A request refused with a 4xx (403 for a missing permission, 404) is one line: what was
    refused, not the traceback of the exception that refused it. Server errors keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", 500) < 500:
            record.exc_info, record.exc_text = None, None
        return True
