"""Terret settings. Everything deployment-specific comes from the environment.

See `.env.example` for every variable. Bad values stop the process at import
(ImproperlyConfigured) instead of being guessed around.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import ssl
import sys
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from dotenv import load_dotenv

from terret_site.dbpool import cap_reconnect_backoff
from terret_site.env import env_bool, env_float, env_int, env_limit, env_list, env_pauses, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent
# A local `.env` (written by `make run`, never committed) fills in what the
# process environment does not set; the real environment always wins.
load_dotenv(BASE_DIR / ".env", override=False)

DEBUG = env_bool("DEBUG", False)
TESTING = "pytest" in sys.modules or env_bool("TERRET_TESTING", False)

_secret = env_str("SECRET_KEY")
if not _secret:
    if not (DEBUG or TESTING):
        raise ImproperlyConfigured("SECRET_KEY is required when DEBUG is off (see .env.example)")
    # Ephemeral: logins do not survive a restart, which is the honest outcome
    # of running without a configured key.
    _secret = "dev-only-" + secrets.token_urlsafe(40)
SECRET_KEY: str = _secret

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# No "daphne" app: it only swaps `runserver` for its own, and the web process
# runs the daphne command itself (Makefile, Procfile). Installing it would
# import daphne and Twisted into every process, Celery workers included
# (a third of a second on each worker's start, which is recovery time).
#
# No "ninja" app either (its templates and static files are found through
# NINJA_DIR below, sessions_app/api/docs.py), and the admin is discovered when
# the URLs load (terret_site/urls.py), not at `django.setup()`: both would
# import what only the web process uses into every worker (about 0.2 s).
INSTALLED_APPS = [
    "django.contrib.admin.apps.SimpleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "sessions_app",
    "approvals_app",
    "policies_app",
]

# django-ninja's package directory, found without importing it (see INSTALLED_APPS).
NINJA_DIR = Path(importlib.util.find_spec("ninja").origin or "").parent  # type: ignore[union-attr]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Outside CSRF and everything else: any error answer under /api/ becomes JSON.
    "sessions_app.api.middleware.JsonApiErrorsMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A view's PermissionDenied gets the styled 403 page, without a logged traceback.
    "sessions_app.web.errors.QuietForbiddenMiddleware",
    # Innermost, so it sees the view's exceptions (lazy session and user loads included).
    "terret_site.middleware.DatabaseOutageMiddleware",
]

ROOT_URLCONF = "terret_site.urls"
WSGI_APPLICATION = "terret_site.wsgi.application"
ASGI_APPLICATION = "terret_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", NINJA_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            "libraries": {"schedules": "sessions_app.web.tags"},
        },
    },
]

# --- database -------------------------------------------------------------
VAR_DIR = Path(env_str("TERRET_VAR_DIR", str(BASE_DIR / "var")) or BASE_DIR / "var")
_default_db = f"sqlite:///{VAR_DIR / 'terret.sqlite3'}"
# Empty means the default, as for every other variable here.
_db_url = env_url("DATABASE_URL", _default_db, schemes={"sqlite", "postgres", "postgresql", "pgsql"}) or _default_db
_db = dj_database_url.parse(_db_url)
# Embedded SQLite's durability (docs/storage.md): FULL by default.
TERRET_SQLITE_SYNCHRONOUS = (env_str("TERRET_SQLITE_SYNCHRONOUS", "FULL") or "FULL").upper()
if TERRET_SQLITE_SYNCHRONOUS not in ("FULL", "NORMAL", "EXTRA"):
    raise ImproperlyConfigured(
        f"TERRET_SQLITE_SYNCHRONOUS={TERRET_SQLITE_SYNCHRONOUS!r} must be FULL, EXTRA or NORMAL (docs/storage.md)"
    )
if _db["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # IMMEDIATE makes every atomic block take SQLite's write lock at BEGIN, so
    # the append critical section is serialized there just as the session row
    # lock serializes it on Postgres; WAL lets readers proceed meanwhile.
    # synchronous=FULL: a commit is on the disk before it is acknowledged (a
    # 202, a verdict), so it survives power loss as well as a process crash.
    # NORMAL (TERRET_SQLITE_SYNCHRONOUS=NORMAL) is faster and may lose the
    # last commits on power loss; docs/storage.md states both.
    _db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={TERRET_SQLITE_SYNCHRONOUS};",
    }
    # A file, not Django's shared-cache in-memory default: threads and worker
    # processes in tests then see SQLite's real locking, as production does.
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
else:
    # The test process itself runs without a pool so pytest can drop its test
    # database; worker processes started by tests get a pool like production.
    _pool_max = env_int("TERRET_DB_POOL_MAX", 0 if TESTING else 20, minimum=0)
    if _pool_max:
        # One pool per process shared by all threads: a threads-pool Celery
        # worker runs hundreds of turns but holds a connection only while it
        # touches the log, never across a model call.
        _pool_min = min(env_int("TERRET_DB_POOL_MIN", 4, minimum=0), _pool_max)
        _db["OPTIONS"] = {"pool": {"min_size": _pool_min, "max_size": _pool_max, "timeout": 30}}
        _db["CONN_MAX_AGE"] = 0
        # Reconnect about once a second after an outage, not with a doubling backoff.
        cap_reconnect_backoff()
    # Django turns psycopg's prepared statements off (for transaction-mode
    # poolers such as PgBouncer). The runtime's few fixed statements (appends,
    # claim, release, turn load: sessions_app/log/backends/postgres.py) are prepared on
    # their first use on a connection, as planning the append's CTE costs more
    # than running it; other queries after 5 uses. 0 turns preparing off
    # entirely, as a transaction-mode pooler needs.
    _prepare = env_int("TERRET_DB_PREPARE_THRESHOLD", 5, minimum=0)
    _db.setdefault("OPTIONS", {})["prepare_threshold"] = _prepare or None
    _test_name = env_str("TERRET_TEST_DB_NAME")
    if _test_name:
        _db["TEST"] = {"NAME": _test_name}
DATABASES = {"default": _db}
IS_POSTGRES = _db["ENGINE"].endswith("postgresql")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis, channels, celery ----------------------------------------------
REDIS_URL = env_url("REDIS_URL", None, schemes={"redis", "rediss"})
_worker_default = "celery" if REDIS_URL else "inprocess"
TERRET_WORKER = env_str("TERRET_WORKER", _worker_default) or _worker_default
# manual: nothing is dispatched automatically; something else calls
# runtime.drive.drive (unit tests of the runtime, maintenance scripts).
if TERRET_WORKER not in {"celery", "inprocess", "manual"}:
    raise ImproperlyConfigured(f"TERRET_WORKER={TERRET_WORKER!r} must be 'celery', 'inprocess' or 'manual'")
if TERRET_WORKER == "celery" and not REDIS_URL:
    raise ImproperlyConfigured("TERRET_WORKER=celery needs REDIS_URL")

# pytest-xdist runs the suite in several processes against one Redis (each
# with its own test database): each takes its own channel prefix and queue,
# so one process's workers never take another's wake-ups. Only the pytest
# process itself adds it: the servers and workers it starts inherit the
# variable but are handed the suffixed names (tests/workers.py).
_XDIST_NAME = os.environ.get("PYTEST_XDIST_WORKER") if "pytest" in sys.modules else None
_XDIST = f"-{_XDIST_NAME}" if _XDIST_NAME else ""
CHANNEL_PREFIX = (env_str("TERRET_CHANNEL_PREFIX", "terret") or "terret") + _XDIST
if REDIS_URL:
    # Redis pub/sub: a group send is one PUBLISH, and each process subscribes
    # once per group and fans out in memory. Delivery is at-most-once, which
    # is all a hint or a token delta needs: readers catch up from the log.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": CHANNEL_PREFIX},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_BROKER_URL = REDIS_URL or "memory://"
if REDIS_URL:
    # kombu's Redis transport, reusing one client per channel (see the module).
    CELERY_BROKER_TRANSPORT = "terret_site.broker:Transport"
    if urlparse(REDIS_URL).scheme == "rediss" and "ssl_cert_reqs" not in urlparse(REDIS_URL).query:
        # kombu turns TLS on for rediss:// only when it picks the transport
        # from the scheme itself (and then without verifying the server);
        # with the transport named, TLS is asked for here, verified.
        CELERY_BROKER_USE_SSL = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
# No task stores a result. Without this Celery builds a backend object per
# pool thread, on that thread's first task; the disabled one holds no state.
CELERY_RESULT_BACKEND_THREAD_SAFE = True
# The database is the durable truth; a broker message is only a wake-up. Late
# acks plus reject-on-worker-lost put a message back if a worker dies with it.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Redis redelivers an unacked message after visibility_timeout even when the
# first worker is still running it. Turns are fenced by the session lease, so a
# redelivery is harmless, but a short timeout would cause needless duplicate
# wake-ups of long turns. Recovery of dead workers does not wait for this: the
# lease sweep (TERRET_LEASE_SECONDS) resumes expired turns much sooner.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("TERRET_VISIBILITY_TIMEOUT", 3600, minimum=60)}
CELERY_TASK_DEFAULT_QUEUE = (env_str("TERRET_QUEUE", "terret") or "terret") + _XDIST
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Reconnect to a returning broker within a second, not kombu's 2..30 s waits.
CELERY_WORKER_CONSUMER = "terret_site.broker:Consumer"
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}

# --- runtime knobs ----------------------------------------------------------
TERRET_MAX_AGENTS = env_int("TERRET_MAX_AGENTS", 128, minimum=1)
TERRET_LEASE_SECONDS = env_float("TERRET_LEASE_SECONDS", 30.0, minimum=0.5)
TERRET_SWEEP_SECONDS = env_float("TERRET_SWEEP_SECONDS", 15.0, minimum=0.2)
# A running turn with no progress (no event, no streamed text) for this long
# is stalled: the sweep appends turn/stalled once (runtime/progress.py).
TERRET_STALL_SECONDS = env_float("TERRET_STALL_SECONDS", 300.0, minimum=0.5)
# Scheduled wake-ups (runtime/schedules.py): how often each worker's clock
# looks for due schedules, and how late a due time may be before its
# schedule's misfire policy applies (the workers were down).
TERRET_SCHEDULE_POLL_SECONDS = env_float("TERRET_SCHEDULE_POLL_SECONDS", 0.5, minimum=0.05)
TERRET_SCHEDULE_GRACE_SECONDS = env_float("TERRET_SCHEDULE_GRACE_SECONDS", 60.0, minimum=0.0)
# Monitors (sessions_app/monitors/): how long a worker holds a monitor for one period (renewed at each
# commit; a dead worker's monitor is anyone's after it), and how long an edition of unknown outcome
# waits before it is re-sent under the same Idempotency-Key.
TERRET_MONITOR_LEASE_SECONDS = env_float("TERRET_MONITOR_LEASE_SECONDS", 120.0, minimum=1.0)
TERRET_MONITOR_RESEND_SECONDS = env_float("TERRET_MONITOR_RESEND_SECONDS", 30.0, minimum=0.0)
# How far from now a schedule's time may lie, either way (10 years): further
# is refused with 400 time_out_of_range (services/schedules.check_time).
TERRET_SCHEDULE_HORIZON_DAYS = env_int("TERRET_SCHEDULE_HORIZON_DAYS", 3653, minimum=1)
# The clock's fair share: one round claims at most this many due schedules
# of one session, of one owner, and in all (runtime/schedules.py).
TERRET_SCHEDULE_PER_SESSION = env_int("TERRET_SCHEDULE_PER_SESSION", 5, minimum=1)
TERRET_SCHEDULE_PER_OWNER = env_int("TERRET_SCHEDULE_PER_OWNER", 100, minimum=1)
TERRET_SCHEDULE_ROUND = env_int("TERRET_SCHEDULE_ROUND", 200, minimum=1)
# Bounded by default: a new profile's bounds for its recurring schedules, which
# stop after this many runs or this many days after they were made (empty: no
# such default; a profile's own fields override them, a request may set its own).
TERRET_SCHEDULE_MAX_RUNS = env_limit("TERRET_SCHEDULE_MAX_RUNS", default=1000)
TERRET_SCHEDULE_EXPIRES_DAYS = env_limit("TERRET_SCHEDULE_EXPIRES_DAYS", default=90)
# Owned work (runtime/owned/): a command task's wall-clock ceiling (a call's
# timeout_s is capped to it; 600 s when it names none), the bytes of its
# output tail kept (the rest is dropped from the front), how often a running
# task's progress is logged (task/progress), and how often its supervisor
# renews its lease and looks for an abort (a cancel kills the group within it).
TERRET_TASK_MAX_SECONDS = env_float("TERRET_TASK_MAX_SECONDS", 3600.0, minimum=1.0)
TERRET_TASK_DEFAULT_SECONDS = env_float("TERRET_TASK_DEFAULT_SECONDS", 600.0, minimum=1.0)
TERRET_TASK_OUTPUT_BYTES = env_int("TERRET_TASK_OUTPUT_BYTES", 16384, minimum=256)
TERRET_TASK_PROGRESS_SECONDS = env_float("TERRET_TASK_PROGRESS_SECONDS", 10.0, minimum=0.5)
TERRET_TASK_POLL_SECONDS = env_float("TERRET_TASK_POLL_SECONDS", 0.5, minimum=0.05)
TERRET_WORKSPACE_ROOT = Path(env_str("TERRET_WORKSPACE_ROOT", str(VAR_DIR / "workspaces")) or VAR_DIR)
TERRET_LLM_BASE_URL = env_url("TERRET_LLM_BASE_URL", "https://openrouter.ai/api/v1", schemes={"http", "https"})
TERRET_LLM_API_KEY = env_str("TERRET_LLM_API_KEY") or env_str("OPENROUTER_API_KEY") or ""
TERRET_MODEL_MAIN = env_str("TERRET_MODEL_MAIN", "") or ""
TERRET_MODEL_TITLER = env_str("TERRET_MODEL_TITLER", "") or ""
TERRET_MODEL_COMPACTOR = env_str("TERRET_MODEL_COMPACTOR", "") or ""
# Per read: how long a model stream may stay silent (keep-alive comments count as data).
TERRET_LLM_TIMEOUT = env_float("TERRET_LLM_TIMEOUT", 60.0, minimum=1.0)
# Per call, wall clock, retries included: keep-alive comments do not reset it.
TERRET_LLM_DEADLINE_SECONDS = env_float("TERRET_LLM_DEADLINE_SECONDS", 300.0, minimum=1.0)
TERRET_LLM_RETRIES = env_int("TERRET_LLM_RETRIES", 3, minimum=0)

# --- turns that always end (docs/runtime.md) --------------------------------
# A resumed turn that fails transiently is retried this many times, the n-th
# after TERRET_RESUME_BACKOFF_SECONDS * 2**(n-1) (5 and 40 s: 40+80+160+320 s, about 10 minutes
# in all); then the session is blocked until a stimulus or an operator's retry.
TERRET_RESUME_ATTEMPTS = env_int("TERRET_RESUME_ATTEMPTS", 5, minimum=1)
TERRET_RESUME_BACKOFF_SECONDS = env_float("TERRET_RESUME_BACKOFF_SECONDS", 40.0, minimum=0.0)
# A transient database error inside a drive is retried within the drive for this long.
TERRET_DB_RETRY_SECONDS = env_float("TERRET_DB_RETRY_SECONDS", 60.0, minimum=0.0)
# How often a worker looks for cancels of the model calls it is streaming.
TERRET_CANCEL_POLL_SECONDS = env_float("TERRET_CANCEL_POLL_SECONDS", 0.5, minimum=0.05)
# How often a worker process looks for dead peers (their liveness locks free).
TERRET_LIVENESS_POLL_SECONDS = env_float("TERRET_LIVENESS_POLL_SECONDS", 0.5, minimum=0.05)
# An agent with no turn for this long is disposed of; the next stimulus respawns it.
TERRET_AGENT_IDLE_SECONDS = env_float("TERRET_AGENT_IDLE_SECONDS", 900.0, minimum=1.0)
# Global budgets per UTC day over every session (runtime/limits.py; unset: none).
TERRET_DAILY_COST_USD = env_limit("TERRET_DAILY_COST_USD", decimal=True)
TERRET_DAILY_TOKENS = env_limit("TERRET_DAILY_TOKENS")
TERRET_DAILY_STEPS = env_limit("TERRET_DAILY_STEPS")
TERRET_DAILY_TURNS = env_limit("TERRET_DAILY_TURNS")
# The per-profile per-day tallies (UsageDay, ModelTally, TurnTally) are kept in
# this many rows each, a session writing always the same one (its id modulo
# this), summed at every read: one shared row would serialize every agent of
# a profile on its lock until commit. 1: one row (bench/hot_profile.py's baseline).
TERRET_TALLY_SHARDS = env_int("TERRET_TALLY_SHARDS", 16, minimum=1)
# A new agent profile's daily budgets (its daily_cost_usd and daily_tokens;
# empty: none), generous so that only a runaway agent meets them.
TERRET_PROFILE_DAILY_COST_USD = env_limit("TERRET_PROFILE_DAILY_COST_USD", decimal=True, default=Decimal(50))
TERRET_PROFILE_DAILY_TOKENS = env_limit("TERRET_PROFILE_DAILY_TOKENS", default=20_000_000)
# The sweep's effect audit (runtime/effects.py audit_recent): each round audits the
# effect ledgers of at most this many sessions whose log changed since their last
# audit, within this many hours (0 sessions: the audit is off).
TERRET_EFFECTS_AUDIT_BATCH = env_int("TERRET_EFFECTS_AUDIT_BATCH", 20, minimum=0)
TERRET_EFFECTS_AUDIT_HOURS = env_float("TERRET_EFFECTS_AUDIT_HOURS", 24.0, minimum=0.01)
# Context windows (docs/compaction.md): a request's tokens are estimated as its characters
# over this, and this many tokens (at most an eighth of the window) are left for the reply.
TERRET_CHARS_PER_TOKEN = env_float("TERRET_CHARS_PER_TOKEN", 3.5, minimum=1.0)
TERRET_CONTEXT_RESERVE_TOKENS = env_int("TERRET_CONTEXT_RESERVE_TOKENS", 4096, minimum=0)
# A provider's refusal naming no figures halves the believed window, never below this;
# refused at or under it, a turn is blocked (context_overflow) for an operator.
TERRET_CONTEXT_FLOOR_TOKENS = env_int("TERRET_CONTEXT_FLOOR_TOKENS", 4096, minimum=256)
# Bounded intake (docs/protocol.md, "Lanes"): what one admission (a turn's opening, a
# step's drain of steers) takes of the waiting lanes, in count and in bytes of text. A
# flood of writes is taken in over several admissions, in order, so no process holds
# more than this of it at once; one input is always taken, however long.
TERRET_INTAKE_MAX_ITEMS = env_int("TERRET_INTAKE_MAX_ITEMS", 64, minimum=1)
TERRET_INTAKE_MAX_BYTES = env_int("TERRET_INTAKE_MAX_BYTES", 1_048_576, minimum=1)
# Fault injection for crash tests, never for production: pause a worker at a point of a
# tool call so a test can kill it there (sessions_app/runtime/failpoints.py).
# The notification sender's points are per channel (`notify_sent:email=30`; sessions_app/notify/delivery.py);
# an owned task's per kind (`task_held:command=30`; sessions_app/runtime/owned/supervise.py).
TERRET_FAILPOINTS = env_pauses(
    "TERRET_FAILPOINTS",
    frozenset(
        {
            "after_intent",
            "after_effect",
            "notify_claimed",
            "notify_sent",
            "monitor_scan",
            "monitor_intent",
            "monitor_sent",
            "task_start",
            "task_claimed",
            "task_held",
            "task_child_idle",
        }
    ),
)
# Whether a session's owner may resolve its effects of unknown outcome (re-run a tool
# call, or record it done or failed); staff always may (docs/protocol.md).
TERRET_OWNER_MAY_RESOLVE = env_bool("TERRET_OWNER_MAY_RESOLVE", False)
# What the log keeps of model output and tool results (longer text is cut, with a
# marker), and the ceiling on one event's JSON, below what a socket frame may carry.
TERRET_MAX_MODEL_TEXT_CHARS = env_int("TERRET_MAX_MODEL_TEXT_CHARS", 100_000, minimum=1000)
TERRET_MAX_TOOL_ARGS_CHARS = env_int("TERRET_MAX_TOOL_ARGS_CHARS", 50_000, minimum=1000)
TERRET_MAX_TOOL_RESULT_CHARS = env_int("TERRET_MAX_TOOL_RESULT_CHARS", 64_000, minimum=1000)
TERRET_MAX_EVENT_BYTES = env_int("TERRET_MAX_EVENT_BYTES", 900 * 1024, minimum=64 * 1024)
# The largest frame a socket sends (daphne's peer refuses frames over 1 MiB).
TERRET_SOCKET_MAX_FRAME_BYTES = env_int("TERRET_SOCKET_MAX_FRAME_BYTES", 1024 * 1024 - 4096, minimum=64 * 1024)
# The most a socket's outbox holds for a slow client, in bytes (besides its 256 frames):
# at least one frame, so a frame always fits an empty outbox (live/outbox.py).
TERRET_SOCKET_OUTBOX_BYTES = env_int("TERRET_SOCKET_OUTBOX_BYTES", 4 * 1024 * 1024, minimum=64 * 1024)
if TERRET_SOCKET_OUTBOX_BYTES < TERRET_SOCKET_MAX_FRAME_BYTES:
    raise ImproperlyConfigured(
        f"TERRET_SOCKET_OUTBOX_BYTES={TERRET_SOCKET_OUTBOX_BYTES} must be at least "
        f"TERRET_SOCKET_MAX_FRAME_BYTES={TERRET_SOCKET_MAX_FRAME_BYTES}"
    )
# The bytes each process's frame cache keeps per watched session (besides 512 frames; live/hub.py).
TERRET_SOCKET_TAIL_BYTES = env_int("TERRET_SOCKET_TAIL_BYTES", 4 * 1024 * 1024, minimum=64 * 1024)
# The most payload one page of events carries (GET .../events, a socket's replay batch, an /lg/
# read), on top of each read's count: a client asking for more is paged (log/reads.py).
TERRET_READ_MAX_BYTES = env_int("TERRET_READ_MAX_BYTES", 4 * 1024 * 1024, minimum=1024 * 1024)
# A bearer token that may scrape /metrics besides a staff session (unset: staff only;
# terret_site/metrics.py, docs/metrics.md).
TERRET_METRICS_TOKEN = env_str("TERRET_METRICS_TOKEN", "") or ""
# Origins (scheme://host[:port], comma-separated; "*" for any) whose pages may call the
# LangGraph-compatible door /lg/ from a browser (CORS; sessions_app/lg/views.py, docs/langgraph.md).
TERRET_LG_CORS_ORIGINS = env_list("TERRET_LG_CORS_ORIGINS", [])
MORPH_API_KEY = env_str("MORPH_API_KEY", "") or ""
MORPH_BASE_URL = env_url("MORPH_BASE_URL", "https://api.morphllm.com/v1", schemes={"http", "https"})

# --- notifications (sessions_app/notify/, docs/notifications.md) -----------
# Email goes out through Django's mailers (MAILERS, Django 6.1), by SMTP with the settings
# below. Email notifications are on only when EMAIL_HOST is set; each person and each
# profile then chooses (the settings page, the admin).
TERRET_EMAIL_ON = bool(env_str("EMAIL_HOST", ""))
MAILERS = {
    "default": {
        "BACKEND": env_str("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend"),
        "OPTIONS": {
            "host": env_str("EMAIL_HOST", "") or "localhost",
            "port": env_int("EMAIL_PORT", 25, minimum=1),
            "username": env_str("EMAIL_HOST_USER", "") or "",
            "password": env_str("EMAIL_HOST_PASSWORD", "") or "",
            "use_tls": env_bool("EMAIL_USE_TLS", False),
            "timeout": env_int("EMAIL_TIMEOUT", 10, minimum=1),
        },
    }
}
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "terret@localhost") or "terret@localhost"
# The address people reach this site at, for the links in notifications (e.g. https://terret.example).
TERRET_PUBLIC_URL = (env_url("TERRET_PUBLIC_URL", "http://127.0.0.1:8000", schemes={"http", "https"}) or "").rstrip("/")
# Hosts (as a URL writes them) a webhook may reach although they are or resolve to a private,
# loopback or link-local address (sessions_app/outbound.py). Unset: none.
TERRET_ALLOW_PRIVATE_HOSTS = env_list("TERRET_ALLOW_PRIVATE_HOSTS", [])
# The sender: a claimed notification is another sender's after this many seconds (above
# the send timeouts); a failed send is retried after 5 s, 10 s, 20 s ... up to the cap, this
# many times in all; each worker looks for due notifications this often.
TERRET_NOTIFY_LEASE_SECONDS = env_float("TERRET_NOTIFY_LEASE_SECONDS", 60.0, minimum=0.1)
TERRET_NOTIFY_BACKOFF_SECONDS = env_float("TERRET_NOTIFY_BACKOFF_SECONDS", 5.0, minimum=0.0)
TERRET_NOTIFY_BACKOFF_CAP_SECONDS = env_float("TERRET_NOTIFY_BACKOFF_CAP_SECONDS", 3600.0, minimum=0.0)
TERRET_NOTIFY_MAX_ATTEMPTS = env_int("TERRET_NOTIFY_MAX_ATTEMPTS", 8, minimum=1)
TERRET_NOTIFY_POLL_SECONDS = env_float("TERRET_NOTIFY_POLL_SECONDS", 5.0, minimum=0.05)
TERRET_NOTIFY_TIMEOUT_SECONDS = env_float("TERRET_NOTIFY_TIMEOUT_SECONDS", 10.0, minimum=0.1)

# --- web ------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static", NINJA_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO") or "INFO"},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}
