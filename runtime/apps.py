"""Django app config for the runtime."""

from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "runtime"
    verbose_name = "Agent runtime"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from runtime import checks  # noqa: F401 - registers the system checks
