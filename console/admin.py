"""API tokens in the admin: listed and revoked here; a new one is shown once, in a message.
People: the times Django records (last login, joined) are shown, not edited."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest

from console.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Only the hash is stored, so the token cannot be shown again: the message after
    creating one is the only time anyone sees it. Existing tokens are read-only but for
    revoking them."""

    list_display = ("name", "user", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username")
    actions = ["revoke"]

    # A flat list of names is a valid field list; the stubs' list[names or groups] is
    # invariant, so it is refused as a return type.
    def get_fields(  # type: ignore[override]
        self, request: HttpRequest, obj: ApiToken | None = None
    ) -> list[str]:
        if obj is None:
            return ["user", "name"]
        return ["user", "name", "created_at", "last_used_at", "revoked_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        if obj is None:
            return []
        return ["user", "name", "created_at", "last_used_at", "revoked_at"]

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            return  # nothing about a token changes but its revocation (the action)
        token = obj.set_new_token()
        obj.save()
        self.message_user(request, f"The token for {obj.user} ({obj.name}), shown only now: "
                          f"{token}", messages.WARNING)

    def has_delete_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return False  # revoke instead: the record of who had a token stays

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset.filter(revoked_at__isnull=True):
            token.revoke()
        self.message_user(request, "Revoked.", messages.SUCCESS)


class PersonAdmin(UserAdmin):
    """Django's own user admin, but the times it records itself are read, not typed in: an
    edited "last login" would mislead whoever reads it, and its split date and time boxes
    have no label of their own for a screen reader."""

    readonly_fields = ("last_login", "date_joined")


if admin.site.is_registered(User):  # Django's user model (the project does not swap it)
    admin.site.unregister(User)
    admin.site.register(User, PersonAdmin)
