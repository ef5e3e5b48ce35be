"""Find turns that nobody is driving.

An open turn that is not parked on an approval and whose lease has expired
(its worker died, or its broker message was lost) needs a driver. The sweep
runs when a worker starts and periodically after that.
"""

from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from sessions_app.models import Session

SWEEP_BATCH = 500


def sweep() -> list[str]:
    now = timezone.now()
    ids = (
        Session.objects.filter(open_turn_seq__isnull=False, pending_approvals=0)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        .values_list("id", flat=True)[:SWEEP_BATCH]
    )
    return [str(i) for i in ids]
