"""The runtime's tables: runs and steps, the audit log, approvals, schedules, notifications
and worker processes, one module each, all importable from here.

State is changed only by the runtime's store functions (``runtime.storage``, the lease holder's
commits in ``runtime.leasing``, the decisions in ``runtime.approvals.decisions``), each writing
the state change and its audit event in one transaction. Nothing here writes on save.
"""

from runtime.models.approvals import Approval, ApprovalKind, ApprovalStatus, held_step_status
from runtime.models.audit import AuditCheckpoint, AuditExport, Event, RunCreation
from runtime.models.backups import Backup, Restoration
from runtime.models.notifications import Notification, NotificationAttempt, NotificationStatus
from runtime.models.retention import PrunedRun, Pruning, RetiredTotal
from runtime.models.runs import (
    CANCELLABLE_RUN_STATUSES,
    IN_FLIGHT_STEP_STATUSES,
    TERMINAL_RUN_STATUSES,
    Effect,
    FailureCode,
    Run,
    RunStatus,
    Step,
    StepStatus,
)
from runtime.models.schedules import Schedule, ScheduleEvent
from runtime.models.workers import Protocol, Worker

__all__ = [
    "CANCELLABLE_RUN_STATUSES",
    "IN_FLIGHT_STEP_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "Approval",
    "ApprovalKind",
    "ApprovalStatus",
    "AuditCheckpoint",
    "AuditExport",
    "Backup",
    "Effect",
    "Event",
    "FailureCode",
    "Notification",
    "NotificationAttempt",
    "NotificationStatus",
    "Protocol",
    "PrunedRun",
    "Pruning",
    "Restoration",
    "RetiredTotal",
    "Run",
    "RunCreation",
    "RunStatus",
    "Schedule",
    "ScheduleEvent",
    "Step",
    "StepStatus",
    "Worker",
    "held_step_status",
]
