"""{% load schedules %}{% schedules_panel %}, {% monitors_panel %} and {%
files_panel %}: the session page's schedules, monitors and files panels,
each rendered from its own read (the chat view need not know about
schedules, monitors or documents). A
template library of the pages' own, registered by dotted path in settings
(TEMPLATES' "libraries"), so it lives in web/ beside its views instead of
in an app's templatetags package beneath every door."""

from __future__ import annotations

from typing import Any

from django import template

from sessions_app.web import files
from sessions_app.web.monitors import MONITORS_PANEL, monitors_context
from sessions_app.web.schedules import PANEL, panel_context

register = template.Library()


@register.inclusion_tag(PANEL, takes_context=True)
def schedules_panel(context: Any) -> dict[str, Any]:
    request = context["request"]
    return {**panel_context(context["session"], request.user), "csrf_token": context.get("csrf_token")}


@register.inclusion_tag(MONITORS_PANEL, takes_context=True)
def monitors_panel(context: Any) -> dict[str, Any]:
    """The session's monitors: last editions, coverage per source and partition, next run."""
    return monitors_context(context["session"], context["request"].user)


@register.inclusion_tag(files.PANEL, takes_context=True)
def files_panel(context: Any) -> dict[str, Any]:
    """The session's files: name, size, version and last writer; view,
    download, and an upload form for those who may drive the session."""
    request = context["request"]
    return {**files.panel_context(context["session"], request.user), "csrf_token": context.get("csrf_token")}
