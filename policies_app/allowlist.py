"""The allow-list: a pre_execute veto on every tool call.

Registered in PoliciesAppConfig.ready(). It runs before the approval gate, so
a call the policy refuses never reaches a reviewer. A veto becomes a
tool/result error the model sees, and the turn goes on.
"""

from __future__ import annotations

from policies_app.selectors import current_policy
from sessions_app.runtime.hooks import CallContext


def veto(ctx: CallContext) -> str | None:
    """None when the session's policy allows the tool; otherwise why not."""
    name = ctx.definition.name
    if ctx.policy_known:
        policy = current_policy(ctx.session_id, ctx.profile, known_seq=ctx.policy_seq)
    else:
        policy = current_policy(ctx.session_id, ctx.profile)
    if policy.allows(name):
        return None
    if policy.source == "closed":
        return f"{name} is not allowed: the session's policy could not be read, so every tool is denied"
    where = "the session's allow-list" if policy.source == "session" else "the agent profile's allow-list floor"
    return f"{name} is not allowed by {where}"
