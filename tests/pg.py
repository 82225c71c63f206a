"""PostgreSQL for tests: the real server on 127.0.0.1:5432, one fresh schema per test.

``pg_schema()`` creates a schema, yields a store URL whose ``search_path`` selects it
(so the stores' and fleet pacing's tables land there) and drops it afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

SERVER = os.environ.get("PLAYLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def schema_url(schema: str) -> str:
    return f"{SERVER}?options=-csearch_path%3D{schema}"


@asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    """A store URL on a schema of its own, dropped (with everything in it) afterwards."""
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = await psycopg.AsyncConnection.connect(SERVER, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as err:
        pytest.skip(f"PostgreSQL not reachable at {SERVER}: {err}")
    schema = f"t_{uuid.uuid4().hex[:10]}"
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema_url(schema)
    finally:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()
