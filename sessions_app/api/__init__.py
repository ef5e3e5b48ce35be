"""The program interface: the JSON API under /api/ and the rules the session
socket shares with it (ops.py). Protocol: docs/protocol.md."""
