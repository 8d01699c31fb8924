#!/bin/sh
# Debezium's replication role, as `invoicing stack up` creates it (streams/adapters/provision.py).
set -e
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" <<SQL
CREATE ROLE "$INVOICING_REPLICATION_USER" LOGIN REPLICATION PASSWORD '$INVOICING_REPLICATION_PASSWORD';
SQL
