"""The user's settings page: API tokens, created (shown once) and revoked;
how the person is told when something needs them (notifications).

Writes go through services/tokens.py. A new token is shown once: the POST
that made it redirects to the page (post, redirect, get: reloading the page
makes no second token), which takes the raw token out of the user's server-
side session as it shows it, so a reload or Back shows it no more (only its
hash is stored; the page is no-store).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from sessions_app import actions
from sessions_app.errors import TerretError
from sessions_app.services import tokens


def _page(request: HttpRequest, *, status: int = 200, **extra: Any) -> HttpResponse:
    context = {
        "tokens": list(tokens.tokens_of(request.user)[:200]),
        "name_max": tokens.MAX_NAME_CHARS,
        "api_base": request.build_absolute_uri("/api/"),
        "notify": actions.notification_settings(request.user),
        **extra,
    }
    response = render(request, "settings/index.html", context, status=status)
    response["Cache-Control"] = "no-store"
    return response


# Where the raw token waits, in the user's session, for the one GET that shows it.
NEW_TOKEN_KEY = "terret_new_token"  # noqa: S105 - a session key's name, not a secret


@login_required
@require_GET
def settings_page(request: HttpRequest) -> HttpResponse:
    made = request.session.pop(NEW_TOKEN_KEY, None)
    if isinstance(made, dict):
        row = tokens.tokens_of(request.user).filter(pk=made.get("id")).first()
        if row is not None:
            return _page(request, new_token=made.get("raw", ""), new_token_row=row)
    return _page(request)


@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    name = request.POST.get("name", "")
    try:
        token, raw = tokens.create_token(request.user, name)
    except TerretError as exc:
        return _page(request, status=400, token_error=str(exc), token_name=name)
    request.session[NEW_TOKEN_KEY] = {"id": token.pk, "raw": raw}
    return redirect("sessions:settings")


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        token = tokens.revoke_token(request.user, token_id)
    except TerretError as exc:
        messages.error(request, f"Nothing revoked: {exc}.")
    else:
        messages.info(
            request, f"Revoked the token “{token.name}” ({token.prefix}…). Programs using it are refused now."
        )
    return redirect("sessions:settings")


@login_required
@require_POST
def notifications_save(request: HttpRequest) -> HttpResponse:
    """The notifications form: email on or off, the webhook URL, a new secret
    (left empty: the current one is kept)."""
    values: dict[str, Any] = {
        "email": request.POST.get("email") == "on",
        "webhook_url": request.POST.get("webhook_url", "").strip() or None,
    }
    if request.POST.get("webhook_secret"):
        values["webhook_secret"] = request.POST["webhook_secret"]
    try:
        actions.set_notification_settings(request.user, values)
    except TerretError as exc:
        return _page(request, status=400, notify_error=str(exc), notify_url=values["webhook_url"] or "")
    messages.info(request, "Notification settings saved.")
    return redirect("sessions:settings")
