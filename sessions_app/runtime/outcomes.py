"""What a drive (and a turn runner) reports it did."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    BUSY = "busy"  # another worker holds the lease
    IDLE = "idle"  # nothing was owed
    ENDED = "ended"  # the turn closed (turn/end committed)
    PARKED = "parked"  # the turn waits for a verdict; no worker holds it
    LOST = "lost"  # the lease was taken over; nothing more was written
    RESUME_FAILED = "resume_failed"  # a resume's model call failed; the turn stays open, retried later
    NO_AGENT = "no_agent"  # the session has no live agent to drive it
