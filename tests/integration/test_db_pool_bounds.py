"""``PostgresPool``'s bounds for a store on the call path, on the real PostgreSQL: a
statement timeout for reads and writes (never for a migration), and the driver's
error class for a store that must turn database failures into its own error."""

from __future__ import annotations

import pytest

from playline.db.migrations import Migration, Schema
from playline.db.postgres import PostgresPool
from tests.pg import pg_schema

pytestmark = pytest.mark.postgres

#: A migration that runs longer than the pool's statement timeout.
SLOW = Schema(
    "slow",
    (
        Migration(
            1, "a slow step", postgres=("SELECT pg_sleep(0.3)", "CREATE TABLE playline_s (n int)")
        ),
    ),
)


async def test_reads_and_writes_time_out_but_a_migration_does_not() -> None:
    async with pg_schema() as url:
        db = await PostgresPool.open(url, max_size=1, wait_s=2.0, statement_timeout_s=0.1)
        try:
            assert await db.migrate(SLOW, create=True) == 1
            for run in (db.read, db.write):
                with pytest.raises(db.driver_error, match="statement timeout"):
                    await run(lambda conn: conn.execute("SELECT pg_sleep(1)"))
            # The timeout is back in force on the connection the migration used (the
            # pool's only one).
            assert await db.read(lambda conn: conn.scalar("SHOW statement_timeout")) == "100ms"
            assert await db.read(lambda conn: conn.scalar("SELECT count(*) FROM playline_s")) == 0
        finally:
            await db.close()
