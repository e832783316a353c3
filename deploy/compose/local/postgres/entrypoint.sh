#!/bin/sh
# First start: initdb with POSTGRES_USER as superuser (password auth over TCP), create POSTGRES_DB.
# Every start: run postgres in the foreground as the postgres user, listening on all addresses.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" "${POSTGRES_DB:=$POSTGRES_USER}"
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
mkdir -p "$PGDATA" /run/postgresql
chown postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  chown postgres "$pwfile"
  as_pg initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\";" | as_pg postgres --single -D "$PGDATA" -j postgres >/dev/null
  fi
  echo "karios-postgres: initialised $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*'
