#!/bin/sh
# Runs once, when the PostgreSQL volume is first initialised: playline's own database
# (receipts, sheet rows, fleet pacing), apart from Temporal's. The password comes from
# PLAYLINE_DB_PASSWORD (required by docker-compose.yml); psql quotes it (:'password').
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v password="$PLAYLINE_DB_PASSWORD" <<'SQL'
CREATE USER playline WITH PASSWORD :'password';
CREATE DATABASE playline OWNER playline;
SQL
