"""Django app config for the runtime."""

from django.apps import AppConfig

from runtime import checks  # noqa: F401 - registers the system checks


class RuntimeConfig(AppConfig):
    name = "runtime"
    verbose_name = "Agent runtime"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The notifications feature plugs into storage here: storage sends ``approval_written``
        # inside the transaction that writes an approval, and the outbox adds its rows to it.
        # Imported once the models are: an import at the top would load them too early.
        from runtime.notifications.outbox import outbox_on_approval_written  # app registry
        from runtime.storage.approval_rows import approval_written  # app registry

        approval_written.connect(outbox_on_approval_written, dispatch_uid="runtime.outbox")
        # And into the sweep before a deadline: its warning and escalation, in its transaction.
        from runtime.approvals.deadlines import approval_deadline_near  # app registry
        from runtime.notifications.outbox import outbox_on_deadline_near  # app registry

        approval_deadline_near.connect(outbox_on_deadline_near,
                                       dispatch_uid="runtime.outbox.deadline")
