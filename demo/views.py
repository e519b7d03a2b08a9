"""The demo's outside world, as an operator checks it: what the payment provider and the mail
server recorded, optionally under one idempotency key, each entry linked back to the run step
(and approvals) that made the call."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.utils.cache import patch_cache_control
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from console.permissions import viewing
from demo import world
from runtime.canonical import parse_json
from runtime.errors import InvalidPayload
from runtime.models import Approval, Step

# The run a key names: the runtime makes every step's key as run<id>-step<index>-<random>
# (runtime/execution.py). Only used to find the step along the (run, index) index; a step
# counts only if its own key is the ledger's key, exactly.
KEY_RUN = re.compile(r"run(\d+)-step\d+-")


@dataclass
class Origin:
    """The run step a call in the outside world came from, and that step's approvals."""

    run_id: int
    step_index: int
    approvals: list[Approval] = field(default_factory=list)


def origins(keys: Iterable[str]) -> dict[str, Origin]:
    """The step behind each idempotency key, with its approvals oldest first: two read-only
    queries whatever the number of keys. Keys the runtime did not make map to nothing."""
    keys = {k for k in keys if k and KEY_RUN.match(k)}
    if not keys:
        return {}
    run_ids = {int(m[1]) for k in keys if (m := KEY_RUN.match(k))}
    steps = list(Step.objects.filter(run_id__in=run_ids, idempotency_key__in=keys)
                 .values_list("pk", "run_id", "index", "idempotency_key"))
    found = {key: Origin(run_id, index) for _pk, run_id, index, key in steps}
    by_step = {pk: found[key] for pk, _run, _index, key in steps}
    for approval in (Approval.objects.filter(step_id__in=by_step).order_by("created_at", "pk")
                     .only("pk", "step_id", "kind", "status", "consumed_at")):
        by_step[approval.step_id].approvals.append(approval)
    return found


def _shown(rows: list[dict[str, Any]], found: dict[str, Origin]) -> list[dict[str, Any]]:
    """Ledger rows as the page shows them: the amount with its unit, the time parsed, and the
    run step each came from (None for a call the runtime did not make)."""
    out = []
    for row in rows:
        at = row.get("at")
        try:
            moment = datetime.fromisoformat(at) if at else None
        except ValueError:
            moment = None
        out.append({**row, "amount": world.money(row.get("amount_cents")), "moment": moment,
                    "origin": found.get(row.get("idempotency_key") or "")})
    return out


@viewing
@require_http_methods(["GET"])
def outside_world(request: HttpRequest) -> HttpResponse:
    """Never cached: recipients, amounts and keys must not outlive the operator's session."""
    key = request.GET.get("key", "").strip()[:200]
    ledger = world.ledger(key)
    found = origins(r.get("idempotency_key") or "" for rows in ledger.values() for r in rows)
    shown = {name: _shown(rows, found) for name, rows in ledger.items()}
    # The step the key was made for (and its approvals: the way back), found even when the
    # outside world recorded nothing under it.
    origin = (found.get(key) or origins([key]).get(key)) if key else None
    response = render(request, "demo/world.html", {"key": key, "ledger": shown,
                                                   "origin": origin})
    patch_cache_control(response, private=True, no_store=True)
    return response


MAX_HOOK_BYTES = 64 * 1024


@csrf_exempt
@login_not_required
@require_http_methods(["POST"])
def notification_hook(request: HttpRequest) -> HttpResponse:
    """The demo chat's webhook receiver (the runtime's notifications are sent here by the demo's
    workers): JSON only, bounded, kept once by idempotency key. Mounted only with the demo."""
    if len(request.body) > MAX_HOOK_BYTES:
        return HttpResponse("too large\n", status=413, content_type="text/plain")
    try:
        body = parse_json("notification", request.body)
    except (InvalidPayload, ValueError):
        return HttpResponseBadRequest("not JSON\n", content_type="text/plain")
    if not isinstance(body, dict) or not isinstance(body.get("idempotency_key"), str):
        return HttpResponseBadRequest("no idempotency_key\n", content_type="text/plain")
    new = world.receive_notification(body)
    return HttpResponse("kept\n" if new else "repeat dropped\n", content_type="text/plain")


@viewing
@require_http_methods(["GET"])
def notifications(request: HttpRequest) -> HttpResponse:
    """What the ops team's chat received: each approval notification once, with how many
    deliveries it took and a link to the approval."""
    response = render(request, "demo/notifications.html",
                      {"received": world.notifications_received()})
    patch_cache_control(response, private=True, no_store=True)
    return response
