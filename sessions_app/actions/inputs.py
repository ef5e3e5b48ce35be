"""Input: a message into a session (admitted in its lane), its receipt, and
withdrawing one that no turn has consumed yet. Each verb returns the input's
`Receipt` (services.inputs); `Receipt.as_json` is its one JSON shape."""

from __future__ import annotations

from typing import Any

from sessions_app import services
from sessions_app.actions.access import by, session_for
from sessions_app.services import inputs
from sessions_app.services.inputs import Receipt


def inject(
    user: Any,
    session_id: Any,
    text: str,
    wake: bool = True,
    idempotency_key: str | None = None,
    *,
    lane: Any = None,
    multitask_strategy: Any = None,
) -> Receipt:
    session = session_for(user, session_id, "drive")
    return services.inject(
        session.id,
        text,
        wake=wake,
        by=by(user),
        idempotency_key=idempotency_key,
        lane=lane,
        multitask_strategy=multitask_strategy,
    )


def input_receipt(user: Any, session_id: Any, seq: int) -> Receipt:
    session = session_for(user, session_id, "view")
    return inputs.receipt(session.id, seq)


def withdraw(user: Any, session_id: Any, seq: int) -> Receipt:
    session = session_for(user, session_id, "drive")
    return inputs.withdraw(session.id, seq, by=by(user))
