from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The "refund desk" demo: an agent, its outside world, and ``manage.py demo``."""

    name = "demo"
    default_auto_field = "django.db.models.BigAutoField"
