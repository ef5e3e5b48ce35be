"""The worker process's lifecycle as the runtime sees it.

`draining` is set when the process is asked to stop (Celery's warm shutdown
on SIGTERM, the embedded worker's exit): from then on drives claim nothing
new, and a turn being driven hands its session over at its next commit
(drive.py), so a deploy delays no turn by more than a hand-over.
"""

from __future__ import annotations

import threading

draining = threading.Event()
