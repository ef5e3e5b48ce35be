"""manage.py import_workspaces: an earlier release's workspace directories
become the sessions' documents, once (services/documents.import_directory)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from sessions_app.models import Event, Session
from tests.helpers import document_text, edit_profile

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_workspace_directories_are_imported_once(session: Session, profile: Any, settings: Any, tmp_path: Path) -> None:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    old = tmp_path / session.id.hex
    (old / "notes").mkdir(parents=True)
    (old / "notes" / "plan.md").write_text("from the old disk")
    (old / "charges.log").write_text("{}\n")  # debug.charge's record: not the agent's world
    (old / ".terret-write-abc").write_text("half")  # a write that died mid-rename
    (old / "link").symlink_to("/etc/passwd")
    (tmp_path / "not-a-session").mkdir()
    (tmp_path / ("0" * 32)).mkdir()  # a session id no session has
    out = io.StringIO()
    call_command("import_workspaces", stdout=out)
    assert f"{session.id}: 1 written, 0 unchanged" in out.getvalue()
    assert document_text(session.id, "notes/plan.md") == "from the old disk"
    assert [d["name"] for d in written(session)] == ["notes/plan.md"]
    again = io.StringIO()
    call_command("import_workspaces", "--session", str(session.id), stdout=again)
    assert f"{session.id}: 0 written, 1 unchanged" in again.getvalue()
    assert len(written(session)) == 1
    # a file a bound refuses is named, and the command says so in its status
    edit_profile(profile, max_document_bytes=4)
    (old / "big.txt").write_text("too large")
    with pytest.raises(SystemExit):
        call_command("import_workspaces", stdout=io.StringIO())
    assert document_text(session.id, "big.txt") is None


def written(session: Session) -> list[dict[str, Any]]:
    return list(Event.objects.filter(session=session, kind="document/written").values_list("data", flat=True))
