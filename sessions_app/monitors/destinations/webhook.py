"""The `webhook` destination: a signed POST of the edition, its id as the
Idempotency-Key; the receipt is the JSON `id` of a 2xx answer. A 2xx with
no id is not a confirmation (Unknown); a refused connection or an error
status is a clean failure; a connection lost after the request went out is
Unknown, and reconciled by re-sending under the same key."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import httpx

from sessions_app import outbound
from sessions_app.errors import InvalidInput, UnsafeUrl
from sessions_app.monitors.destinations.base import Confirmed, Failed, Outcome, Publication, Unknown

SIGNATURE_HEADER = "X-Terret-Signature"
TIMEOUT = 15.0


def body(p: Publication) -> bytes:
    return json.dumps(
        {
            "edition_id": p.edition_id,
            "monitor_id": p.monitor_id,
            "period": p.period,
            "digest": p.digest,
            "items": p.items,
            "coverage": p.coverage,
        },
        sort_keys=True,
    ).encode()


class Webhook:
    name = "webhook"
    version = 1
    idempotent = True
    local = False

    def check(self, config: dict[str, Any]) -> dict[str, Any]:
        url = config.get("url")
        if not isinstance(url, str):
            raise InvalidInput("a webhook destination needs a url")
        outbound.check_url(url)
        return {"kind": "webhook", "url": url.strip()}

    def key(self, config: dict[str, Any]) -> str:
        return f"webhook:{config['url']}"[:300]

    def send(self, config: dict[str, Any], p: Publication) -> Outcome:
        content = body(p)
        signature = "sha256=" + hmac.new(p.secret.encode(), content, hashlib.sha256).hexdigest()
        headers = {"Content-Type": "application/json", "Idempotency-Key": p.edition_id, SIGNATURE_HEADER: signature}
        try:
            response = outbound.request("POST", config["url"], content=content, headers=headers, timeout=TIMEOUT)
        except UnsafeUrl as exc:
            return Failed(f"refused: {exc}")
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return Failed(f"not sent: {type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:
            return Unknown(f"the request went out and no answer came back: {type(exc).__name__}: {exc}")
        if response.status_code >= 300:
            return Failed(f"HTTP {response.status_code}")
        try:
            receipt = response.json().get("id")
        except (ValueError, AttributeError):
            receipt = None
        if not isinstance(receipt, (str, int)) or isinstance(receipt, bool) or str(receipt) == "":
            return Unknown(f"HTTP {response.status_code} without a receipt id")
        return Confirmed(str(receipt)[:300])
