"""Notifications (docs/notifications.md): what needs a human (rules), the
after-commit listener that makes outbox rows (listeners, outbox), their
sending by email and signed webhooks (delivery), and a person's settings
(services). The models are in sessions_app/models.py, the Celery task and
the worker's sender thread in sessions_app/tasks.py, the admin in
sessions_app/admin.py.
"""
