# Terret. `make run` to try it, `make test` to test it; see README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
# Two stamps: the runtime (make run, make dist) and the development tools on
# top of it (make test, make lint, make venv, which CI uses).
RUN_STAMP := $(VENV)/.terret-runtime
STAMP := $(VENV)/.terret-installed
HOST ?= 127.0.0.1
PORT ?= 8000
WORKERS ?= 2
ARGS ?=

NEED_PY := Terret needs Python 3.12+; install python3.12 (e.g. apt-get install python3.12-venv, or pyenv install 3.12)

# The first Python >= 3.12 that can create a virtualenv with pip (Debian
# splits ensurepip into python3.X-venv). The machine's python3 may be older.
define FIND_PYTHON
for c in $$(command -v python3.13 python3.12 2>/dev/null) /root/.pyenv/versions/3.1[23]*/bin/python $$(command -v python3 2>/dev/null); do \
	[ -x "$$c" ] || continue; \
	"$$c" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo "$$c"; exit 0; }; \
done; exit 1
endef

.PHONY: help venv run test lint dist bench chaos

help:
	@echo "make run     set up everything and start Terret at http://$(HOST):$(PORT)/ (SQLite, in-process worker)"
	@echo "make test    set up everything and run the whole test suite (scripts/test.sh; ARGS='...' for pytest)"
	@echo "make dist    Postgres + Redis: daphne plus WORKERS=$(WORKERS) Celery worker processes"
	@echo "make chaos   the chaos drills on a private stack (tests/chaos, docs/chaos.md; TERRET_CHAOS_SEED=N replays)"
	@echo "make lint    ruff check, ruff format --check, mypy, lint-imports (the layers contract)"
	@echo "make bench   run every benchmark in bench/ (needs PostgreSQL; DATABASE_URL)"
	@echo "make venv    create .venv with the pinned dependencies, development tools included"

# --- setup -------------------------------------------------------------------

venv: $(STAMP)

# Redone only when a requirements file changes. An existing .venv on Python
# 3.12+ is kept; one on an older Python is rebuilt. `make run` stops here:
# the runtime dependencies only.
$(RUN_STAMP): requirements.txt constraints.txt
	@if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
		py=$$( $(FIND_PYTHON) ) || { echo "$(NEED_PY)" >&2; exit 1; }; \
		echo "Creating $(VENV) with $$py ($$("$$py" --version))"; \
		rm -rf $(VENV) && "$$py" -m venv $(VENV) || { echo "$(NEED_PY)" >&2; exit 1; }; \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -c constraints.txt
	@touch $(RUN_STAMP)

# Tests, lint and benchmarks add the development tools (Playwright, mypy, ...).
$(STAMP): $(RUN_STAMP) requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt
	@touch $(STAMP)

# A local .env (never committed) with a random SECRET_KEY, so logins survive
# restarts. Written once; edit it freely afterwards (see .env.example).
.env: | $(RUN_STAMP)
	@echo "Writing .env (random SECRET_KEY, DEBUG=1; see .env.example for the rest)"
	@umask 077 && { \
		echo "# Written by 'make run'. Settings: see .env.example."; \
		echo "SECRET_KEY=$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(50))')"; \
		echo "DEBUG=1"; \
	} > .env

# --- run -----------------------------------------------------------------------

# The embedded default: SQLite file in var/, in-memory channel layer, turns
# run by a thread pool inside the daphne process.
run: $(RUN_STAMP) .env
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_admin
	@echo "Terret: http://$(HOST):$(PORT)/   admin: http://$(HOST):$(PORT)/admin/   (Ctrl-C stops)"
	@echo "Sign in at http://$(HOST):$(PORT)/accounts/login/ as the admin user above (README: 'Try it')."
	@echo "Lost the admin password? $(PY) manage.py changepassword $${TERRET_ADMIN_USER:-admin}"
	exec $(VENV)/bin/daphne -b $(HOST) -p $(PORT) terret_site.asgi:application

# The distributed setup: PostgreSQL and Redis from DATABASE_URL and REDIS_URL
# (environment or .env), daphne for web and sockets, and WORKERS separate
# Celery worker processes running turns. Each worker sweeps for orphaned
# turns itself (sessions_app/tasks.py), so no beat process is needed; if
# CELERY_BEAT_SCHEDULE is ever filled in, one beat process is started too.
# Settings are read the way the processes will read them (environment, then
# .env), through plain python: `manage.py shell` prints extra lines.
SETTING = DJANGO_SETTINGS_MODULE=terret_site.settings $(PY) -c "from django.conf import settings as s; print($(1))"

dist: $(RUN_STAMP) .env
	@[ "$$($(call SETTING,bool(s.IS_POSTGRES and s.REDIS_URL and s.TERRET_WORKER == 'celery')))" = True ] || { \
		echo "make dist needs DATABASE_URL=postgres://... and REDIS_URL=redis://... (environment or .env)," \
			"and TERRET_WORKER unset or celery" >&2; exit 1; }
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_admin
	@queue=$$($(call SETTING,s.CELERY_TASK_DEFAULT_QUEUE)) && beat=$$($(call SETTING,len(s.CELERY_BEAT_SCHEDULE))) || exit 1; \
	pids=(); \
	trap 'trap - INT TERM EXIT; kill $${pids[@]} 2>/dev/null; wait' INT TERM EXIT; \
	$(VENV)/bin/daphne -b $(HOST) -p $(PORT) terret_site.asgi:application & pids+=($$!); \
	for i in $$(seq 1 $(WORKERS)); do \
		$(PY) -m terret_site.worker --pool threads --concurrency 200 -Q "$$queue" \
			-n "terret$$i@%h" --loglevel INFO & pids+=($$!); \
	done; \
	if [ "$$beat" != 0 ]; then $(VENV)/bin/celery -A terret_site beat --loglevel INFO & pids+=($$!); fi; \
	echo "Terret (distributed): http://$(HOST):$(PORT)/ with $(WORKERS) workers on queue $$queue (Ctrl-C stops all)"; \
	wait -n; echo "make dist: a process exited; stopping the others" >&2; exit 1

# --- checks ----------------------------------------------------------------------

test: $(STAMP)
	scripts/test.sh $(ARGS)

# The chaos drills (docs/chaos.md): their own pass, never part of `make
# test`. They bring their own PostgreSQL, Redis, daphne and workers
# (tests/stack.py); the test process itself needs no service, so it runs on
# a SQLite URL that no drill opens (set explicitly: a developer's .env must
# not redirect it).
chaos: $(STAMP)
	DATABASE_URL=sqlite:///$(CURDIR)/var/terret-chaos.sqlite3 REDIS_URL= TERRET_TESTING=1 TERRET_WORKER= \
		$(PY) -m pytest tests/chaos -m chaos -p no:cacheprovider $(ARGS)

# mypy's Django plugin imports the settings, which want a SECRET_KEY.
# lint-imports checks the layers contract in pyproject.toml (docs/architecture.md).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	SECRET_KEY=$${SECRET_KEY:-lint-only-not-a-secret} $(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports

# The peers bench/peers.py runs Terret against (DBOS, LangGraph): bench-only,
# on top of the development tools, under constraints.txt so no runtime pin moves.
BENCH_STAMP := $(VENV)/.terret-bench
$(BENCH_STAMP): $(STAMP) requirements-bench.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-bench.txt -c constraints.txt
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	@status=0; for f in bench/*.py; do \
		case $$f in */_*) continue ;; esac; \
		echo "=== $$f"; $(PY) $$f || status=1; \
	done; exit $$status
