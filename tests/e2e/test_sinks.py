"""Write-back sinks end to end: a real worker runs a play, ``playline sync`` writes its
rows to the provider server's HubSpot-shaped CRM and to a real PostgreSQL table.

The CRM's ledger is the judge: what each record holds, how many times it was
written, and every request it received (so "a second sync sends nothing" and "a
changed value sends exactly the changed fields" are read from the CRM, not from the
sync's own report).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from playline.contract import RunOptions
from playline.package_data import DEMO_CATALOG
from tests import plays_changes, plays_sinks  # noqa: F401  (register the plays with the worker)
from tests.conftest import REPO, new_id, start_worker_process
from tests.e2e.test_cli import playline
from tests.pg import pg_schema
from tests.plays import lead, read_csv_rows, run, write_csv

#: run column -> HubSpot contact property
MAP = {"first_name": "firstname", "last_name": "lastname", "company_name": "company"}
UPSERT = "/hubspot/crm/v3/objects/contacts/batch/upsert"
READ = "/hubspot/crm/v3/objects/contacts/batch/read"

EXTRA_SINKS = """
[sinks.small_contacts]
kind = "hubspot"
provider = "hubspot"
object_type = "contacts"
id_property = "email"
max_batch = 5
id_column = "work_email"
map = { first_name = "firstname", company_name = "company" }

[sinks.warehouse]
kind = "postgres"
url_env = "WAREHOUSE_URL"
table = "contacts"
key_columns = ["email"]
id_column = "work_email"
map = { first_name = "first_name", last_name = "last_name", company_name = "company" }
"""


@pytest.fixture
def sinks_env(provider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A catalog with the demo's tools, the HubSpot preset and two sinks of its own;
    HubSpot pointed at the provider server's CRM mode, whose ledger starts empty."""
    catalog = tmp_path / "catalog.toml"
    catalog.write_text('include = ["hubspot"]\n' + DEMO_CATALOG.read_text() + EXTRA_SINKS)
    monkeypatch.setenv("PLAYLINE_CATALOG", str(catalog))
    monkeypatch.setenv("HUBSPOT_BASE_URL", f"{provider.base_url}/hubspot")
    monkeypatch.setenv("HUBSPOT_ACCESS_TOKEN", "pat-test-token")
    crm(provider, "POST", "/_admin/crm/reset")
    return catalog


def crm(provider: Any, method: str, path: str, body: Any = None) -> Any:
    response = httpx.request(method, f"{provider.base_url}{path}", json=body, timeout=10.0)
    response.raise_for_status()
    return response.json()


def contacts(provider: Any) -> dict[str, dict[str, Any]]:
    """``{email: record}`` of the CRM's contacts."""
    records = crm(provider, "GET", "/_admin/crm")["records"].get("contacts", {})
    return {r["properties"]["email"]: r for r in records.values()}


def requests_to(provider: Any, path: str) -> list[dict[str, Any]]:
    return [r for r in crm(provider, "GET", "/_admin/crm")["requests"] if r["path"] == path]


async def sync(run_id: str, *args: str, common: tuple[str, ...], home: Path) -> Any:
    return await playline("sync", run_id, *args, "--json", *common, home=home)


async def export(
    run_id: str, out: Path, common: tuple[str, ...], home: Path
) -> list[dict[str, str]]:
    done = await playline("runs", "export", run_id, "--out", str(out), *common, home=home)
    assert done.returncode == 0, done.stderr
    return read_csv_rows(out)


def mapped(row: dict[str, str]) -> dict[str, str]:
    """The properties a row should give its contact: mapped cells with a value."""
    return {prop: row[column] for column, prop in MAP.items() if row[column].strip()}


async def test_hubspot_contacts_by_email_changes_only_and_if_blank(
    client,
    worker,
    task_queue,
    home,
    temporal_address,
    tmp_path: Path,
    provider,
    sinks_env,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with pg_schema() as url:
        monkeypatch.setenv("PLAYLINE_STORE_URL", url)  # stores and sync ledger in PostgreSQL
        rows = [lead(i, domain=f"d{i}.example") for i in range(30)]
        csv_path = write_csv(tmp_path / "leads.csv", rows)
        first_id, second_id = new_id("sink"), new_id("sink")
        common = ("--address", temporal_address, "--task-queue", task_queue)
        maps = [arg for column, prop in MAP.items() for arg in ("--map", f"{column}={prop}")]
        maps += ["--map", "company_domain=website", "--policy", "website=if_blank"]
        async with worker(store_url=url):
            await run(client, "t_change_report", {"csv_path": str(csv_path)},
                      task_queue=task_queue, workflow_id=first_id)  # fmt: skip
            first_rows = await export(first_id, tmp_path / "first.csv", common, home)
            with_email = [r for r in first_rows if r["work_email"].strip()]
            assert 3 < len(with_email) < len(first_rows)  # some rows have no id: never written
            # Sales typed a website into three contacts already: if_blank keeps them.
            typed = {r["work_email"] for r in with_email[:3]}
            crm(provider, "POST", "/_admin/crm/records", {
                "object_type": "contacts", "id_property": "email",
                "records": [{"email": email, "website": "typed.example"} for email in typed],
            })  # fmt: skip

            dry = await sync(first_id, "--sink", "hubspot_contacts", "--id", "work_email",
                             *maps, "--dry-run", common=common, home=home)  # fmt: skip
            assert dry.returncode == 0, dry.stderr
            assert crm(provider, "GET", "/_admin/crm")["requests"] == []  # nothing sent
            dry_report = json.loads(dry.stdout)
            assert dry_report["left"] == len(with_email)
            verdicts = {f["field"]: f["verdict"] for f in dry_report["plans"][0]["fields"]}
            assert verdicts["website"] == "if_blank" and verdicts["firstname"] == "write"

            first = await sync(first_id, "--sink", "hubspot_contacts", "--id", "work_email",
                               *maps, common=common, home=home)  # fmt: skip
            assert first.returncode == 0, first.stderr
            report = json.loads(first.stdout)
            held = contacts(provider)
            assert set(held) == {r["work_email"] for r in with_email}
            for r in with_email:
                record = held[r["work_email"]]
                website = "typed.example" if r["work_email"] in typed else r["company_domain"]
                assert record["properties"] == {
                    "email": r["work_email"],
                    **mapped(r),
                    "website": website,
                }
                assert record["writes"] == (2 if r["work_email"] in typed else 1)  # seed + sync
            assert (report["created"], report["updated"]) == (len(with_email) - 3, 3)
            assert len(requests_to(provider, UPSERT)) == 1 and len(requests_to(provider, READ)) == 1

            # A second sync of the same run sends nothing at all.
            sent_before = len(crm(provider, "GET", "/_admin/crm")["requests"])
            again = await sync(first_id, "--sink", "hubspot_contacts", "--id", "work_email",
                               *maps, common=common, home=home)  # fmt: skip
            assert again.returncode == 0, again.stderr
            assert len(crm(provider, "GET", "/_admin/crm")["requests"]) == sent_before
            assert json.loads(again.stdout)["unchanged"] == len(with_email)

            # The provider's answers drift; the re-run's sync sends exactly what changed.
            provider.configure(answer_epoch=1, changed_fraction=0.3)
            await run(client, "t_change_report", {"csv_path": str(csv_path)},
                      task_queue=task_queue, workflow_id=second_id)  # fmt: skip
            second_rows = await export(second_id, tmp_path / "second.csv", common, home)
            before = contacts(provider)
            expected: dict[str, dict[str, str]] = {}
            for r in second_rows:
                email = r["work_email"].strip()
                if not email:
                    continue
                held_props = before.get(email, {}).get("properties", {})
                wanted = {**mapped(r), "website": r["company_domain"]}
                changed = {k: v for k, v in wanted.items() if held_props.get(k) != v}
                if email in typed:
                    changed.pop("website", None)  # kept out: never re-sent
                if changed:
                    expected[email] = changed
            assert expected  # the drift changed something worth writing
            third = await sync(second_id, "--sink", "hubspot_contacts", "--id", "work_email",
                               *maps, common=common, home=home)  # fmt: skip
            assert third.returncode == 0, third.stderr
            upserts = requests_to(provider, UPSERT)[1:]
            sent = {i["id"]: i["properties"] for u in upserts for i in u["body"]["inputs"]}
            assert sent == expected
            after = contacts(provider)
            for email in typed & set(after):
                assert after[email]["properties"]["website"] == "typed.example"
            for email, record in before.items():  # a blank never overwrote a value
                for prop, value in record["properties"].items():
                    assert after[email]["properties"][prop] in (
                        value,
                        sent.get(email, {}).get(prop),
                    )


async def test_a_429_storm_and_a_daily_cap_park_and_resume_and_the_warehouse_table(
    client,
    worker,
    task_queue,
    home,
    temporal_address,
    tmp_path: Path,
    provider,
    sinks_env,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [lead(i, domain=f"d{i}.example") for i in range(60)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    run_id = new_id("sink")
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        await run(client, "t_change_report", {"csv_path": str(csv_path)},
                  task_queue=task_queue, workflow_id=run_id)  # fmt: skip
        exported = await export(run_id, tmp_path / "run.csv", common, home)
        with_email = [r for r in exported if r["work_email"].strip()]
        assert len(with_email) > 20
        rejected = with_email[0]["work_email"]
        # Two 429s, then three requests left in the day; one contact HubSpot refuses.
        crm(provider, "POST", "/_admin/crm/config",
            {"storm": 2, "daily": 3, "reject_ids": [rejected]})  # fmt: skip
        parked = await sync(run_id, "--sink", "small_contacts", common=common, home=home)
        assert parked.returncode == 4, parked.stderr
        report = json.loads(parked.stdout)
        assert "daily" in report["parked"]
        assert report["rejections"] == [
            {"record": rejected, "reason": f"Property values were not valid: email {rejected!r}"}
        ]
        assert report["created"] == 14 and report["left"] == len(with_email) - 15
        crm(provider, "POST", "/_admin/crm/config", {"daily_used": 0, "daily": 1000})  # a new day
        resumed = await sync(run_id, "--sink", "small_contacts", common=common, home=home)
        assert resumed.returncode == 0, resumed.stderr
        held = contacts(provider)
        assert set(held) == {r["work_email"] for r in with_email} - {rejected}
        assert all(record["writes"] == 1 for record in held.values())  # none lost, none twice
        assert json.loads(resumed.stdout)["rejected"] == 1  # refused again, never written

        # The warehouse: a table that exists, upserted by its key, equal to the run's rows.
        async with pg_schema() as url:
            import psycopg

            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(
                    "CREATE TABLE contacts (email text PRIMARY KEY, first_name text,"
                    " last_name text, company text, owner text)"
                )
                await conn.execute(
                    "INSERT INTO contacts VALUES (%s, 'Old', 'Name', 'Old Co', 'sales-rep')",
                    [with_email[1]["work_email"]],
                )
                monkeypatch.setenv("WAREHOUSE_URL", url)
                done = await sync(run_id, "--sink", "warehouse", common=common, home=home)
                assert done.returncode == 0, done.stderr
                assert json.loads(done.stdout)["updated"] == 1
                cursor = await conn.execute(
                    "SELECT email, first_name, last_name, company, owner FROM contacts"
                )
                table = {row[0]: row[1:] for row in await cursor.fetchall()}
                twice = await sync(run_id, "--sink", "warehouse", common=common, home=home)
                assert json.loads(twice.stdout)["requests"] == 0
    assert table == {
        r["work_email"]: (
            r["first_name"],
            r["last_name"],
            r["company_name"] or ("Old Co" if r is with_email[1] else None),
            "sales-rep" if r is with_email[1] else None,
        )
        for r in with_email
    }


async def test_a_sync_killed_mid_batch_writes_every_record_once(
    client, worker, task_queue, home, temporal_address, tmp_path: Path, provider, sinks_env
) -> None:
    rows = [lead(i, domain=f"d{i}.example") for i in range(50)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    run_id = new_id("sink")
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        await run(client, "t_change_report", {"csv_path": str(csv_path)},
                  task_queue=task_queue, workflow_id=run_id)  # fmt: skip
        exported = await export(run_id, tmp_path / "run.csv", common, home)
        with_email = {r["work_email"] for r in exported if r["work_email"].strip()}
        assert len(with_email) > 15  # more than three batches of five
        # The CRM applies each batch, then holds its answer: the sync is killed while
        # the third batch is written but not yet acknowledged.
        crm(provider, "POST", "/_admin/crm/config", {"latency_ms": 400})
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "playline", "sync", run_id, "--sink", "small_contacts",
            "--lease-ttl", "1", *common,
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home)},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(1500):
            ledger = crm(provider, "GET", "/_admin/crm")
            upserts = [r for r in ledger["requests"] if r["path"] == UPSERT]
            if len(upserts) >= 3 and ledger["answering"]:
                break
            await asyncio.sleep(0.02)
        proc.kill()
        await proc.wait()
        assert len(upserts) == 3 and proc.returncode == -9
        crm(provider, "POST", "/_admin/crm/config", {"latency_ms": 0})
        await asyncio.sleep(1.5)  # the killed sync's lease (1 s) runs out
        resumed = await sync(run_id, "--sink", "small_contacts", "--lease-ttl", "1",
                             common=common, home=home)  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["batches_resent"] == 1  # the batch in flight was read back, not re-sent
    held = contacts(provider)
    assert set(held) == with_email
    assert all(record["writes"] == 1 for record in held.values())
    sent = [i["id"] for r in requests_to(provider, UPSERT) for i in r["body"]["inputs"]]
    assert sorted(sent) == sorted(with_email)  # every record in exactly one upsert


async def test_a_play_enriches_and_writes_back_in_one_durable_run(
    client, worker, task_queue, home, temporal_address, tmp_path: Path, provider, sinks_env
) -> None:
    rows = [lead(i, domain=f"d{i}.example") for i in range(20)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    run_id = new_id("sink")
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        result = await run(client, "t_enrich_and_sync", {"csv_path": str(csv_path)},
                           task_queue=task_queue, workflow_id=run_id,
                           options=RunOptions(preview_rows=0))  # fmt: skip
        exported = await export(run_id, tmp_path / "run.csv", common, home)
        handle = client.get_workflow_handle(run_id)
        history = (await handle.fetch_history()).to_json()
        got = await playline("runs", "get", run_id, "--state", *common, home=home)
    with_email = {r["work_email"]: r for r in exported if r["work_email"].strip()}
    held = contacts(provider)
    assert set(held) == set(with_email)
    for email, record in held.items():
        row = with_email[email]
        expected = {"email": email, "firstname": row["first_name"], "lastname": row["last_name"]}
        if row["company_name"]:
            expected["company"] = row["company_name"]
        assert record["properties"] == expected and record["writes"] == 1
    first, again = result.output["first"], result.output["again"]
    assert (first["created"], first["requests"]) == (len(with_email), -(-len(with_email) // 5))
    assert (again["unchanged"], again["requests"]) == (len(with_email), 0)
    assert not any(email in history for email in with_email)  # no row went through history
    assert got.returncode == 0, got.stderr
    assert f"sync to small_contacts: {len(with_email)} created, 0 updated" in got.stdout
    # runs get says each sync in its own words before the raw state, which keeps them too.
    human, _, raw = got.stdout.partition("{")
    assert f"  sync to small_contacts: {len(with_email)} created, 0 updated" in human
    assert f"0 created, 0 updated, {len(with_email)} unchanged" in human
    assert '"syncs"' in "{" + raw


async def test_a_worker_killed_mid_sync_is_taken_over_and_writes_every_record_once(
    client, task_queue, home, temporal_address, tmp_path: Path, provider, sinks_env
) -> None:
    rows = [lead(i, domain=f"d{i}.example") for i in range(40)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    log = tmp_path / "worker.log"
    crm(provider, "POST", "/_admin/crm/config", {"latency_ms": 400})
    first = start_worker_process(temporal_address, task_queue, home, log, plays="tests.plays_sinks")
    handle = await client.start_workflow(
        "t_sync_takeover",
        {"csv_path": str(csv_path), "takeover_s": 2},
        id=new_id("sink"),
        task_queue=task_queue,
    )
    try:
        for _ in range(3000):  # a bound for a stuck run, not a timing assertion
            ledger = crm(provider, "GET", "/_admin/crm")
            upserts = [r for r in ledger["requests"] if r["path"] == UPSERT]
            if len(upserts) >= 2 and ledger["answering"]:
                break
            await asyncio.sleep(0.02)
        first.send_signal(signal.SIGKILL)  # the second batch is written, not acknowledged
        first.wait(timeout=10)
        assert len(upserts) == 2, log.read_text()
        crm(provider, "POST", "/_admin/crm/config", {"latency_ms": 0})
        second = start_worker_process(
            temporal_address, task_queue, home, log, plays="tests.plays_sinks"
        )
        try:
            summary = await asyncio.wait_for(handle.result(), 120)  # a bound, not a timing
        finally:
            second.terminate()
            second.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)
    held = contacts(provider)
    sent = [i["id"] for r in requests_to(provider, UPSERT) for i in r["body"]["inputs"]]
    assert sorted(sent) == sorted(held)  # every record in exactly one upsert
    assert all(record["writes"] == 1 for record in held.values())
    # The attempt that took over found the first batch recorded and read the second back.
    output = summary["output"]
    assert len(held) > 10 and output["rejected"] == 0
    assert output["unchanged"] == 5 and output["updated"] == 5
    assert output["created"] == len(held) - 10
