"""manage.py upgrade_sessions <profile> [--to N]: move every session of a
profile to one of its agent versions (the newest by default), each through
its own pre-flight. Prints the sessions moved and, for each one refused,
what it would strand. Exit status 0 when none was refused, 1 otherwise."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions_app.errors import TerretError
from sessions_app.models import AgentProfile
from sessions_app.services import versions


class Command(BaseCommand):
    help = "Upgrade a profile's sessions to a version (default: the newest), reporting those the pre-flight refused."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("profile", help="the profile's name")
        parser.add_argument("--to", type=int, default=None, help="a version number (default: the newest)")
        parser.add_argument("--by", default="operator", help="who upgrades, as session/upgraded records it")

    def handle(self, *args: Any, **options: Any) -> None:
        profile = AgentProfile.objects.filter(name=options["profile"]).first()
        if profile is None:
            raise CommandError(f"no profile {options['profile']!r}")
        try:
            out = versions.upgrade_profile(profile, options["to"], by=options["by"])
        except TerretError as exc:
            raise CommandError(str(exc)) from exc
        for sid in out.upgraded:
            self.stdout.write(f"{sid}: upgraded to version {out.to}")
        for sid, reasons in out.refused.items():
            self.stdout.write(f"{sid}: refused: {'; '.join(reasons)}")
        self.stdout.write(f"{len(out.upgraded)} upgraded, {len(out.refused)} refused")
        if out.refused:
            raise SystemExit(1)
