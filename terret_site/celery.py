from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "terret_site.settings")

app = Celery("terret")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
