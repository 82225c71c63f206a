"""The naive Temporal design the throughput benchmark compares playline against.

What a team writes by hand on Temporal without playline: the workflow reads the CSV
in pages through an activity (rows travel through history), runs ONE activity per
provider call under a sliding window of 200, writes each answer to SQLite from the
activity, and continues as new every page. No receipts, no governor, no chunking.

    python bench/naive.py worker --address HOST:PORT --task-queue Q --out results.db
    (the workflow type is ``naive.Enrich``; see bench/throughput.py for how it is started)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    import csv
    import sqlite3

    import httpx

PAGE_ROWS = 2000
WINDOW = 200


@dataclass
class EnrichInput:
    csv_path: str
    provider_url: str
    offset: int = 0
    done: int = 0


@dataclass
class PageInput:
    csv_path: str
    offset: int
    limit: int


@dataclass
class CallInput:
    provider_url: str
    row: dict[str, str]


class NaiveActivities:
    """A shared HTTP client and a SQLite file, as a hand-written worker would hold them."""

    def __init__(self, out_path: str) -> None:
        self.http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=32),
            timeout=httpx.Timeout(15.0, connect=5.0),
        )
        self.db = sqlite3.connect(out_path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS results (lead_id TEXT PRIMARY KEY, email TEXT)")
        self.key = os.environ.get("ACME_API_KEY", "")

    @activity.defn(name="naive.load_page")
    async def load_page(self, input: PageInput) -> list[dict[str, str]]:
        with open(input.csv_path, newline="") as handle:
            reader = csv.DictReader(handle)
            rows = []
            for i, row in enumerate(reader):
                if i < input.offset:
                    continue
                if len(rows) >= input.limit:
                    break
                rows.append(row)
        return rows

    @activity.defn(name="naive.call")
    async def call(self, input: CallInput) -> None:
        row = input.row
        response = await self.http.post(
            f"{input.provider_url}/acme/v1/email/find",
            json={
                "first_name": row["first_name"],
                "last_name": row["last_name"],
                "domain": row["company_domain"],
            },
            headers={"X-Api-Key": self.key, "Idempotency-Key": f"naive-{row['lead_id']}"},
        )
        response.raise_for_status()
        email = response.json().get("email")
        await asyncio.to_thread(
            self.db.execute,
            "INSERT OR REPLACE INTO results VALUES (?, ?)",
            (row["lead_id"], email),
        )


@workflow.defn(name="naive.Enrich")
class NaiveEnrich:
    @workflow.run
    async def run(self, input: EnrichInput) -> int:
        rows = await workflow.execute_activity(
            "naive.load_page",
            PageInput(input.csv_path, input.offset, PAGE_ROWS),
            result_type=list[dict[str, str]],
            start_to_close_timeout=timedelta(minutes=5),
        )
        pending: set[asyncio.Future[Any]] = set()
        for row in rows:
            if len(pending) >= WINDOW:
                _, still = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                pending = set(still)  # workflow.wait returns lists
            pending.add(
                asyncio.ensure_future(
                    workflow.execute_activity(
                        "naive.call",
                        CallInput(input.provider_url, row),
                        start_to_close_timeout=timedelta(minutes=1),
                    )
                )
            )
        if pending:
            await workflow.wait(pending)
        done_rows = input.done + len(rows)
        if len(rows) == PAGE_ROWS:
            workflow.continue_as_new(
                EnrichInput(input.csv_path, input.provider_url, input.offset + PAGE_ROWS, done_rows)
            )
        return done_rows


async def run_worker(address: str, task_queue: str, out_path: str) -> None:
    client = await Client.connect(address)
    acts = NaiveActivities(out_path)
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[NaiveEnrich],
        activities=[acts.load_page, acts.call],
        max_concurrent_activities=WINDOW,
    )
    await worker.run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    asyncio.run(run_worker(args.address, args.task_queue, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
