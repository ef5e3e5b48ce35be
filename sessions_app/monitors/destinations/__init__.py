"""Destination kinds, one module per kind, in a registry like the sources'.

A destination's `send` answers one of three outcomes, and only the first
confirms: `Confirmed` carries a receipt with a resolvable identity (the
webhook's JSON id, the Message-ID the SMTP server accepted, the event's
seq); `Failed` means the destination certainly did not take it (the
connection was refused, it answered an error); anything else is `Unknown`
(a dropped connection after the request went out, a 200 with no id)."""

from __future__ import annotations

from sessions_app.monitors.destinations.base import Confirmed, Failed, Kind, Outcome, Publication, Unknown
from sessions_app.monitors.destinations.email import Email
from sessions_app.monitors.destinations.session import SessionDestination
from sessions_app.monitors.destinations.webhook import Webhook

__all__ = ["Confirmed", "Failed", "Kind", "Outcome", "Publication", "Unknown", "get", "names"]

_kinds: dict[str, Kind] = {k.name: k for k in (Webhook(), Email(), SessionDestination())}


def get(name: str) -> Kind | None:
    return _kinds.get(name)


def names() -> list[str]:
    return sorted(_kinds)
