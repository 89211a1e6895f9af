#!/bin/sh
# Entrypoint of deploy/local/postgres.Containerfile: on first start, a cluster in
# $PGDATA with POSTGRES_USER (password POSTGRES_PASSWORD) and POSTGRES_DB, as the
# official image makes it; then the server as the postgres user.
set -eu
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

if [ "${1:-}" = postgres ]; then
    mkdir -p "$PGDATA"
    chown postgres:postgres "$PGDATA"
    chmod 700 "$PGDATA"
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
        : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set (the first start makes the cluster)}"
        user=${POSTGRES_USER:-postgres}
        db=${POSTGRES_DB:-$user}
        pwfile=$(mktemp)
        printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
        chown postgres "$pwfile"
        as_postgres initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" \
            --auth-local=trust --auth-host=scram-sha-256 >/dev/null
        rm -f "$pwfile"
        echo 'host all all all scram-sha-256' >>"$PGDATA/pg_hba.conf"
        if [ "$db" != postgres ]; then
            as_postgres pg_ctl --pgdata="$PGDATA" --wait --silent -o "-c listen_addresses=''" start
            # psql quotes the names itself (:"x"), from stdin only (not with -c).
            echo 'CREATE DATABASE :"db" OWNER :"owner";' | as_postgres psql --quiet \
                --username="$user" --dbname=postgres --set=ON_ERROR_STOP=1 \
                --set=db="$db" --set=owner="$user"
            as_postgres pg_ctl --pgdata="$PGDATA" --wait --silent --mode=fast stop
        fi
        echo "postgres-entrypoint: created cluster $PGDATA (user $user, database $db)"
    fi
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$@" -c listen_addresses='*'
fi
exec "$@"
