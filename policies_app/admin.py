"""Floors are edited on the AgentProfile admin (sessions_app/admin.py). This
module adds validation of `allow_floor` with the documented pattern
syntax, so a bad floor gets a clear error in the form instead of silently
matching nothing at run time; a floor left empty becomes the profile's own
tools (an empty floor vetoes every call), and a floor that blocks one of the
profile's own built-in tools is saved only with an explicit confirmation. It extends whatever admin class sessions_app
registered (admin modules load in INSTALLED_APPS order, sessions_app first).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin

from policies_app.patterns import allowed, validate_patterns
from sessions_app.errors import InvalidPattern
from sessions_app.models import AgentProfile


def default_floor(builtin_tools: Any, mcp_servers: Any) -> list[str]:
    """The chosen tools: each built-in by name, each MCP server's tools by its prefix."""
    names = [t for t in builtin_tools or [] if isinstance(t, str)]
    servers = [s["name"] for s in mcp_servers or [] if isinstance(s, dict) and isinstance(s.get("name"), str)]
    return [*names, *(f"mcp.{name}.*" for name in servers)]


class AgentProfileForm(forms.ModelForm):  # type: ignore[type-arg]
    # No Meta: the admin builds the form for AgentProfile with its own fields.
    confirm_floor = forms.BooleanField(
        required=False,
        label="Save even though the allow floor blocks some of this profile's own tools",
        help_text="Needed only when the floor leaves out a ticked tool: its calls would all be vetoed.",
    )

    def clean_allow_floor(self) -> Any:
        try:
            return validate_patterns(self.cleaned_data.get("allow_floor") or [])
        except InvalidPattern as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if "allow_floor" not in cleaned or self.has_error("builtin_tools"):
            return cleaned  # the floor or the tools have their own error already
        tools = cleaned.get("builtin_tools") or []
        if not cleaned["allow_floor"]:
            cleaned["allow_floor"] = default_floor(tools, cleaned.get("mcp_servers"))
            return cleaned
        blocked = [t for t in tools if isinstance(t, str) and not allowed(t, cleaned["allow_floor"])]
        if blocked and not cleaned.get("confirm_floor"):
            self.add_error(
                "allow_floor",
                f"This floor blocks {', '.join(blocked)}, which the profile offers: every call of "
                f"{'it' if len(blocked) == 1 else 'them'} would be vetoed. Add a pattern, or tick "
                '"Save even though the allow floor blocks" to save it anyway.',
            )
        return cleaned


if admin.site.is_registered(AgentProfile):
    _base = type(admin.site._registry[AgentProfile])
    admin.site.unregister(AgentProfile)
    admin.site.register(AgentProfile, type("AgentProfileAdmin", (_base,), {"form": AgentProfileForm}))
