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


def create_database(name: str) -> str:
    """(Re)create the empty database `name` next to DATABASE_URL; its URL."""
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
    return urlunparse(parsed._replace(path=f"/{name}"))


def scratch_database(name: str) -> str:
    """(Re)create database `name` next to DATABASE_URL and migrate it."""
    url = create_database(name)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("SECRET_KEY", "bench-only")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "terret_site.settings")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True, env=os.environ)
    # Bytecode for the project's own modules, as a deployed worker has it:
    # with PYTHONDONTWRITEBYTECODE set (as on these machines) every worker
    # process would otherwise compile them from source at each start, which
    # the recovery figure would count. pip compiled the dependencies already.
    import compileall

    for package in ("terret_site", "sessions_app", "approvals_app", "policies_app"):
        compileall.compile_dir(ROOT / package, quiet=1)
    import django

    django.setup()
    return url
