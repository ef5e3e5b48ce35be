"""Forms for the session pages. Validation here; the writes go through services."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms

from sessions_app.log.catalogue import RESOLUTIONS
from sessions_app.models import AgentProfile
from sessions_app.services import MAX_INPUT_CHARS
from sessions_app.services.budgets import MAX_COST_USD, MAX_COUNT
from sessions_app.services.effects import MAX_REASON_CHARS, MAX_RESULT_CHARS


class NewSessionForm(forms.Form):
    profile = forms.ModelChoiceField(
        queryset=AgentProfile.objects.all(),
        to_field_name="name",
        empty_label=None,
        label="Agent profile",
        error_messages={
            "required": "Pick an agent profile.",
            "invalid_choice": "That agent profile does not exist.",
        },
    )


class MessageForm(forms.Form):
    text = forms.CharField(
        label="Message",
        max_length=MAX_INPUT_CHARS,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "Message the agent", "autocomplete": "off"}),
        error_messages={
            "required": "Type a message first.",
            "max_length": "Too long: %(show_value)s characters, the limit is %(limit_value)s. Nothing was sent; "
            "shorten it or split it into parts.",
        },
    )
    # Which lane a message sent while a turn runs takes (blank: a steer).
    lane = forms.ChoiceField(
        choices=[("", "auto"), ("steer", "Steer now"), ("follow_up", "Send after this turn")],
        required=False,
        error_messages={"invalid_choice": "Pick Steer now or Send after this turn."},
    )
    # A fresh key per rendered form: a resubmitted POST (refresh, double
    # click, a retried htmx request) replays its receipt instead of running
    # the input twice.
    key = forms.CharField(widget=forms.HiddenInput, max_length=200, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            self.initial.setdefault("key", uuid.uuid4().hex)

    def clean_text(self) -> str:
        text: str = self.cleaned_data["text"]
        if not text.strip():
            raise forms.ValidationError("Type a message first.")
        return text


class ResolveForm(forms.Form):
    """An operator's answer to an attempt of unknown outcome (the chat page's
    notice): the service checks the rest (a rerun takes no result)."""

    call_id = forms.CharField(max_length=200, error_messages={"required": "Which call? (call_id is missing)"})
    action = forms.ChoiceField(
        choices=[(a, a) for a in RESOLUTIONS],
        error_messages={"required": "Pick re-run, done or failed.", "invalid_choice": "Pick re-run, done or failed."},
    )
    result = forms.CharField(max_length=MAX_RESULT_CHARS, required=False, strip=False)
    reason = forms.CharField(max_length=MAX_REASON_CHARS, required=False)


class BudgetForm(forms.Form):
    """The session's four limits (the chat page's budget panel); blank: no
    limit. The service checks them again (services/budgets.py)."""

    cost_usd = forms.DecimalField(
        label="Cost (USD)", required=False, min_value=0, max_value=MAX_COST_USD, decimal_places=6, max_digits=13
    )
    tokens = forms.IntegerField(label="Tokens", required=False, min_value=0, max_value=MAX_COUNT)
    steps = forms.IntegerField(label="Steps", required=False, min_value=0, max_value=MAX_COUNT)
    turns = forms.IntegerField(label="Turns", required=False, min_value=0, max_value=MAX_COUNT)

    def limits(self) -> dict[str, Any]:
        """The cleaned limits as set_budget takes them (cost as a string: no float rounding)."""
        data = self.cleaned_data
        cost = data.get("cost_usd")
        return {
            "cost_usd": None if cost is None else str(cost),
            "tokens": data.get("tokens"),
            "steps": data.get("steps"),
            "turns": data.get("turns"),
        }
