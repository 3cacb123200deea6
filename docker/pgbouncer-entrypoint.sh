#!/bin/sh
# The pgbouncer image's entrypoint: writes pgbouncer.ini and its auth file from the
# environment, then runs PgBouncer in the foreground (logging to stderr).
#
#   PGBOUNCER_<SETTING>=value        -> "<setting> = value" in [pgbouncer], the name lowercased
#                                       (PGBOUNCER_POOL_MODE=transaction -> pool_mode = transaction)
#   DB_HOST, DB_PORT, DB_NAME        -> the one [databases] entry, DB_NAME also the name clients ask for
#   DB_USER, DB_PASSWORD             -> the auth file's one login: what clients log in with (checked by
#                                       auth_type), and what PgBouncer logs in to Postgres with
#   CONFIG_DIR                       -> where both files are written (default /etc/pgbouncer)
#
# Arguments are passed to pgbouncer before the config file (e.g. -u nobody).
# tests/integration/test_pgbouncer_compose.py runs this very script with the compose service's
# environment, so what the tests start is what compose starts.
set -eu
: "${DB_HOST:?DB_HOST is not set}" "${DB_PORT:?DB_PORT is not set}" "${DB_NAME:?DB_NAME is not set}"
: "${DB_USER:?DB_USER is not set}" "${DB_PASSWORD:?DB_PASSWORD is not set}"
dir="${CONFIG_DIR:-/etc/pgbouncer}"
mkdir -p "$dir"
umask 077  # the auth file holds the password in clear (SCRAM both ways needs it, or its verifier)
# Double quotes inside a quoted auth-file field are written twice (PgBouncer's escaping).
printf '"%s" "%s"\n' "$(printf %s "$DB_USER" | sed 's/"/""/g')" "$(printf %s "$DB_PASSWORD" | sed 's/"/""/g')" \
    > "$dir/userlist.txt"
{
    echo "[databases]"
    echo "$DB_NAME = host=$DB_HOST port=$DB_PORT dbname=$DB_NAME"
    echo "[pgbouncer]"
    echo "auth_file = $dir/userlist.txt"
    env | awk '/^PGBOUNCER_[A-Z0-9_]+=/ { i = index($0, "="); print tolower(substr($0, 11, i - 11)) " = " substr($0, i + 1) }' \
        | sort
} > "$dir/pgbouncer.ini"
exec pgbouncer "$@" "$dir/pgbouncer.ini"
