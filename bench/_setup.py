"""Shared set-up for benchmarks: a scratch Postgres database, migrated, and
Django configured against it before anything imports models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def scratch_database(name: str) -> str:
    """(Re)create database `name` next to DATABASE_URL and migrate it."""
    base = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/test")
    parsed = urlparse(base)
    if not parsed.scheme.startswith("postgres"):
        sys.exit("benchmarks need DATABASE_URL=postgres://...")
    import psycopg

    admin = urlunparse(parsed._replace(path="/postgres" if parsed.path != "/postgres" else parsed.path))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunparse(parsed._replace(path=f"/{name}"))
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("SECRET_KEY", "bench-only")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "terret_site.settings")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True, env=os.environ)
    import django

    django.setup()
    return url
