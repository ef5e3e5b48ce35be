"""`python manage.py create_api_token <username> [--name NAME]`: issue a bearer
token for programs. The token is printed once, alone on stdout, so scripts can
capture it; only its hash is stored."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions_app.errors import InvalidInput
from sessions_app.services.tokens import issue_token


class Command(BaseCommand):
    help = "Create an API token for a user and print it (it cannot be shown again)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="command line", help="a label shown in the admin, e.g. 'ci bot'")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        user = User.objects.filter(**{User.USERNAME_FIELD: options["username"]}).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        if not user.is_active:
            raise CommandError(f"user {options['username']!r} is inactive; its tokens would not work")
        try:
            token, raw = issue_token(user, options["name"])
        except InvalidInput as exc:  # a name undecodable from argv arrives with lone surrogates
            raise CommandError(str(exc)) from None
        self.stdout.write(raw)
        self.stderr.write(f"token {token.prefix}… for {user.get_username()}: store it now, it is not kept")
