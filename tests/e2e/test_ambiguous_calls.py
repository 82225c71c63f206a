"""Ambiguous calls end to end: providers that charge every request and ignore the key.

The provider server runs in ``idempotency="ignore"`` mode (every request that reaches
the charge pays, as at most real enrichment APIs) and the catalog declares its tools
``idempotency = "none"``. playline must then never re-send a call that may have been
charged (sent, no definitive answer): its receipt becomes ``ambiguous``, its row fails
with ``CallAmbiguous``, the run counts it, and only ``retry_ambiguous`` re-sends it.

Everything is read from the outside and compared call by call: the provider's ledger
names each request by ``idem`` (a digest of its ``Idempotency-Key``), and the receipts
of the worker's SQLite store give the same digest through
``idem_digest(idempotency_key(key, generation))``. Real Temporal dev server, real
provider server, real HTTP; nothing here asserts on durations: tests wait for the
ledger or the store to reach a state, never for a clock.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.provider_server import idem_digest
from playline.stores.receipts import idempotency_key
from tests.conftest import demo_catalog, new_id, start_worker_process
from tests.e2e.test_cli import playline
from tests.e2e.test_crash_recovery import first_rows
from tests.plays import export_rows, lead, read_csv_rows, run, write_csv

#: The charged faults, about 10 % of all requests together.
FAULT_RATES = {
    "fault_rate_500_after_charge": 0.04,
    "fault_rate_drop_after_charge": 0.03,
    "fault_rate_timeout_after_charge": 0.03,
}
AMBIGUOUS_ERROR = "CallAmbiguous: "


def none_catalog(tmp_path: Path, *, timeout_s: float) -> Path:
    """The demo catalog with every tool ``idempotency = "none"`` and a given HTTP timeout."""
    return demo_catalog(tmp_path, idempotency="none", timeout_s=timeout_s)


def receipts(home: Path) -> list[dict[str, Any]]:
    """Every receipt of the worker's SQLite store (read-only), with its request's digest.

    ``idem`` is what the provider's ledger records for the request a receipt sends:
    ``idem_digest`` of the ``Idempotency-Key`` playline derives from the receipt.
    """
    path = Settings.from_env(home=home).receipts_path
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        found = conn.execute(
            "SELECT key, tool_id, status, generation, sent_at, error FROM playline_receipts"
        ).fetchall()
    finally:
        conn.close()
    return [
        {
            "key": key,
            "tool": tool,
            "status": status,
            "sent": sent_at is not None,
            "error": error,
            "idem": idem_digest(idempotency_key(key, generation)),
            "generation": generation,
        }
        for key, tool, status, generation, sent_at, error in found
    ]


def digests(found: list[dict[str, Any]], status: str) -> set[str]:
    return {r["idem"] for r in found if r["status"] == status}


def unanswered(calls: list[dict[str, Any]]) -> set[str]:
    """The digests of the charged calls whose client got no usable answer."""
    return {c["idem"] for c in calls if c["charged"] and not c["answered"]}


def assert_sent_once(calls: list[dict[str, Any]]) -> None:
    """Every request carried an Idempotency-Key, and no key was sent twice."""
    sent = Counter(c["idem"] for c in calls)
    assert "" not in sent
    assert [idem for idem, n in sent.items() if n > 1] == []


async def run_with_faults(
    client: Any, provider: Any, worker: Any, task_queue: str, catalog: Path, csv_path: Path
) -> tuple[PlayRunResult, dict[str, Any], list[dict[str, Any]]]:
    """``enrich_leads`` over ``csv_path`` with ~10 % charged faults; the result, and the
    ledger and call records once every held fault has been answered."""
    # A timeout_after_charge holds the answer twice the tools' timeout: the client
    # gives up first (a timeout after the request went out), whatever the load.
    provider.configure(idempotency="ignore", timeout_sleep_s=3.0, **FAULT_RATES)
    async with worker(catalog_path=str(catalog)):
        result = await run(
            client,
            "enrich_leads",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            options=RunOptions(chunk_size=10),
            timeout_s=180,
        )
    provider.configure(**dict.fromkeys(FAULT_RATES, 0.0))
    ledger = await asyncio.to_thread(provider.wait_idle, 60)
    return result, ledger, provider.calls()


async def test_ten_percent_charged_faults_pay_nothing_twice_and_count_each_ambiguous_call(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """500s, dropped connections and timeouts after the charge on ~10 % of the calls.

    Nothing is paid twice or even sent twice; every call the provider charged without
    answering is counted once as ambiguous by the run, and is exactly the set of
    receipts left ``ambiguous``; every row is ok or failed with ``CallAmbiguous``.
    """
    catalog = none_catalog(tmp_path, timeout_s=1.5)
    csv_path = first_rows(80, tmp_path / "leads80.csv")
    result, ledger, calls = await run_with_faults(
        client, provider, worker, task_queue, catalog, csv_path
    )

    # Nothing paid twice, nothing even sent twice, nothing refused.
    assert ledger["double_charged"] == 0
    assert_sent_once(calls)
    assert ledger["received"] == ledger["charged"] == len(calls)
    # The faults happened, and each one is a charged call without an answer.
    faults = ledger["faults_by_kind"]
    assert set(faults) == {name.removeprefix("fault_rate_") for name in FAULT_RATES}
    reasons = ledger["charged_unanswered_by_reason"]
    assert {kind: reasons.get(kind) for kind in faults} == faults
    # (a call the client gave up on for load alone would be "client_gone": ambiguous too)
    assert ledger["charged_unanswered"] == sum(faults.values()) + reasons.get("client_gone", 0)
    assert len(unanswered(calls)) == ledger["charged_unanswered"]

    # The run counts each of them once, and made (paid, answered) all the others.
    stats = result.stats
    assert stats.calls_ambiguous == ledger["charged_unanswered"]
    assert stats.calls_made == ledger["charged"] - ledger["charged_unanswered"]
    assert stats.calls_failed == 0

    # The receipts left ambiguous are exactly the calls the provider charged unanswered.
    found = receipts(home)
    assert {r["status"] for r in found} <= {"completed", "ambiguous"}
    assert digests(found, "ambiguous") == unanswered(calls)
    assert digests(found, "completed") == {c["idem"] for c in calls if c["answered"]}

    # No row lost: each is ok, or failed because one of its calls is ambiguous.
    (dataset,) = result.datasets
    ds = dataset.stats
    assert ds.rows_ok + ds.rows_failed == dataset.admitted
    assert ds.rows_failed > 0
    assert ds.rows_ambiguous == ds.rows_failed
    await export_rows(home, dataset.run_ref, tmp_path / "out.csv")
    rows = read_csv_rows(tmp_path / "out.csv")
    assert len(rows) == dataset.admitted
    failed = [r for r in rows if r["_error"]]
    assert len(failed) == ds.rows_failed
    assert all(r["_error"].startswith(AMBIGUOUS_ERROR) for r in failed)
    assert all("may have been charged" in r["_error"] for r in failed)
    assert all(r["company_name"] and r["work_email"] for r in rows if not r["_error"])


async def test_retry_ambiguous_resends_exactly_the_ambiguous_calls(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """After a run that left ambiguous calls: a plain rerun sends nothing at all (the
    ambiguous rows fail again, nothing is re-sent); a rerun with
    ``RunOptions(retry_ambiguous=True)`` re-sends each ambiguous call once, under its
    own key, and every row ends ok."""
    catalog = none_catalog(tmp_path, timeout_s=1.5)
    csv_path = first_rows(60, tmp_path / "leads60.csv")
    first, _, first_calls = await run_with_faults(
        client, provider, worker, task_queue, catalog, csv_path
    )
    ambiguous = digests(receipts(home), "ambiguous")
    ambiguous_keys = {r["key"] for r in receipts(home) if r["status"] == "ambiguous"}
    assert ambiguous and ambiguous == unanswered(first_calls)
    assert first.stats.calls_ambiguous == len(ambiguous)
    failed_rows = first.datasets[0].stats.rows_failed
    assert failed_rows > 0
    before = provider.ledger()

    play_input = {"csv_path": str(csv_path)}
    async with worker(catalog_path=str(catalog)):
        plain = await run(
            client,
            "enrich_leads",
            play_input,
            task_queue=task_queue,
            options=RunOptions(chunk_size=10),
            timeout_s=180,
        )
        after_plain = provider.ledger()
        ambiguous_after_plain = digests(receipts(home), "ambiguous")
        retried = await run(
            client,
            "enrich_leads",
            play_input,
            task_queue=task_queue,
            options=RunOptions(chunk_size=10, retry_ambiguous=True),
            timeout_s=180,
        )
    ledger = await asyncio.to_thread(provider.wait_idle, 60)

    # Without the option: not one request, the same rows fail for the same reason.
    assert after_plain["received"] == before["received"]
    assert plain.stats.calls_made == 0 and plain.stats.calls_ambiguous == 0
    assert plain.datasets[0].stats.rows_failed == failed_rows
    assert plain.datasets[0].stats.rows_ambiguous == failed_rows
    assert ambiguous_after_plain == ambiguous

    # With it: each ambiguous call is sent once more under its own key (and, the
    # provider ignoring keys, charged once more: that is what the option is for); the
    # other requests are first sends of calls the failed rows never reached.
    new_calls = provider.calls()[len(first_calls) :]
    assert len(new_calls) == ledger["received"] - before["received"]
    assert all(c["answered"] for c in new_calls)
    # A re-send goes under the call's key, or under its next generation's when a
    # chunk attempt was retried after claiming it unsent (a loaded machine): either
    # way each ambiguous call is sent exactly once more.
    found = receipts(home)
    generations = {r["key"]: r["generation"] for r in found}
    keys_of = {
        idem_digest(idempotency_key(key, g)): key
        for key in ambiguous_keys
        for g in range(generations[key] + 1)
    }
    resent = Counter(keys_of[c["idem"]] for c in new_calls if c["idem"] in keys_of)
    assert set(resent.values()) == {1}  # never more than once
    # A waterfall re-run from its top may now find its value at an earlier step (that
    # step's own ambiguous call, re-sent, answered): the later step's ambiguous call is
    # then not needed, and is not sent again. Every other ambiguous call is re-sent.
    skipped = ambiguous_keys - set(resent)
    assert all(key.startswith("prospectr_email:") for key in skipped), skipped
    first_sends = [c["idem"] for c in new_calls if c["idem"] not in keys_of]
    assert len(set(first_sends)) == len(first_sends)
    assert ledger["charged"] - before["charged"] == len(resent) + len(first_sends)
    assert ledger["double_charged"] == len(resent)
    assert retried.stats.calls_made == len(new_calls)
    assert retried.stats.calls_ambiguous == 0

    (dataset,) = retried.datasets
    assert dataset.stats.rows_ok == dataset.admitted
    assert dataset.stats.rows_failed == 0
    # The receipts: all completed but the calls no row needed again, still ambiguous.
    assert {r["key"] for r in found if r["status"] != "completed"} == skipped
    assert {r["status"] for r in found} - {"completed"} <= {"ambiguous"}


async def test_cli_counts_ambiguous_calls_and_retry_ambiguous_resends_them(
    provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    """``playline run`` prints "ambiguous calls: N"; ``--retry-ambiguous`` re-sends those N
    (one email call per row here, so the ledger grows by exactly N) and every row is ok."""
    catalog = none_catalog(tmp_path, timeout_s=5.0)
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(6)])
    common = ("run", "t_tool_column", "--csv", str(csv_path))
    common += ("--address", temporal_address, "--task-queue", task_queue)
    provider.configure(idempotency="ignore", fail_next={"500_after_charge": 2})
    async with worker(catalog_path=str(catalog)):
        first = await playline(*common, "--id", new_id("cli-amb"), home=home, timeout_s=120)
        assert first.returncode == 0, first.stderr
        after_first = provider.ledger()
        again = await playline(
            *common, "--retry-ambiguous", "--id", new_id("cli-retry"), home=home, timeout_s=120
        )
        assert again.returncode == 0, again.stderr
    ledger = provider.ledger()

    assert "rows: 4 ok, 2 failed" in first.stdout
    assert "ambiguous calls: 2 (sent, no definitive answer" in first.stdout
    assert "--retry-ambiguous" in first.stdout
    assert (after_first["charged"], after_first["charged_unanswered"]) == (6, 2)

    assert "rows: 6 ok, 0 failed" in again.stdout
    assert "ambiguous calls" not in again.stdout
    assert ledger["charged"] - after_first["charged"] == 2
    assert ledger["double_charged"] == 2  # the two re-sent on purpose, and only those
    assert {r["status"] for r in receipts(home)} == {"completed"}


#: The tools of the slow provider in the SIGKILL test.
ACME_TOOLS = frozenset({"email_finder", "person_enrich"})


async def sent_unsettled(home: Path) -> tuple[list[str], set[str]]:
    """The digests of the receipts marked sent that have no outcome yet, and their tools."""
    found = await asyncio.to_thread(receipts, home)
    sent = [r for r in found if r["status"] == "running" and r["sent"]]
    return sorted(r["idem"] for r in sent), {r["tool"] for r in sent}


async def test_sigkill_with_calls_in_flight_leaves_exactly_those_calls_ambiguous(
    client, provider, temporal_address, task_queue, tmp_path
) -> None:
    """SIGKILL the only worker while calls sleep at the provider; a new worker finishes.

    The kill is placed so what is in flight is known exactly, not raced: acme (email,
    person) answers after 20 s, firmo (companies) at once, and the run keeps 2 chunks x
    4 rows in flight. Every row calls firmo, then acme, so soon all 8 row slots wait on
    an acme request sleeping at the provider. The test kills the worker once the
    provider has 8 requests in flight and their digests are exactly the receipts marked
    *sent* and not settled, all of them acme calls. From then on nothing can change
    before a sleep ends: no slot is free to send, no answer is due. A sent mark whose
    request had not yet reached the provider (the one inherent race: the mark is
    written just before the request goes out) would show as a difference between the
    two sets, and a short firmo call as a tool outside acme, which is why the test
    waits for exact equality, never settling for "at most". So at the kill the
    ledger's in-flight set is exactly the set of calls that may have been charged.

    The second worker must find each of them ``ambiguous`` (their leases lapse, their
    sent marks say they went out) and never re-send one; the provider, once the sleeps
    end, charges each once and counts it ``client_gone``.
    """
    slots = 2 * 4
    provider.configure(
        idempotency="ignore", latency_ms=[1, 3], provider_latency_ms={"acme": [20000, 20000]}
    )
    # The tools' timeout outlasts the sleep: the calls are cut off by the kill only.
    catalog = none_catalog(tmp_path, timeout_s=120.0)
    csv_path = first_rows(30, tmp_path / "leads30.csv")
    home = tmp_path / "home"
    log = tmp_path / "worker.log"
    env = {"PLAYLINE_CATALOG": str(catalog)}
    options = RunOptions(
        chunk_size=5, max_chunks_in_flight=2, row_concurrency=4, heartbeat_timeout_s=3
    )

    first = start_worker_process(temporal_address, task_queue, home, log, env)
    handle = await client.start_workflow(
        "enrich_leads",
        args=[{"csv_path": str(csv_path)}, options],
        id=new_id("amb-kill"),
        task_queue=task_queue,
        result_type=PlayRunResult,
    )
    try:
        at_kill: dict[str, Any] | None = None
        for _ in range(1200):  # a bound for a stuck run, not a timing assertion
            ledger = await asyncio.to_thread(provider.ledger)
            in_flight = ledger["in_flight_idem"]
            if ledger["in_flight"] == len(in_flight) == slots:
                sent, tools = await sent_unsettled(home)
                if sent == in_flight and tools <= ACME_TOOLS:
                    at_kill = ledger
                    break
            await asyncio.sleep(0.1)
        assert at_kill is not None, f"the calls never filled the slots: {log.read_text()}"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        provider.configure(provider_latency_ms={})
        killed = set(at_kill["in_flight_idem"])
        assert len(killed) == slots
        assert at_kill["charged"] > 0  # firmo calls were answered and paid before the kill

        second = start_worker_process(temporal_address, task_queue, home, log, env)
        try:
            result = await asyncio.wait_for(handle.result(), 180)
        finally:
            second.terminate()
            second.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)

    ledger = await asyncio.to_thread(provider.wait_idle, 90)
    calls = provider.calls()
    # Nothing paid twice or sent twice; the calls cut off by the kill were charged,
    # never answered, and are the only such calls.
    assert ledger["double_charged"] == 0
    assert_sent_once(calls)
    assert ledger["received"] == ledger["charged"] == len(calls)
    assert ledger["charged_unanswered_by_reason"] == {"client_gone": slots}
    assert unanswered(calls) == killed

    # The run counted exactly those as ambiguous, and left exactly their receipts so.
    assert result.stats.calls_ambiguous == slots
    found = receipts(home)
    assert {r["status"] for r in found} <= {"completed", "ambiguous"}
    assert digests(found, "ambiguous") == killed

    # Every row once: ok, or failed (one per killed call: acme calls are per person).
    (dataset,) = result.datasets
    ds = dataset.stats
    assert ds.rows_ok + ds.rows_failed == dataset.admitted == 30
    assert ds.rows_failed == ds.rows_ambiguous == slots
    await export_rows(home, dataset.run_ref, tmp_path / "out.csv")
    rows = read_csv_rows(tmp_path / "out.csv")
    assert sorted(r["lead_id"] for r in rows) == sorted(
        r["lead_id"] for r in read_csv_rows(csv_path)
    )
    assert sum(1 for r in rows if r["_error"].startswith(AMBIGUOUS_ERROR)) == slots
