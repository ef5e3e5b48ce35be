"""What every socket and stream stands on, beneath the doors: the fan-out
hub (hub.py: one channel-layer subscription per session per process, the
frame cache), every frame measured and fitted (frames.py), socket
authentication and the live-credential check (auth.py), the follower of a
session's log that the session socket and the chat page's socket share
(follow.py), and the socket paths by name (paths.py)."""
