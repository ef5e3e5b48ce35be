"""Settings come from the environment and fail loudly on bad values.

Each case configures Django in a fresh interpreter with a crafted
environment, because settings are read once per process. The child stubs out
load_dotenv so a developer's own `.env` cannot change the outcome.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)

CHILD = r"""
import json
import dotenv
dotenv.load_dotenv = lambda *a, **k: False  # isolate from the developer's .env
import django
django.setup()
from django.conf import settings as s
db = s.DATABASES["default"]
print(json.dumps({
    "engine": db["ENGINE"], "name": str(db["NAME"]), "options": db.get("OPTIONS", {}),
    "debug": s.DEBUG, "secret": s.SECRET_KEY, "hosts": s.ALLOWED_HOSTS,
    "layer": s.CHANNEL_LAYERS["default"]["BACKEND"],
    "layer_prefix": s.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("prefix"),
    "worker": s.TERRET_WORKER, "broker": s.CELERY_BROKER_URL, "queue": s.CELERY_TASK_DEFAULT_QUEUE,
    "redis": s.REDIS_URL, "is_postgres": s.IS_POSTGRES,
    "broker_transport": getattr(s, "CELERY_BROKER_TRANSPORT", None),
    "broker_ssl": {k: int(v) for k, v in getattr(s, "CELERY_BROKER_USE_SSL", {}).items()},
}))
"""


def configure(tmp_path: Path, code: str = CHILD, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "terret_site.settings",
        "TERRET_VAR_DIR": str(tmp_path / "var"),
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def ok(tmp_path: Path, code: str = CHILD, **env: str) -> dict[str, Any]:
    result = configure(tmp_path, code, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def refused(tmp_path: Path, message: str, **env: str) -> None:
    result = configure(tmp_path, **env)
    assert result.returncode != 0, result.stdout
    assert "ImproperlyConfigured" in result.stderr
    assert re.search(message, result.stderr), result.stderr


# --- defaults ---------------------------------------------------------------


def test_defaults_are_the_embedded_setup(tmp_path: Path) -> None:
    got = ok(tmp_path, SECRET_KEY="k" * 50)
    assert got["engine"] == "django.db.backends.sqlite3"
    assert got["name"] == str(tmp_path / "var" / "terret.sqlite3")
    assert (tmp_path / "var").is_dir()  # created so the first migrate works
    assert got["options"]["transaction_mode"] == "IMMEDIATE"
    assert got["layer"] == "channels.layers.InMemoryChannelLayer"
    assert got["worker"] == "inprocess"
    assert got["redis"] is None and got["broker"] == "memory://"
    assert got["debug"] is False
    assert got["hosts"] == ["127.0.0.1", "localhost", "[::1]"]


def test_redis_url_switches_to_channels_redis_and_celery(tmp_path: Path) -> None:
    got = ok(
        tmp_path,
        SECRET_KEY="k" * 50,
        REDIS_URL="redis://127.0.0.1:6379/5",
        TERRET_CHANNEL_PREFIX="p1",
        TERRET_QUEUE="q1",
    )
    assert got["layer"] == "channels_redis.pubsub.RedisPubSubChannelLayer"
    assert got["layer_prefix"] == "p1"
    assert got["worker"] == "celery"
    assert got["broker"] == "redis://127.0.0.1:6379/5"
    assert got["queue"] == "q1"


def test_each_xdist_test_process_takes_its_own_queue_and_prefix(tmp_path: Path) -> None:
    """pytest-xdist's processes share one Redis: each suffixes the queue and
    the channel prefix with its name. A worker or server such a process
    starts inherits the variable but keeps the names it is handed."""
    env = {
        "SECRET_KEY": "k" * 50,
        "REDIS_URL": "redis://127.0.0.1:6379/5",
        "TERRET_CHANNEL_PREFIX": "p1",
        "TERRET_QUEUE": "q1",
        "PYTEST_XDIST_WORKER": "gw1",
    }
    in_pytest = ok(tmp_path, "import pytest\n" + CHILD, **env)
    assert (in_pytest["queue"], in_pytest["layer_prefix"]) == ("q1-gw1", "p1-gw1")
    started_by_it = ok(tmp_path, **env)
    assert (started_by_it["queue"], started_by_it["layer_prefix"]) == ("q1", "p1")
    alone = ok(tmp_path, "import pytest\n" + CHILD, **{k: v for k, v in env.items() if k != "PYTEST_XDIST_WORKER"})
    assert (alone["queue"], alone["layer_prefix"]) == ("q1", "p1")


def test_the_broker_transport_keeps_tls_for_rediss(tmp_path: Path) -> None:
    """Naming the transport (terret_site/broker.py) stops kombu inferring TLS
    from a rediss:// scheme, so settings ask for it, with the server verified;
    a URL that says how to verify keeps its own choice (Celery reads it)."""
    import ssl

    plain = ok(tmp_path, SECRET_KEY="k" * 50, REDIS_URL="redis://127.0.0.1:6379/5")
    assert plain["broker_transport"] == "terret_site.broker:Transport"
    assert plain["broker_ssl"] == {}
    tls = ok(tmp_path, SECRET_KEY="k" * 50, REDIS_URL="rediss://cache.example:6380/0")
    assert tls["broker_transport"] == "terret_site.broker:Transport"
    assert tls["broker_ssl"] == {"ssl_cert_reqs": int(ssl.CERT_REQUIRED)}
    told = ok(tmp_path, SECRET_KEY="k" * 50, REDIS_URL="rediss://cache.example:6380/0?ssl_cert_reqs=optional")
    assert told["broker_ssl"] == {}
    assert ok(tmp_path, SECRET_KEY="k" * 50)["broker_transport"] is None  # no Redis: Celery's memory transport


def test_redis_with_in_process_worker_is_allowed(tmp_path: Path) -> None:
    got = ok(tmp_path, SECRET_KEY="k" * 50, REDIS_URL="redis://127.0.0.1:6379/5", TERRET_WORKER="inprocess")
    assert got["worker"] == "inprocess"
    assert got["layer"] == "channels_redis.pubsub.RedisPubSubChannelLayer"


def test_an_empty_database_url_means_the_sqlite_default(tmp_path: Path) -> None:
    got = ok(tmp_path, SECRET_KEY="k" * 50, DATABASE_URL="")
    assert got["engine"] == "django.db.backends.sqlite3" and got["is_postgres"] is False


def test_postgres_url_uses_a_connection_pool(tmp_path: Path) -> None:
    got = ok(tmp_path, SECRET_KEY="k" * 50, DATABASE_URL="postgres://u:p@db.example:5433/terret")
    assert got["engine"] == "django.db.backends.postgresql" and got["is_postgres"] is True
    assert got["name"] == "terret"
    assert got["options"]["pool"]["max_size"] == 20
    no_pool = ok(tmp_path, SECRET_KEY="k" * 50, DATABASE_URL="postgresql://u@h/x", TERRET_DB_POOL_MAX="0")
    assert "pool" not in no_pool["options"]
    # The append statements are prepared after 5 uses unless a pooler forbids it.
    assert got["options"]["prepare_threshold"] == 5
    unprepared = ok(tmp_path, SECRET_KEY="k" * 50, DATABASE_URL="postgres://u@h/x", TERRET_DB_PREPARE_THRESHOLD="0")
    assert unprepared["options"]["prepare_threshold"] is None


def test_debug_allows_a_missing_secret_key_with_an_ephemeral_one(tmp_path: Path) -> None:
    a = ok(tmp_path, DEBUG="1")
    b = ok(tmp_path, DEBUG="true")
    assert a["debug"] is True and a["secret"].startswith("dev-only-")
    assert a["secret"] != b["secret"]  # never a fixed, guessable key


def test_allowed_hosts_list(tmp_path: Path) -> None:
    got = ok(tmp_path, SECRET_KEY="k" * 50, ALLOWED_HOSTS="terret.example, api.terret.example")
    assert got["hosts"] == ["terret.example", "api.terret.example"]


# --- loud failures -----------------------------------------------------------


@pytest.mark.parametrize("value", ["maybe", "2", "enabled"])
def test_bad_debug(tmp_path: Path, value: str) -> None:
    refused(tmp_path, rf"DEBUG='{value}' is not a boolean", SECRET_KEY="k" * 50, DEBUG=value)


def test_missing_secret_key_with_debug_off(tmp_path: Path) -> None:
    refused(tmp_path, "SECRET_KEY is required when DEBUG is off")
    # Set-but-empty counts as missing (a blank line in a deployment's env file).
    refused(tmp_path, "SECRET_KEY is required", SECRET_KEY="", DEBUG="0")


@pytest.mark.parametrize("url", ["mysql://u@h/db", "http://127.0.0.1:5432/x", "127.0.0.1:5432/x"])
def test_bad_database_url_scheme(tmp_path: Path, url: str) -> None:
    refused(tmp_path, r"DATABASE_URL=.*scheme must be one of", SECRET_KEY="k" * 50, DATABASE_URL=url)


def test_bad_redis_url_scheme(tmp_path: Path) -> None:
    refused(tmp_path, r"REDIS_URL=.*scheme must be one of", SECRET_KEY="k" * 50, REDIS_URL="http://127.0.0.1:6379")


def test_celery_worker_needs_redis(tmp_path: Path) -> None:
    refused(tmp_path, "TERRET_WORKER=celery needs REDIS_URL", SECRET_KEY="k" * 50, TERRET_WORKER="celery")
    refused(tmp_path, "TERRET_WORKER=celery needs REDIS_URL", SECRET_KEY="k" * 50, TERRET_WORKER="celery", REDIS_URL="")


def test_unknown_worker_mode(tmp_path: Path) -> None:
    refused(tmp_path, r"TERRET_WORKER='threads' must be", SECRET_KEY="k" * 50, TERRET_WORKER="threads")


def test_empty_item_in_allowed_hosts(tmp_path: Path) -> None:
    refused(tmp_path, "ALLOWED_HOSTS=.*empty item", SECRET_KEY="k" * 50, ALLOWED_HOSTS="a.example,,b.example")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TERRET_DB_POOL_MAX", "lots", "is not an integer"),
        ("TERRET_DB_POOL_MAX", "-1", "must be >= 0"),
        ("TERRET_LEASE_SECONDS", "0.1", "must be >= 0.5"),
        ("TERRET_LLM_TIMEOUT", "soon", "is not a number"),
        ("TERRET_LLM_BASE_URL", "ftp://models.example", "scheme must be one of"),
    ],
)
def test_bad_numbers_and_urls(tmp_path: Path, name: str, value: str, message: str) -> None:
    refused(tmp_path, rf"{name}.*{message}", SECRET_KEY="k" * 50, DATABASE_URL="postgres://u@h/x", **{name: value})


# --- .env.example documents every variable ----------------------------------------

_READERS = r"env_(?:str|bool|int|float|list|url)\(\s*\"([A-Z][A-Z0-9_]*)\""


def _variables_read_by_settings() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "terret_site").glob("*.py"):
        text = path.read_text()
        names.update(re.findall(_READERS, text))
        names.update(re.findall(r"os\.environ(?:\.get)?[\[(]\s*\"([A-Z][A-Z0-9_]*)\"", text))
    names.discard("DJANGO_SETTINGS_MODULE")  # set by manage.py/asgi.py, not by operators
    names.discard("PYTEST_XDIST_WORKER")  # set by pytest-xdist in its test processes, read only there
    return names


def test_env_example_documents_every_variable() -> None:
    example = (ROOT / ".env.example").read_text()
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", example, flags=re.M))
    read = _variables_read_by_settings()
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"} <= read
    missing = read - documented
    assert not missing, f".env.example does not document {sorted(missing)}"
    # Every variable carries a comment: walking up from its line over the
    # variables of the same group, the first other line is a comment.
    var = re.compile(r"^#?\s*[A-Z][A-Z0-9_]*=")
    lines = example.splitlines()
    for i, line in enumerate(lines):
        if not var.match(line):
            continue
        j = i - 1
        while j >= 0 and var.match(lines[j]):
            j -= 1
        assert j >= 0 and lines[j].startswith("# "), f"no comment above {line!r}"


def test_env_example_is_a_valid_configuration(tmp_path: Path) -> None:
    """Copying .env.example to .env must give a working (embedded) setup:
    the uncommented lines alone configure Django."""
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        m = re.match(r"^([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            values[m.group(1)] = m.group(2).strip().strip('"')
    got = ok(tmp_path, **values)
    assert got["engine"] == "django.db.backends.sqlite3"


def test_failpoints_are_parsed_and_refused_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from terret_site.env import env_pauses

    points = frozenset({"after_intent", "after_effect"})
    monkeypatch.delenv("TERRET_FAILPOINTS", raising=False)
    assert env_pauses("TERRET_FAILPOINTS", points) == {}
    monkeypatch.setenv("TERRET_FAILPOINTS", "after_intent:workspace.write=5,after_effect:mcp.fx.upsert=0.5")
    assert env_pauses("TERRET_FAILPOINTS", points) == {
        ("after_intent", "workspace.write"): 5.0,
        ("after_effect", "mcp.fx.upsert"): 0.5,
    }
    for bad, says in [
        ("before_intent:x=1", "must be <point>:<tool>=<seconds>"),
        ("after_intent=1", "must be <point>:<tool>=<seconds>"),
        ("after_intent:x=soon", "is not a number"),
        ("after_intent:x=601", "from 0 to 600"),
    ]:
        monkeypatch.setenv("TERRET_FAILPOINTS", bad)
        with pytest.raises(ImproperlyConfigured, match=says):
            env_pauses("TERRET_FAILPOINTS", points)
    assert settings.TERRET_FAILPOINTS == {}  # never set outside a crash test's worker
