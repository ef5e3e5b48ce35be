"""What a drive (and a turn runner) reports it did."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    BUSY = "busy"  # another worker holds the lease
    IDLE = "idle"  # nothing was owed
    ENDED = "ended"  # the turn closed (turn/end committed)
    PARKED = "parked"  # the turn waits for a verdict; no worker holds it
    LOST = "lost"  # the lease was taken over; nothing more was written
    RESUME_FAILED = "resume_failed"  # a resumed turn failed transiently; retried after a backoff
    BLOCKED = "blocked"  # the turn stopped retrying; a stimulus or an operator picks it up
    HANDED_OFF = "handed_off"  # the process is draining; another worker was woken for the session
    WAITING = "waiting"  # no agent slot is free; the session waits for one (agent/waiting)
    SUSPENDED = "suspended"  # an operator suspended admission; the turn parked at a step boundary
    LEFT = "left"  # its log holds an event version newer than this code reads; a live worker that reads it is woken
