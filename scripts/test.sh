#!/usr/bin/env bash
# The test command (`make test`). Extra arguments go to every pytest pass,
# e.g. `scripts/test.sh -k append -x`.
#
# Pass 1, PostgreSQL: the whole suite against DATABASE_URL (default
#   postgres://root@127.0.0.1:5432/test), with REDIS_URL (default
#   redis://127.0.0.1:6379/0) when Redis answers; in TERRET_TEST_PROCESSES
#   pytest-xdist processes (default 2, 0 for one), pytest-django creating
#   test_<name>_gw0, test_<name>_gw1, ... (test_<name> with 0).
# Pass 2, SQLite: the embedded path (no DATABASE_URL, no REDIS_URL): the
#   tests marked `embedded` plus every test that needs no service. When
#   PostgreSQL is down this pass runs the whole suite instead, so the
#   service-bound tests show up as skips with their reasons. With
#   PostgreSQL up it runs beside pass 1 (see below).
# Pass 3, only when PostgreSQL is down and Redis is up: the Redis tests
#   that need no PostgreSQL, against SQLite.
#
# No pass runs the chaos drills (marker `chaos`, tests/chaos): they are
# their own pass, `make chaos` (docs/chaos.md).
#
# A missing service is reported in a banner naming the tests it kept from
# running. In CI (CI=true) nothing may be skipped: TERRET_NO_SKIP=1 turns
# every service skip into a failure, and a missing service fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
if [[ ! -x $PY ]]; then
    echo "test.sh: $PY not found; run 'make venv' (or 'make test', which does)" >&2
    exit 2
fi

PROCS=${TERRET_TEST_PROCESSES:-2}
if [[ ! $PROCS =~ ^[0-9]+$ ]]; then
    echo "test.sh: TERRET_TEST_PROCESSES=$PROCS must be a whole number (0 runs the PostgreSQL pass in one process)" >&2
    exit 2
fi

PG_URL=${DATABASE_URL:-postgres://root@127.0.0.1:5432/test}
RD_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
IN_CI=0
if [[ ${CI:-} == true || ${CI:-} == 1 ]]; then
    IN_CI=1
    export TERRET_NO_SKIP=1
fi
# Own channel-layer prefix and Celery queue, so a dev server or another test
# run on the same Redis neither sees nor steals this run's messages.
export TERRET_CHANNEL_PREFIX=${TERRET_CHANNEL_PREFIX:-terret-test-$$}
export TERRET_QUEUE=${TERRET_QUEUE:-terret-test-$$}
export TERRET_TESTING=1
# Empty, not unset: settings fill unset variables from a local .env, and a
# developer's .env must not redirect the test run (empty means default).
export TERRET_WORKER=

red=$'\e[1;31m' yellow=$'\e[1;33m' green=$'\e[1;32m' off=$'\e[0m'
[[ -t 1 ]] || { red='' yellow='' green='' off=''; }

probe_postgres() {
    [[ $1 == postgres://* || $1 == postgresql://* || $1 == pgsql://* ]] || return 1
    "$PY" - "$1" <<'EOF' >/dev/null 2>&1
import re, sys, psycopg
try:
    psycopg.connect(sys.argv[1].replace("pgsql://", "postgresql://", 1), connect_timeout=3).close()
except psycopg.OperationalError as exc:
    # The server answers but the database is not there yet: fine, the tests
    # only need the server (pytest-django creates test_<name> itself).
    sys.exit(0 if re.search(r"database \"[^\"]*\" does not exist", str(exc)) else 1)
EOF
}

probe_redis() {
    "$PY" - "$1" <<'EOF' >/dev/null 2>&1
import sys, redis
redis.Redis.from_url(sys.argv[1], socket_connect_timeout=3).ping()
EOF
}

missing=()
have_pg=0 have_redis=0
if probe_postgres "$PG_URL"; then have_pg=1; else
    missing+=("PostgreSQL is not reachable at $PG_URL (set DATABASE_URL, or start it): tests marked 'postgres' or 'worker' were not run on PostgreSQL")
fi
if probe_redis "$RD_URL"; then have_redis=1; else
    missing+=("Redis is not reachable at $RD_URL (set REDIS_URL, or start it): tests marked 'redis' or 'worker' were not run")
fi
if [[ ! -x /usr/bin/chromium ]]; then
    missing+=("Debian's chromium is missing (apt-get install chromium chromium-driver): tests marked 'browser' were not run")
fi

banner() {
    local colour=$1
    shift
    printf '%s\n' "$colour================================================================================"
    printf '  %s\n' "$@"
    printf '%s\n' "================================================================================$off"
}

# The node ids a marker expression selects, for the banner.
list_tests() {
    DATABASE_URL=sqlite:///unused.sqlite3 REDIS_URL= "$PY" -m pytest --collect-only -q -m "$1" 2>/dev/null |
        grep '::' | sed 's/^/    /'
}

if ((IN_CI)) && ((${#missing[@]})); then
    banner "$red" "CI=true: nothing may be skipped, but:" "${missing[@]}"
    exit 1
fi
if ((${#missing[@]})); then
    banner "$yellow" "SERVICES MISSING: some tests will NOT run" "${missing[@]}"
fi

results=()
status=0
record_pass() {
    local name=$1 rc=$2
    if ((rc == 5)); then
        # Nothing selected (say, a -k that matches no test of this pass):
        # not a failure of this pass.
        results+=("$name: no tests selected")
    elif ((rc == 0)); then
        results+=("$name: passed")
    else
        results+=("$name: FAILED (pytest exit $rc)")
        status=1
    fi
}

run_pass() {
    local name=$1
    shift
    echo
    echo "${green}=== $name ===${off}"
    env "$@" "$PY" -m pytest "${PYTEST_ARGS[@]}"
    record_pass "$name" $?
}

# Pass 2 (SQLite) shares nothing with pass 1 (its own database file, no
# Redis, no worker processes), and pass 1 spends most of its time waiting on
# worker processes, servers and browsers: so it runs beside pass 1, its
# output held in a file and printed after pass 1's. That is where the time
# goes, not into skipping anything.
sqlite_url=sqlite:///$PWD/var/terret-test.sqlite3
if ((have_pg)); then
    mkdir -p var
    sqlite_log=$(mktemp "${TMPDIR:-/tmp}/terret-sqlite-pass.XXXXXX")
    sqlite_tmp=$(mktemp -d "${TMPDIR:-/tmp}/terret-sqlite-tmp.XXXXXX")  # its own tmp_path tree
    (
        PYTEST_ARGS=(-m "not postgres and not redis and not worker and not browser and not chaos" "$@")
        env DATABASE_URL="$sqlite_url" REDIS_URL= "$PY" -m pytest "${PYTEST_ARGS[@]}" --basetemp="$sqlite_tmp"
    ) >"$sqlite_log" 2>&1 &
    sqlite_pid=$!

    redis_env=REDIS_URL= redis_name="no Redis"
    if ((have_redis)); then redis_env=REDIS_URL=$RD_URL redis_name="Redis ($RD_URL)"; fi
    # Pass 1 waits on worker processes, servers and browsers more than it
    # computes: pytest-xdist runs it in TERRET_TEST_PROCESSES processes (2 by
    # default; 0 runs it in this one), each with its own test database and
    # its own Redis queue and channel prefix (terret_site/settings.py).
    # `--dist load` hands out tests in order, so the browser tests, sorted
    # last (tests/conftest.py), run after every other test of their process.
    PYTEST_ARGS=(-m "not chaos" "$@")
    ((PROCS > 0)) && PYTEST_ARGS+=(-n "$PROCS" --dist load)
    # CI prints the pass's slowest tests, where the time budget (45 minutes) goes.
    ((IN_CI)) && PYTEST_ARGS+=(--durations=25)
    run_pass "pass 1: PostgreSQL ($PG_URL), $redis_name" DATABASE_URL="$PG_URL" "$redis_env"

    wait "$sqlite_pid"
    rc=$?
    echo
    echo "${green}=== pass 2: SQLite, embedded path (ran beside pass 1) ===${off}"
    cat "$sqlite_log"
    rm -rf "$sqlite_log" "$sqlite_tmp"
    record_pass "pass 2: SQLite, embedded path" "$rc"
else
    results+=("pass 1: PostgreSQL: NOT RUN (no PostgreSQL)")
    PYTEST_ARGS=(-m "not chaos" "$@")
    run_pass "pass 2: SQLite, whole suite (service-bound tests skip)" DATABASE_URL="$sqlite_url" REDIS_URL=
    if ((have_redis)); then
        PYTEST_ARGS=(-m "redis and not postgres and not worker and not chaos" "$@")
        run_pass "pass 3: SQLite with Redis ($RD_URL)" DATABASE_URL="$sqlite_url" REDIS_URL="$RD_URL"
    fi
fi

echo
if ((${#missing[@]})); then
    lines=("SKIPPED BECAUSE SERVICES ARE MISSING:" "${missing[@]}")
    markers=()
    ((have_pg)) || markers+=("postgres" "worker")
    ((have_redis)) || markers+=("redis" "worker")
    [[ -x /usr/bin/chromium ]] || markers+=("browser")
    expr=$(printf '%s\n' "${markers[@]}" | sort -u | paste -sd' ' | sed 's/ / or /g')
    mapfile -t skipped < <(list_tests "$expr")
    lines+=("" "${#skipped[@]} tests in the suite (marked $expr) cannot run without them:")
    banner "$yellow" "${lines[@]}"
    printf '%s\n' "${skipped[@]}"
fi
if ((status)); then
    banner "$red" "${results[@]}"
else
    banner "$green" "${results[@]}"
fi
exit $status
