"""Agent versions: recorded on save, named by turn/start, moved only at a
turn boundary (by the profile's upgrade_policy) or by an upgrade through the
pre-flight (runtime/versions.py, services/versions.py)."""

from __future__ import annotations

import io
import json
import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

from sessions_app import log, services
from sessions_app.errors import LeaseLost, UpgradeRefused
from sessions_app.lg import ops as lg_ops
from sessions_app.models import AgentProfile, AgentVersion, Event, Session
from sessions_app.runtime import lease, versions
from sessions_app.services import versions as version_services
from tests.sessions_app.apiutil import bearer, token_for


def numbers(profile: AgentProfile) -> list[int]:
    return list(AgentVersion.objects.filter(profile=profile).order_by("number").values_list("number", flat=True))


def starts(session: Session) -> list[dict[str, Any]]:
    return [e["version"]["number"] for e in kinds(session, "turn/start")]


def kinds(session: Session, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(session=session, kind=kind).order_by("seq").values_list("data", flat=True))


def moves(session: Session) -> list[tuple[int | None, int, str]]:
    """session/upgraded as (from, to, by) numbers; each digest is checked to be the version's own."""
    out = []
    for d in kinds(session, "session/upgraded"):
        for ref in (d["from"], d["to"]):
            if ref is not None:
                assert (
                    ref["digest"] == AgentVersion.objects.get(profile=session.profile_id, number=ref["number"]).digest
                )
        out.append((d["from"] and d["from"]["number"], d["to"]["number"], d["by"]))
    return out


def end_turn(session: Session) -> None:
    assert services.cancel(session.id, by="owner")


@pytest.mark.django_db
def test_a_save_records_a_version_only_when_the_definition_changes(profile: AgentProfile) -> None:
    assert numbers(profile) == [1]
    first = AgentVersion.objects.get(profile=profile)
    assert first.digest == versions.digest_of(versions.snapshot_of(profile))
    assert {t["name"] for t in first.snapshot["tools"]} == set(profile.builtin_tools)
    write = next(t for t in first.snapshot["tools"] if t["name"] == "workspace.write")
    assert write["parameters"]["type"] == "object" and write["approval"] and write["replay"]

    profile.save()  # nothing changed
    profile.description = "bookkeeping only"
    profile.upgrade_policy = "pinned"
    profile.save()
    assert numbers(profile) == [1]

    profile.system_prompt = "be brief"
    profile.save()
    assert numbers(profile) == [1, 2]
    assert AgentVersion.objects.get(profile=profile, number=2).snapshot["profile"]["system_prompt"] == "be brief"
    profile.approvals = {"workspace.write": "never"}  # a tool's approval mode is part of the definition
    profile.save()
    assert numbers(profile) == [1, 2, 3]

    # A decimal set in memory and the same value read back are one definition.
    profile.daily_cost_usd = Decimal("7")
    profile.save()
    assert numbers(profile) == [1, 2, 3, 4]
    newest = AgentVersion.objects.get(profile=profile, number=4)
    assert newest.digest == versions.digest_of(versions.snapshot_of(profile))
    assert newest.digest == versions.digest_of(versions.snapshot_of(AgentProfile.objects.get(pk=profile.pk)))
    AgentProfile.objects.get(pk=profile.pk).save()
    assert numbers(profile) == [1, 2, 3, 4]


def test_the_digest_is_stable_and_canonical() -> None:
    a = {"profile": {"roles": {"main": "x", "titler": "y"}, "n": 1}, "tools": []}
    b = {"tools": [], "profile": {"n": 1, "roles": {"titler": "y", "main": "x"}}}
    assert versions.digest_of(a) == versions.digest_of(b)
    assert versions.digest_of(a) == versions.digest_of(json.loads(json.dumps(a)))
    assert versions.digest_of(a) != versions.digest_of({**a, "tools": [{"name": "clock.now"}]})
    assert len(versions.digest_of(a)) == 64


@pytest.mark.django_db
def test_a_version_rebuilds_the_profile_a_turn_ran_with(profile: AgentProfile) -> None:
    profile.system_prompt, profile.daily_cost_usd = "v1 prompt", "1.5"
    profile.save()
    profile.refresh_from_db()
    old = max(numbers(profile))
    profile.system_prompt, profile.builtin_tools = "v2 prompt", ["clock.now"]
    profile.save()
    then = versions.profile_at(profile, old)
    assert (then.pk, then.name, then.system_prompt) == (profile.pk, profile.name, "v1 prompt")
    assert "workspace.write" in then.builtin_tools and str(then.daily_cost_usd) == "1.500000"
    assert versions.profile_at(profile, None) is profile


@pytest.mark.django_db
def test_next_turn_opens_on_the_newest_version_and_records_the_move(session: Session, profile: AgentProfile) -> None:
    services.run_turn(session.id, "one")
    profile.system_prompt = "changed"
    profile.save()
    session.refresh_from_db()
    assert session.agent_version == 1  # the open turn keeps its version
    end_turn(session)
    services.run_turn(session.id, "two")
    assert starts(session) == [1, 2]
    assert moves(session) == [(1, 2, "policy")]
    [_, second] = kinds(session, "turn/start")
    assert second["version"]["digest"] == AgentVersion.objects.get(profile=profile, number=2).digest
    session.refresh_from_db()
    assert session.agent_version == 2


@pytest.mark.django_db
def test_pinned_stays_until_an_upgrade(session: Session, profile: AgentProfile, owner: Any) -> None:
    profile.upgrade_policy = "pinned"
    profile.save()
    services.run_turn(session.id, "one")
    end_turn(session)
    profile.system_prompt = "changed"
    profile.save()
    receipt = services.inject(session.id, "two", wake=True)  # admission's guarded fast path
    assert receipt.disposition == "started"
    end_turn(session)
    assert starts(session) == [1, 1] and kinds(session, "session/upgraded") == []

    client = Client()
    answer = client.post(
        f"/api/sessions/{session.id}/upgrade", {}, content_type="application/json", **bearer(token_for(owner))
    )
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"number": 2, "digest": versions.get(profile.pk, 2).digest, "latest": 2}
    assert moves(session) == [(1, 2, "owner")]
    services.inject(session.id, "three", wake=True)
    assert starts(session) == [1, 1, 2]
    detail = client.get(f"/api/sessions/{session.id}", **bearer(token_for(owner))).json()
    assert detail["version"] == {"number": 2, "digest": versions.get(profile.pk, 2).digest, "latest": 2}


def _parked_on(session: Session, name: str, arguments: dict[str, Any]) -> None:
    """An open turn parked on a call of `name`, as a worker leaves it."""
    services.run_turn(session.id, "go")
    call = {"id": "c1", "name": name, "arguments": json.dumps(arguments)}
    log.append_many(
        session.id,
        [
            ("step/start", {"step": 1, "model": "test/model"}),
            ("assistant/message", {"content": None, "tool_calls": [call]}),
            ("approval/requested", {"call_id": "c1", "name": name, "args": arguments}),
        ],
    )


@pytest.mark.django_db
def test_an_upgrade_that_would_strand_a_pending_approval_is_refused_and_changes_nothing(
    session: Session, profile: AgentProfile, owner: Any
) -> None:
    _parked_on(session, "workspace.write", {"path": "a.txt", "content": "x"})
    profile.builtin_tools = ["clock.now"]  # the parked call's tool is gone
    profile.save()
    before = Event.objects.filter(session=session).count()

    answer = Client().post(
        f"/api/sessions/{session.id}/upgrade", {"to": 2}, content_type="application/json", **bearer(token_for(owner))
    )
    assert answer.status_code == 409
    body = answer.json()
    assert body["code"] == "upgrade_refused"
    assert body["reasons"] == ["pending approval c1 (workspace.write): the tool is absent in version 2"]
    assert Event.objects.filter(session=session).count() == before
    session.refresh_from_db()
    assert session.agent_version == 1 and session.pending_approvals == 1


@pytest.mark.django_db
def test_the_preflight_checks_the_owed_call_against_the_target_schema(session: Session, profile: AgentProfile) -> None:
    _parked_on(session, "workspace.write", {"path": "a.txt"})  # no content: the schema wants it
    old = versions.get(profile.pk, 1)
    assert old is not None
    reasons = versions.strands(list(Event.objects.filter(session=session).order_by("seq")), old, old)
    assert len(reasons) == 1 and reasons[0].startswith("pending approval c1 (workspace.write): the input schema")
    profile.system_prompt = "v2"
    profile.save()
    with pytest.raises(UpgradeRefused) as refused:
        version_services.upgrade(session.id, 2, by="owner")
    assert refused.value.reasons == [reasons[0].replace("version 1", "version 2")]


@pytest.mark.django_db
def test_a_harmless_upgrade_moves_a_parked_turn(session: Session, profile: AgentProfile) -> None:
    _parked_on(session, "workspace.write", {"path": "a.txt", "content": "x"})
    profile.system_prompt = "v2"
    profile.save()
    assert version_services.upgrade(session.id, None, by="ops").number == 2
    session.refresh_from_db()
    assert session.agent_version == 2 and moves(session) == [(1, 2, "ops")]


@pytest.mark.django_db
def test_an_upgrade_after_the_lease_lapsed_fences_out_its_holder(session: Session, profile: AgentProfile) -> None:
    """The turn moves to the new version; a holder whose lease lapsed, still
    running the old one, appends nothing more to it."""
    _parked_on(session, "workspace.write", {"path": "a.txt", "content": "x"})
    held = lease.claim(session.id)
    assert held is not None
    Session.objects.filter(id=session.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    profile.system_prompt = "v2"
    profile.save()
    assert version_services.upgrade(session.id, None, by="ops").number == 2
    with pytest.raises(LeaseLost):
        log.append(session.id, "step/end", {"step": 1}, fence=held.fence)
    assert "step/end" not in [e.kind for e in Event.objects.filter(session=session)]


@pytest.mark.django_db
def test_bulk_upgrade_reports_the_refused(make_user: Any, profile: AgentProfile) -> None:
    parked = services.create_session(make_user("a"), profile)
    idle = services.create_session(make_user("b"), profile)
    _parked_on(parked, "workspace.write", {"path": "a.txt", "content": "x"})
    services.run_turn(idle.id, "go")
    end_turn(idle)
    profile.builtin_tools = ["clock.now"]
    profile.save()
    out = version_services.upgrade_profile(profile, None, by="ops")
    assert out.upgraded == [str(idle.id)] and list(out.refused) == [str(parked.id)]
    rows = {v.number: v.sessions for v in version_services.versions_of(profile)}
    assert rows == {2: 1, 1: 1}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_saves_never_share_a_number() -> None:
    profile = AgentProfile.objects.create(name="race", roles={"main": "test/model"})
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def save(i: int) -> None:
        try:
            mine = AgentProfile.objects.get(pk=profile.pk)
            mine.system_prompt = f"prompt {i}"
            barrier.wait()
            mine.save()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=save, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = numbers(profile)
    assert got == list(range(1, len(got) + 1)) and 2 <= len(got) <= 5
    profile.refresh_from_db()
    newest = AgentVersion.objects.get(profile=profile, number=got[-1])
    assert newest.digest == versions.digest_of(versions.snapshot_of(profile))
    assert connection.vendor == "postgresql"


# ---------------------------------------------------------------- operators


def _two_sessions(make_user: Any, profile: AgentProfile) -> tuple[Session, Session]:
    """One session parked on a call of workspace.write, one idle; then the
    profile's version 2 drops workspace.write."""
    parked = services.create_session(make_user("a"), profile)
    idle = services.create_session(make_user("b"), profile)
    _parked_on(parked, "workspace.write", {"path": "a.txt", "content": "x"})
    services.run_turn(idle.id, "go")
    end_turn(idle)
    profile.builtin_tools = ["clock.now"]
    profile.save()
    return parked, idle


@pytest.mark.django_db
def test_the_command_upgrades_in_bulk_and_lists_the_refused(make_user: Any, profile: AgentProfile) -> None:
    parked, idle = _two_sessions(make_user, profile)
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("upgrade_sessions", profile.name, stdout=out)
    assert exited.value.code == 1
    text = out.getvalue()
    assert f"{idle.id}: upgraded to version 2" in text
    assert f"{parked.id}: refused: pending approval c1 (workspace.write): the tool is absent" in text
    assert "1 upgraded, 1 refused" in text
    assert Session.objects.get(id=parked.id).agent_version == 1


@pytest.mark.django_db
def test_the_admin_shows_versions_and_upgrades_a_profiles_sessions(
    client: Client, make_user: Any, profile: AgentProfile
) -> None:
    parked, idle = _two_sessions(make_user, profile)
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    page = client.get(f"/admin/sessions_app/agentprofile/{profile.pk}/change/").content.decode()
    assert "v2 (" in page and "): 0; v1 (" in page  # newest first, with its session count
    url = "/admin/sessions_app/agentprofile/"
    answer = client.post(url, {"action": "upgrade_sessions", "_selected_action": [profile.pk]}, follow=True)
    text = answer.content.decode()
    assert f"Profile {profile.name}: 1 upgraded to version 2" in text
    assert f"Profile {profile.name}: {parked.id} refused: pending approval c1" in text
    assert Session.objects.get(id=idle.id).agent_version == 2


@pytest.mark.django_db
def test_metrics_count_sessions_per_version(client: Client, make_user: Any, profile: AgentProfile) -> None:
    _two_sessions(make_user, profile)
    client.force_login(make_user("ops", is_staff=True))
    text = client.get("/metrics").content.decode()
    assert 'terret_sessions_by_version{profile="t",version="1"} 2.0' in text


@pytest.mark.django_db
def test_profile_versions_are_listed(client: Client, owner: Any, profile: AgentProfile) -> None:
    profile.system_prompt = "v2"
    profile.save()
    answer = client.get(f"/api/profiles/{profile.name}/versions", **bearer(token_for(owner)))
    assert answer.status_code == 200
    got = answer.json()["versions"]
    assert [v["number"] for v in got] == [2, 1]
    assert got[0]["snapshot"]["profile"]["system_prompt"] == "v2" and got[0]["sessions"] == 0
    assert client.get("/api/profiles/nope/versions", **bearer(token_for(owner))).status_code == 400


@pytest.mark.django_db
def test_lg_threads_and_assistants_carry_the_version(session: Session, profile: AgentProfile) -> None:
    services.run_turn(session.id, "one")
    profile.system_prompt = "v2"
    profile.save()
    assert lg_ops.assistant(profile)["version"] == 2
    session.refresh_from_db()
    got = lg_ops.thread(session, values=False)["metadata"]["version"]
    assert got == {"number": 1, "digest": versions.get(profile.pk, 1).digest, "latest": 2}  # type: ignore[union-attr]


@pytest.mark.django_db
def test_the_fast_path_writes_nothing_once_the_version_it_read_moved(session: Session) -> None:
    services.run_turn(session.id, "one")
    end_turn(session)
    items = [("turn/start", {}), ("user/message", {"text": "x"})]
    assert log.append_many(session.id, items, guard=("idle_empty_inbox_at", 7)) == []  # on version 1, not 7
    assert len(log.append_many(session.id, items, guard=("idle_empty_inbox_at", 1))) == 2


@pytest.mark.django_db
def test_profile_versions_show_a_user_only_what_is_theirs(
    client: Client, owner: Any, profile: AgentProfile, make_user: Any
) -> None:
    """A version's MCP server environment and headers (where a token may
    sit) are masked to anyone but an operator, and each version counts only
    the sessions the caller may view: a second user learns nothing of the first's."""
    server = {"name": "fx", "command": "srv", "env": {"API_TOKEN": "s3cret"}, "headers": {"X-Key": "k"}}
    profile.mcp_servers = [server]
    profile.save()
    services.create_session(owner, profile)
    services.run_turn(Session.objects.get(owner=owner).id, "hi")  # its turn opens on the newest version
    other = make_user("other")
    got = client.get(f"/api/profiles/{profile.name}/versions", **bearer(token_for(other))).json()["versions"]
    assert got[0]["snapshot"]["profile"]["mcp_servers"][0]["env"] == {"API_TOKEN": "***"}
    assert got[0]["snapshot"]["profile"]["mcp_servers"][0]["headers"] == {"X-Key": "***"}
    assert "s3cret" not in json.dumps(got) and got[0]["sessions"] == 0
    mine = client.get(f"/api/profiles/{profile.name}/versions", **bearer(token_for(owner))).json()["versions"]
    assert mine[0]["sessions"] == 1
    staff = make_user("ops", is_staff=True)
    full = client.get(f"/api/profiles/{profile.name}/versions", **bearer(token_for(staff))).json()["versions"]
    assert full[0]["snapshot"]["profile"]["mcp_servers"][0]["env"] == {"API_TOKEN": "s3cret"}
