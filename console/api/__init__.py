"""The JSON API under ``/api/``: programs read the queue, decide approvals and start runs.

``app`` holds the API object and its error handlers, ``endpoints`` the endpoints (imported
here, which registers them), ``schemas`` the request and response shapes, ``auth`` the
bearer tokens, ``errors`` the stable error codes, ``cursors`` the keyset pagination and
``idempotency`` the ``Idempotency-Key`` replays. django-ninja builds the OpenAPI schema
(``/api/openapi.json``) from the schemas.
"""

from console.api import endpoints  # noqa: F401 - registers the endpoints on the API
from console.api.app import api, urls

__all__ = ["api", "urls"]
