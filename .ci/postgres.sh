#!/usr/bin/env bash
# Install (Debian packages) and start PostgreSQL on loopback for the sweep storage test,
# with a role and a database for it. Idempotent: rerunning it is harmless.
#
#   .ci/postgres.sh            # then: export SANDBOX_TEST_POSTGRES=postgresql://sandbox:sandbox@127.0.0.1:5432/sandbox
#
# Needs root (apt-get, pg_ctlcluster). Port, role, password and database can be changed
# through PGPORT, SANDBOX_PG_USER, SANDBOX_PG_PASSWORD, SANDBOX_PG_DB.
set -euo pipefail

PORT="${PGPORT:-5432}"
ROLE="${SANDBOX_PG_USER:-sandbox}"
PASSWORD="${SANDBOX_PG_PASSWORD:-sandbox}"
DB="${SANDBOX_PG_DB:-sandbox}"

if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y postgresql
fi

VERSION="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$VERSION main"; then
    pg_createcluster "$VERSION" main --port "$PORT" -- --auth-local=peer --auth-host=scram-sha-256
fi
# loopback only
sed -i "s/^#\?listen_addresses.*/listen_addresses = 'localhost'/" "/etc/postgresql/$VERSION/main/postgresql.conf"
if ! pg_lsclusters -h | awk -v v="$VERSION" '$1==v && $2=="main" {print $4}' | grep -qx online; then
    pg_ctlcluster "$VERSION" main start
fi
for _ in $(seq 1 30); do
    pg_isready -q -h 127.0.0.1 -p "$PORT" && break
    sleep 1
done
pg_isready -h 127.0.0.1 -p "$PORT"

psql_admin() { su postgres -c "psql -p $PORT -v ON_ERROR_STOP=1 -qtA -c \"$1\""; }
if [ "$(psql_admin "SELECT 1 FROM pg_roles WHERE rolname='$ROLE'")" != "1" ]; then
    psql_admin "CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'"
fi
if [ "$(psql_admin "SELECT 1 FROM pg_database WHERE datname='$DB'")" != "1" ]; then
    psql_admin "CREATE DATABASE $DB OWNER $ROLE"
fi
echo "PostgreSQL $VERSION on 127.0.0.1:$PORT; export SANDBOX_TEST_POSTGRES=postgresql://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"
