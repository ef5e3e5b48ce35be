"""manage.py import_workspaces [--session ID]: the workspace directories an
earlier release kept on this host's disk (TERRET_WORKSPACE_ROOT/<session
hex>/) written as the sessions' documents (docs/documents.md), each file a
version logged as document/written. Run it on every host that ran workers
before the upgrade; it is idempotent (a file already the document's head is
left). Exit status 0 when nothing was refused, 1 otherwise."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions_app.models import Session
from sessions_app.services import documents


class Command(BaseCommand):
    help = "Import this host's workspace directories (TERRET_WORKSPACE_ROOT) as the sessions' documents."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--session", default=None, help="one session's id (default: every directory found)")
        parser.add_argument("--by", default="import", help="who wrote them, as document/written records it")

    def handle(self, *args: Any, **options: Any) -> None:
        root = Path(settings.TERRET_WORKSPACE_ROOT)
        wanted: list[uuid.UUID | None]
        if options["session"]:
            try:
                wanted = [uuid.UUID(options["session"])]
            except ValueError:
                raise CommandError(f"not a session id: {options['session'][:64]!r}") from None
        else:
            wanted = [_session_id(p) for p in sorted(root.iterdir())] if root.is_dir() else []
        known = set(Session.objects.filter(id__in=[w for w in wanted if w]).values_list("id", flat=True))
        refused = 0
        for sid in wanted:
            if sid is None or sid not in known:
                continue
            out = documents.import_directory(sid, root / sid.hex, by=options["by"])
            refused += len(out.refused)
            for name, why in out.refused:
                self.stdout.write(f"{sid}: {name}: refused: {why}")
            self.stdout.write(f"{sid}: {len(out.written)} written, {len(out.unchanged)} unchanged")
        if refused:
            raise SystemExit(1)


def _session_id(path: Path) -> uuid.UUID | None:
    if not path.is_dir() or len(path.name) != 32:
        return None
    try:
        return uuid.UUID(hex=path.name)
    except ValueError:
        return None
