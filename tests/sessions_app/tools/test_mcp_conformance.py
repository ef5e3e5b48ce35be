"""MCP's own conformance suite (@modelcontextprotocol/conformance, pinned in
tests/mcp_fixtures) run against Terret's MCP client.

The suite starts a scenario's test server and runs our client command
(tests/sessions_app/tools/conformance_client.py: Terret's MCP manager over
Streamable HTTP) against it, then judges what it saw. The scenarios Terret
does not take part in are listed with the reason (docs/tools.md); the list
of client scenarios in the pinned suite is checked, so a new one is noticed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.sessions_app.tools.conftest import CONFORMANCE, need
from tests.workers import ROOT

PASSED = ["initialize", "tools_call", "sse-retry"]
# Not for Terret's client, and why (docs/tools.md, "Conformance").
NO_ELICITATION = "the client declares no elicitation: a worker has no human to ask in the middle of a call"
NO_OAUTH = "remote servers authenticate with headers from the environment; Terret has no OAuth client"
SKIPPED = {
    "elicitation-sep1034-client-defaults": NO_ELICITATION,
    **{
        f"auth/{name}": NO_OAUTH
        for name in [
            "metadata-default",
            "metadata-var1",
            "metadata-var2",
            "metadata-var3",
            "basic-cimd",
            "scope-from-www-authenticate",
            "scope-from-scopes-supported",
            "scope-omitted-when-undefined",
            "scope-step-up",
            "scope-retry-limit",
            "token-endpoint-auth-basic",
            "token-endpoint-auth-post",
            "token-endpoint-auth-none",
            "resource-mismatch",
            "pre-registration",
            "2025-03-26-oauth-metadata-backcompat",
            "2025-03-26-oauth-endpoint-fallback",
            "client-credentials-jwt",
            "client-credentials-basic",
        ]
    },
}
CLIENT = f"env PYTHONPATH={ROOT} {sys.executable} -m tests.sessions_app.tools.conformance_client"


def conformance(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(need(CONFORMANCE)), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_every_client_scenario_of_the_pinned_suite_is_accounted_for(tmp_path: Path) -> None:
    listing = conformance("list", cwd=tmp_path).stdout
    client = listing.split("Client scenarios", 1)[1]
    names = {line.strip()[2:] for line in client.splitlines() if line.strip().startswith("- ")}
    assert names == set(PASSED) | set(SKIPPED)


@pytest.mark.parametrize("scenario", PASSED)
def test_terret_client_passes_the_conformance_scenario(scenario: str, tmp_path: Path) -> None:
    run = conformance("client", "--command", CLIENT, "--scenario", scenario, cwd=tmp_path)
    report = run.stdout + run.stderr  # the suite prints its verdict on either, by version
    assert run.returncode == 0 and "OVERALL: PASSED" in report, report[-4000:]
    assert ", 0 failed, 0 warnings" in report
