"""Floors are edited on the AgentProfile admin (sessions_app/admin.py). This
module only adds validation of `allow_floor` with the documented pattern
syntax, so a bad floor gets a clear error in the form instead of silently
matching nothing at run time. It extends whatever admin class sessions_app
registered (admin modules load in INSTALLED_APPS order, sessions_app first).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin

from policies_app.patterns import validate_patterns
from sessions_app.errors import InvalidPattern
from sessions_app.models import AgentProfile


class AgentProfileForm(forms.ModelForm):  # type: ignore[type-arg]
    # No Meta: the admin builds the form for AgentProfile with its own fields.

    def clean_allow_floor(self) -> Any:
        try:
            return validate_patterns(self.cleaned_data.get("allow_floor") or [])
        except InvalidPattern as exc:
            raise forms.ValidationError(str(exc)) from None


if admin.site.is_registered(AgentProfile):
    _base = type(admin.site._registry[AgentProfile])
    admin.site.unregister(AgentProfile)
    admin.site.register(AgentProfile, type("AgentProfileAdmin", (_base,), {"form": AgentProfileForm}))
