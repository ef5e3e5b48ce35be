"""Find turns that nobody is driving.

An open turn that is not parked on an approval and whose lease has expired
(its worker died, or its broker message was lost) needs a driver. The sweep
runs when a worker starts and periodically after that.

A turn that was admitted but never claimed has no lease at all. Its wake-up
is normally still on its way through the broker, so the periodic sweep
treats the admission as an implicit lease: such a turn is swept once its last
event is TERRET_LEASE_SECONDS old. Sweeping it at once would send a second
wake-up for every turn of a burst that the workers have not reached yet. The
first sweep of a starting process takes them all (`at_start`): an in-process
queue died with the process before it, and for a broker the cost is at most
a duplicate wake-up, which the lease makes harmless.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from sessions_app.models import Session

SWEEP_BATCH = 500


def sweep(*, at_start: bool = False) -> list[str]:
    now = timezone.now()
    unclaimed_since = now if at_start else now - timedelta(seconds=settings.TERRET_LEASE_SECONDS)
    ids = (
        Session.objects.filter(open_turn_seq__isnull=False, pending_approvals=0)
        .filter(
            Q(lease_expires_at__lt=now)
            | Q(lease_expires_at__isnull=True, last_event_at__lte=unclaimed_since)
            | Q(lease_expires_at__isnull=True, last_event_at__isnull=True)
        )
        .values_list("id", flat=True)[:SWEEP_BATCH]
    )
    return [str(i) for i in ids]
