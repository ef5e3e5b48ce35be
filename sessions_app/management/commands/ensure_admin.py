"""Create the first admin user, once.

`make run` calls this on every start. The username comes from
TERRET_ADMIN_USER (default `admin`); the password from TERRET_ADMIN_PASSWORD,
or, when that is unset, a generated one printed exactly once, at creation.
An existing user is left alone: its password is never reset or printed.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction


class Command(BaseCommand):
    help = "Create the first superuser from TERRET_ADMIN_USER / TERRET_ADMIN_PASSWORD if it does not exist."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default=None, help="default: $TERRET_ADMIN_USER or 'admin'")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"] or os.environ.get("TERRET_ADMIN_USER", "").strip() or "admin"
        User = get_user_model()
        with transaction.atomic():
            if User.objects.filter(username=username).exists():
                self.stdout.write(f"Admin user {username!r} exists; leaving it as it is.")
                return
            given = os.environ.get("TERRET_ADMIN_PASSWORD", "")
            if given and len(given) < 8:
                raise CommandError("TERRET_ADMIN_PASSWORD must be at least 8 characters")
            password = given or secrets.token_urlsafe(12)
            User.objects.create_superuser(username=username, email="", password=password)
        if given:
            self.stdout.write(f"Created admin user {username!r} with the password from TERRET_ADMIN_PASSWORD.")
            return
        # Printed once: it is not stored anywhere else in clear text.
        bar = "=" * 64
        self.stdout.write(
            f"{bar}\n"
            f"  Created admin user {username!r}\n"
            f"  password: {password}\n"
            f"  (shown only this once; change it at /admin/password_change/)\n"
            f"{bar}"
        )
