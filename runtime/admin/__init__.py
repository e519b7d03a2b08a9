"""The Django admin over the runtime's tables: read-only for everyone (``pages``), on the
shared base of every page (``base``); the record of audit exports and the page that downloads
one (``exports``). Importing this package registers the pages."""

from runtime.admin import exports, pages  # noqa: F401 - registers the admin pages
