"""The API's errors: a stable ``code`` for each (``ERROR_CODES``, with its HTTP status), and
the runtime's conflicts mapped to them by their ``reason_code``, never by their wording."""

from __future__ import annotations

from typing import Any

from console import wording
from runtime.errors import (
    ApprovalConflict,
)
from runtime.models import ApprovalStatus
from runtime.selectors.approvals import approval_for_page

# Every error's code and its HTTP status (docs/reference/json-api.md).
ERROR_CODES = {
    "unauthorized": 401, "forbidden": 403, "not_found": 404, "already_decided": 409,
    "stale": 409, "retry": 409, "invalid": 422, "method_not_allowed": 405,
    "unsupported_media_type": 415,
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
    """The runtime's conflict by its ``reason_code``, never by its wording; its message in the
    console's words for the approval's status ("allowed, started at …", not "consumed")."""
    if exc.reason_code in ("decided", "expired"):
        return ApiError("already_decided", _decided_words(exc), status=exc.status,
                        decided_by=exc.decided_by or None,
                        decided_at=exc.decided_at.isoformat() if exc.decided_at else None)
    return ApiError("stale" if exc.reason_code == "stale" else "retry", exc.reason,
                    status=exc.status)


def _decided_words(exc: ApprovalConflict) -> str:
    approval = approval_for_page(exc.approval_id)
    when = f" at {wording.utc(exc.decided_at)}" if exc.decided_at else ""
    if exc.reason_code == "expired" or exc.status == ApprovalStatus.EXPIRED:
        return (f"this approval already expired{when} (nobody decided before its deadline); "
                "it is too late to decide")
    word = wording.status_word(approval, exc.status) if approval and exc.status else exc.status
    return (f"this approval was already decided by {exc.decided_by or 'the runtime'}{when} "
            f"({word})")
