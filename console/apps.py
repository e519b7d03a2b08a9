from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_in


class ConsoleConfig(AppConfig):
    """The operator console."""

    name = "console"

    def ready(self) -> None:
        # console.middleware reaches django.contrib.auth's models: imported once they are
        # loaded (an import at the top of this module would load them too early).
        from console.middleware import start_idle_clock  # app registry

        # A session's idle clock starts at login (form, admin or force_login), so the first
        # page after logging in writes nothing more to the session.
        user_logged_in.connect(start_idle_clock, dispatch_uid="console.start_idle_clock")
