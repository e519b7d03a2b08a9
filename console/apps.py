from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operator console."""

    name = "console"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        from .middleware import start_idle_clock

        # A session's idle clock starts at login (form, admin or force_login), so the first
        # page after logging in writes nothing more to the session.
        user_logged_in.connect(start_idle_clock, dispatch_uid="console.start_idle_clock")
