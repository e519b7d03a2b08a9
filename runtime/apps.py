"""Django app config for the runtime."""

from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "runtime"
    verbose_name = "Agent runtime"
    default_auto_field = "django.db.models.BigAutoField"
