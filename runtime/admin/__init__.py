"""The Django admin over the runtime's tables: read-only for everyone (``pages``), on the
shared base of every page (``base``). Importing this package registers the pages."""

from runtime.admin import pages  # noqa: F401 - registers the admin pages
