"""The `email` destination: SMTP through Django's email framework; the
receipt is the Message-ID the server accepted. The Message-ID is derived
from the edition id, so a receiving side can tell a resend; but SMTP has no
idempotency key, so an unknown email edition waits for an operator."""

from __future__ import annotations

import smtplib
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage
from django.core.validators import validate_email

from sessions_app.errors import InvalidInput
from sessions_app.monitors.destinations.base import Confirmed, Failed, Outcome, Publication, Unknown

MAX_RECIPIENTS = 20


class Email:
    name = "email"
    version = 1
    idempotent = False
    local = False

    def check(self, config: dict[str, Any]) -> dict[str, Any]:
        to = config.get("to")
        if not isinstance(to, list) or not to or len(to) > MAX_RECIPIENTS:
            raise InvalidInput(f"an email destination needs 'to': a list of 1 to {MAX_RECIPIENTS} addresses")
        for address in to:
            try:
                validate_email(address)
            except (ValidationError, TypeError):
                raise InvalidInput(f"not an email address: {address!r}") from None
        return {"kind": "email", "to": sorted(set(to))}

    def key(self, config: dict[str, Any]) -> str:
        return ("email:" + ",".join(config["to"]))[:300]

    def send(self, config: dict[str, Any], p: Publication) -> Outcome:
        domain = settings.DEFAULT_FROM_EMAIL.rpartition("@")[2] or "terret"
        message_id = f"<terret-edition-{p.edition_id}@{domain}>"
        lines = [p.digest, ""] + [f"- {i['title']} {i['url']}" for i in p.items]
        message = EmailMessage(
            subject=f"Monitor digest, period {p.period}",
            body="\n".join(lines),
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=config["to"],
            headers={"Message-ID": message_id},
        )
        try:
            sent = mail.mailers.default.send_messages([message])
        except (ConnectionRefusedError, smtplib.SMTPConnectError, smtplib.SMTPRecipientsRefused) as exc:
            return Failed(f"not sent: {type(exc).__name__}: {exc}")
        except (OSError, smtplib.SMTPException) as exc:
            return Unknown(f"the message may have been accepted: {type(exc).__name__}: {exc}")
        if not sent:
            return Unknown("the mail backend reported nothing sent")
        return Confirmed(message_id)
