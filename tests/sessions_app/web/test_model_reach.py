"""The chat's model picker refuses a model no provider can reach (no API key)
before a turn fails on it, and the context view warns about the model in use."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from sessions_app import actions
from sessions_app.errors import InvalidInput
from sessions_app.models import Event, Session
from tests.helpers import client_for, edit_profile

pytestmark = pytest.mark.django_db


def test_a_model_without_an_api_key_is_refused_and_named(chat: Session, settings: Any) -> None:
    settings.TERRET_LLM_API_KEY = ""
    c = client_for(chat.owner)
    r = c.post(reverse("sessions:model", args=[chat.id]), {"spec": "openai/gpt-4o"})
    assert r.status_code == 400
    html = r.content.decode()
    assert "openai/gpt-4o cannot be reached" in html and "TERRET_LLM_API_KEY" in html
    assert not Event.objects.filter(session=chat, kind="model/updated").exists()
    with pytest.raises(InvalidInput, match="TERRET_LLM_API_KEY"):
        actions.set_model(chat.owner, chat.id, "main", "openai/gpt-4o")  # every door: the verb refuses
    # The offline demo needs no key.
    assert c.post(reverse("sessions:model", args=[chat.id]), {"spec": "demo/other"}).status_code == 302
    assert Event.objects.filter(session=chat, kind="model/updated").count() == 1


def test_with_a_key_the_same_model_is_taken(chat: Session, settings: Any) -> None:
    settings.TERRET_LLM_API_KEY = "k"
    r = client_for(chat.owner).post(reverse("sessions:model", args=[chat.id]), {"spec": "openai/gpt-4o"})
    assert r.status_code == 302
    assert Event.objects.get(session=chat, kind="model/updated").data["spec"] == "openai/gpt-4o"


def test_the_context_view_warns_about_the_model_in_use(chat: Session, settings: Any) -> None:
    settings.TERRET_LLM_API_KEY = ""
    edit_profile(chat.profile, roles={"main": "openai/gpt-4o"})
    page = client_for(chat.owner).get(reverse("sessions:context", args=[chat.id])).content.decode()
    assert 'id="model-unreachable"' in page and "TERRET_LLM_API_KEY" in page
    assert "openai-compatible" in page and "no API key" in page
    settings.TERRET_LLM_API_KEY = "k"
    page = client_for(chat.owner).get(reverse("sessions:context", args=[chat.id])).content.decode()
    assert 'id="model-unreachable"' not in page and "API key set" in page
