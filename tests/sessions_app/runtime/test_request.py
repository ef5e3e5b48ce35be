"""The request's messages are assembled once (runtime/request.py): what the
context view shows is what the runner sends on the next step."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app import services
from sessions_app.runtime import request
from sessions_app.runtime.drive import drive
from tests.fakes.fake_llm import Reply


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
def test_the_context_view_shows_what_the_runner_sends(session: Any, profile: Any, fake_llm: Any) -> None:
    profile.system_prompt = "Be brief."
    profile.save()
    services.inject(session.id, "first", wake=True, by="owner")
    fake_llm.script(Reply(text="one"))
    assert drive(session.id) == "ended"
    services.inject(session.id, "second", wake=True, by="owner")
    shown = request.build(session.id, profile)  # what the page shows before the next step
    fake_llm.script(Reply(text="two"))
    assert drive(session.id) == "ended"
    sent = fake_llm.requests[-1]["messages"]
    assert [(m["role"], m.get("content")) for m in sent] == [(m["role"], m.get("content")) for m in shown]
    assert shown[0] == {"role": "system", "content": "Be brief."}
    assert [m.get("content") for m in shown[1:]] == ["first", "one", "second"]
