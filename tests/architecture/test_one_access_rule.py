"""One access rule: no door keeps an access helper of its own (issue 28).
Every door asks sessions_app.actions.access.session_for; a door-local
`_viewable(request, ...)` and the like would answer the question its own way."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOOR_HELPER = re.compile(r"_drivable\(request|_viewable\(request|_session\(request|_readable\(request")


def test_no_door_keeps_an_access_helper_of_its_own() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for app in ("sessions_app", "policies_app", "approvals_app")
        for path in sorted((ROOT / app).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if DOOR_HELPER.search(line)
    ]
    assert not found, f"access helpers in the doors (ask actions.session_for instead): {found}"
