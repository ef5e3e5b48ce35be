"""How a side panel's form answers (the schedules and files panels): htmx
gets the panel back, a plain POST a redirect to the chat with a message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from sessions_app.models import Session


def answer(
    request: HttpRequest,
    session: Session,
    *,
    template: str,
    context: Callable[[], dict[str, Any]],
    notice: str = "",
    error: str = "",
    code: str = "",
    anchor: str = "",
) -> HttpResponse:
    """The panel (`template` over `context()`) for htmx, with the refusal's
    code in X-Terret-Error; otherwise the chat page with `error` or `notice`."""
    if getattr(request, "htmx", False):
        response = render(request, template, context())
        if error:
            response["X-Terret-Error"] = code or "invalid_input"  # 200, so htmx swaps; the code says it was refused
        return response
    (messages.error if error else messages.info)(request, error or notice)
    return redirect(reverse("sessions:chat", args=[session.id]) + (f"#{anchor}" if anchor else ""))
