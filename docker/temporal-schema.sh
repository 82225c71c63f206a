#!/bin/sh
# One-shot: create (or upgrade) Temporal's two databases in the compose PostgreSQL.
# Runs in temporalio/admin-tools, whose temporal-sql-tool and schema files match the
# server image's version. Safe to run again: creating an existing database is skipped,
# and update-schema only applies versions that are missing.
set -eu
for db in temporal temporal_visibility; do
  kind=$([ "$db" = temporal ] && echo temporal || echo visibility)
  temporal-sql-tool --plugin postgres12 --ep postgresql -p 5432 -u temporal --db "$db" create \
    || echo "database $db exists"
  temporal-sql-tool --plugin postgres12 --ep postgresql -p 5432 -u temporal --db "$db" setup-schema -v 0.0 \
    || echo "schema of $db exists"
  temporal-sql-tool --plugin postgres12 --ep postgresql -p 5432 -u temporal --db "$db" \
    update-schema -d "/etc/temporal/schema/postgresql/v12/$kind/versioned"
done
