"""The API's errors: a stable ``code`` for each (``ERROR_CODES``, with its HTTP status), and
the runtime's conflicts mapped to them by their ``reason_code``, never by their wording."""

from __future__ import annotations

from typing import Any

from runtime.errors import (
    ApprovalConflict,
)

# Every error's code and its HTTP status (docs/reference/json-api.md).
ERROR_CODES = {
    "unauthorized": 401, "forbidden": 403, "not_found": 404, "already_decided": 409,
    "stale": 409, "retry": 409, "invalid": 422,
}


class ApiError(Exception):
    """An answer with an error: its stable ``code`` sets the status; ``extra`` joins the body."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        self.code, self.message, self.extra = code, message, extra
        self.status = ERROR_CODES[code]
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.extra}


def conflict(exc: ApprovalConflict) -> ApiError:
    """The runtime's conflict by its ``reason_code``, never by its wording."""
    if exc.reason_code in ("decided", "expired"):
        return ApiError("already_decided", exc.reason, status=exc.status,
                        decided_by=exc.decided_by or None,
                        decided_at=exc.decided_at.isoformat() if exc.decided_at else None)
    return ApiError("stale" if exc.reason_code == "stale" else "retry", exc.reason,
                    status=exc.status)
