from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "terret_site.settings")
# Celery's Django fixup runs the system checks at every worker start, which
# imports every URLconf and view (about 0.3 s of a worker's boot, and a fresh
# worker's boot is recovery time). They run in CI (`manage.py check` in
# .ci/run) and wherever `manage.py migrate` or `check` runs on deploy.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("terret")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
