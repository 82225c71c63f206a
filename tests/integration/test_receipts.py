"""The receipt store's contract, on a real SQLite file and a real PostgreSQL schema:
claims, leases, fencing, coalesced writes, batches, concurrent stores."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from playline.config import Settings
from playline.stores.backends import Stores, open_stores
from playline.stores.journal import JournalEntry, ResultJournal
from playline.stores.receipts import ClaimRequest, ClaimStatus, ReceiptStore
from playline.stores.receipts_ledger import ReceiptLedger
from tests.integration.conftest import Clock
from tests.old_schemas import (
    RECEIPTS_SQLITE_VERSIONS,
    STORES_POSTGRES_VERSIONS,
    old_postgres,
    old_sqlite,
    up_to,
)
from tests.pg import pg_schema


@pytest.fixture
def store(stores: Stores) -> ReceiptStore:
    return stores.receipts


async def test_claim_complete_then_hit(store: ReceiptStore) -> None:
    req = ClaimRequest(key="k1", tool_id="t")
    [first] = await store.claim([req], owner="a", lease_id="L1", ttl_s=10)
    assert first.status is ClaimStatus.CLAIMED
    assert await store.complete("k1", lease_id="L1", result={"v": 1}, credits=2.0)
    [again] = await store.claim([req], owner="b", lease_id="L2", ttl_s=10)
    assert again.status is ClaimStatus.HIT
    assert again.result == {"v": 1}
    receipt = (await store.get(["k1"]))["k1"]
    assert receipt.status == "completed" and receipt.credits == 2.0 and receipt.lease_id is None
    assert receipt.attempts == 1 and receipt.completed_at == 1_000.0


async def test_live_lease_is_held_and_expired_lease_is_reclaimed(
    store: ReceiptStore, clock: Clock
) -> None:
    req = ClaimRequest(key="k", tool_id="t")
    await store.claim([req], owner="a", lease_id="L1", ttl_s=5)
    [held] = await store.claim([req], owner="b", lease_id="L2", ttl_s=5)
    assert held.status is ClaimStatus.HELD and held.owner == "a"
    assert held.lease_expires_at == 1_005.0
    clock.now += 6  # owner a stopped renewing (crashed)
    [taken] = await store.claim([req], owner="b", lease_id="L2", ttl_s=5)
    assert taken.status is ClaimStatus.CLAIMED
    # The old owner's late completion is fenced off; the new owner's lands.
    assert not await store.complete("k", lease_id="L1", result={"late": True}, credits=1)
    assert await store.complete("k", lease_id="L2", result={"v": 2}, credits=1)
    receipt = (await store.get(["k"]))["k"]
    assert receipt.result == {"v": 2} and receipt.attempts == 2 and receipt.credits == 1


async def test_renew_extends_only_the_holders_lease(store: ReceiptStore, clock: Clock) -> None:
    reqs = [ClaimRequest(key=k, tool_id="t") for k in ("a", "b")]
    await store.claim(reqs, owner="o", lease_id="L1", ttl_s=5)
    clock.now += 4
    assert await store.renew(["a", "b", "never-claimed"], lease_id="L1", ttl_s=5) == [
        True,
        True,
        False,
    ]
    clock.now += 4  # 8s after the claim, 4s after the renewal: still held
    [held] = await store.claim([reqs[0]], owner="x", lease_id="L9", ttl_s=5)
    assert held.status is ClaimStatus.HELD
    assert await store.renew(["a"], lease_id="WRONG", ttl_s=5) == [False]


async def test_stale_and_force_bypass_the_cache(store: ReceiptStore, clock: Clock) -> None:
    await store.claim([ClaimRequest(key="k", tool_id="t")], owner="a", lease_id="L1", ttl_s=5)
    await store.complete("k", lease_id="L1", result=1, credits=1)
    clock.now += 100
    [fresh] = await store.claim(
        [ClaimRequest(key="k", tool_id="t", stale_after_seconds=1000)],
        owner="b",
        lease_id="L2",
        ttl_s=5,
    )
    assert fresh.status is ClaimStatus.HIT
    [stale] = await store.claim(
        [ClaimRequest(key="k", tool_id="t", stale_after_seconds=10)],
        owner="b",
        lease_id="L2",
        ttl_s=5,
    )
    assert stale.status is ClaimStatus.CLAIMED
    await store.complete("k", lease_id="L2", result=2, credits=1)
    [forced] = await store.claim(
        [ClaimRequest(key="k", tool_id="t", force=True)], owner="c", lease_id="L3", ttl_s=5
    )
    assert forced.status is ClaimStatus.CLAIMED


async def test_failed_receipt_keeps_its_error_and_is_retried(store: ReceiptStore) -> None:
    req = ClaimRequest(key="k", tool_id="t")
    await store.claim([req], owner="a", lease_id="L1", ttl_s=5)
    assert await store.fail("k", lease_id="L1", error="ProviderRejected: 404")
    assert not await store.fail("k", lease_id="L1", error="twice")  # no longer held
    receipt = (await store.get(["k"]))["k"]
    assert receipt.status == "failed" and receipt.error == "ProviderRejected: 404"
    [retry] = await store.claim([req], owner="b", lease_id="L2", ttl_s=5)
    assert retry.status is ClaimStatus.CLAIMED
    assert (await store.get(["k"]))["k"].attempts == 2


async def test_released_leases_are_free_at_once(store: ReceiptStore) -> None:
    reqs = [ClaimRequest(key=k, tool_id="t") for k in ("a", "b")]
    await store.claim(reqs, owner="o", lease_id="L1", ttl_s=60)
    await store.release(["a"], lease_id="L1")
    await store.release(["b"], lease_id="NOT-MINE")
    found = await store.claim(reqs, owner="x", lease_id="L2", ttl_s=60)
    assert [o.status for o in found] == [ClaimStatus.CLAIMED, ClaimStatus.HELD]


async def test_concurrent_completions_are_each_fenced_and_all_recorded(store: ReceiptStore) -> None:
    """Hundreds of completions and failures in flight at once (one group commit or a few):
    every caller gets its own answer, and only the lease holder's result lands."""
    keys = [f"k{i}" for i in range(300)]
    await store.claim([ClaimRequest(k, "t") for k in keys], owner="o", lease_id="L1", ttl_s=60)
    answers = await asyncio.gather(
        *(
            store.complete(k, lease_id="L1" if i % 3 else "WRONG", result={"i": i}, credits=1)
            if i % 5
            else store.fail(k, lease_id="L1", error=f"e{i}")
            for i, k in enumerate(keys)
        )
    )
    expected = [(i % 3 != 0) if i % 5 else True for i in range(len(keys))]
    assert answers == expected
    receipts = await store.get(keys)
    for i, key in enumerate(keys):
        receipt = receipts[key]
        if i % 5 == 0:
            assert (receipt.status, receipt.error) == ("failed", f"e{i}")
        elif i % 3:
            assert (receipt.status, receipt.result, receipt.credits) == ("completed", {"i": i}, 1)
        else:
            assert receipt.status == "running" and receipt.lease_id == "L1"


async def test_two_attempts_claiming_one_key_in_the_same_tick_get_one_lease(
    store: ReceiptStore,
) -> None:
    req = ClaimRequest("same", "t")
    one, two = await asyncio.gather(
        store.claim([req, ClaimRequest("a", "t")], owner="one", lease_id="L1", ttl_s=30),
        store.claim([req, ClaimRequest("b", "t")], owner="two", lease_id="L2", ttl_s=30),
    )
    assert [one[0].status, two[0].status] == [ClaimStatus.CLAIMED, ClaimStatus.HELD]
    assert two[0].owner == "one"
    assert one[1].status is two[1].status is ClaimStatus.CLAIMED
    assert (await store.get(["same"]))["same"].lease_id == "L1"


async def test_a_batch_is_recorded_taken_over_and_completed_with_its_members(
    store: ReceiptStore, clock: Clock
) -> None:
    members = ["m1", "m2", "m3"]
    await store.claim([ClaimRequest(k, "t") for k in members], owner="a", lease_id="L1", ttl_s=5)
    request = {"items": [{"n": 1}, {"n": 2}, {"n": 3}]}
    assert not await store.open_batch(
        "agg", tool_id="t", member_keys=members, request=request, owner="b", lease_id="L2", ttl_s=5
    )  # members held by another lease: nothing recorded
    assert await store.open_batch(
        "agg", tool_id="t", member_keys=members, request=request, owner="a", lease_id="L1", ttl_s=5
    )
    held = await store.claim_batch("agg", owner="b", lease_id="L2", ttl_s=5)
    assert held.status is ClaimStatus.HELD and held.member_keys == members
    clock.now += 6  # the sender crashed
    taken = await store.claim_batch("agg", owner="b", lease_id="L2", ttl_s=5)
    assert (taken.status, taken.request) == (ClaimStatus.CLAIMED, request)
    assert not await store.complete_batch(
        "agg",
        lease_id="L1",
        results={k: {"k": k} for k in members},
        member_credits=dict.fromkeys(members, 1.0),
    )  # fenced off: the crashed sender's late answer
    assert await store.complete_batch(
        "agg",
        lease_id="L2",
        results={k: {"k": k} for k in members},
        member_credits=dict.fromkeys(members, 2.0),
    )
    receipts = await store.get(["agg", *members])
    assert receipts["agg"].status == "completed" and receipts["agg"].credits == 6
    assert [receipts[k].result for k in members] == [{"k": k} for k in members]
    assert {receipts[k].credits for k in members} == {2}
    hit = await store.claim_batch("agg", owner="c", lease_id="L3", ttl_s=5)
    assert hit.status is ClaimStatus.HIT


async def test_a_failed_batch_releases_its_members_for_a_new_batch(store: ReceiptStore) -> None:
    members = ["m1", "m2"]
    await store.claim([ClaimRequest(k, "t") for k in members], owner="a", lease_id="L1", ttl_s=5)
    assert await store.open_batch(
        "agg", tool_id="t", member_keys=members, request={}, owner="a", lease_id="L1", ttl_s=5
    )
    await store.fail_batch("agg", lease_id="WRONG", error="x", release_members=True)
    assert (await store.get(["agg"]))["agg"].status == "running"  # not the holder: ignored
    await store.fail_batch("agg", lease_id="L1", error="HTTP 400", release_members=True)
    receipts = await store.get(["agg", *members])
    assert {r.status for r in receipts.values()} == {"failed"}
    again = await store.claim(
        [ClaimRequest(k, "t") for k in members], owner="b", lease_id="L2", ttl_s=5
    )
    assert {o.status for o in again} == {ClaimStatus.CLAIMED}
    assert {o.batch_key for o in again} == {None}  # released: free for a new batch


async def test_concurrent_claims_from_two_stores_have_one_winner(store_url: str) -> None:
    """Two workers' worth of connections on one store: exactly one claims each key."""
    settings = Settings(store_url=store_url)
    async with (
        await open_stores(settings, create=True) as one,
        await open_stores(settings, create=True) as two,
    ):
        reqs = [ClaimRequest(key=f"k{i}", tool_id="t") for i in range(200)]
        a, b = await asyncio.gather(
            one.receipts.claim(reqs, owner="a", lease_id="LA", ttl_s=30),
            two.receipts.claim(list(reversed(reqs)), owner="b", lease_id="LB", ttl_s=30),
        )
        for x, y in zip(a, reversed(b), strict=True):
            assert {x.status, y.status} == {ClaimStatus.CLAIMED, ClaimStatus.HELD}


# -- what a call cost, and where the figure came from -------------------------------


async def test_a_completion_keeps_where_its_credits_came_from(store: ReceiptStore) -> None:
    reqs = [ClaimRequest("p", "t"), ClaimRequest("r", "t")]
    await store.claim(reqs, owner="a", lease_id="L1", ttl_s=10)
    assert await store.complete(
        "p", lease_id="L1", result={"v": 1}, credits=1.5, credits_source="provider"
    )
    assert await store.complete("r", lease_id="L1", result={"v": 2}, credits=1)
    receipts = await store.get(["p", "r"])
    assert (receipts["p"].credits, receipts["p"].credits_source) == (1.5, "provider")
    assert (receipts["r"].credits, receipts["r"].credits_source) == (1.0, "rule")


async def test_a_hit_says_when_its_receipt_was_paid_and_what_it_cost(
    store: ReceiptStore, clock: Clock
) -> None:
    req = ClaimRequest("k", "t")
    [claimed] = await store.claim([req], owner="a", lease_id="L1", ttl_s=10)
    assert claimed.completed_at is None and claimed.credits is None
    assert await store.complete("k", lease_id="L1", result={"v": 1}, credits=2.5)
    clock.now += 3600
    [hit] = await store.claim([req], owner="b", lease_id="L2", ttl_s=10)
    assert hit.status is ClaimStatus.HIT and hit.result == {"v": 1}
    assert (hit.completed_at, hit.credits) == (1_000.0, 2.5)


async def test_batch_members_are_credited_their_own_cost_and_the_aggregate_the_sum(
    store: ReceiptStore,
) -> None:
    members = ["m1", "m2", "m3"]
    await store.claim([ClaimRequest(k, "t") for k in members], owner="a", lease_id="L1", ttl_s=5)
    assert await store.open_batch(
        "agg", tool_id="t", member_keys=members, request={}, owner="a", lease_id="L1", ttl_s=5
    )
    assert await store.complete_batch(
        "agg",
        lease_id="L1",
        results={k: {"k": k} for k in members},
        member_credits={"m1": 1.0, "m2": 0.0, "m3": 2.5},
        credits_source="provider",
    )
    receipts = await store.get(["agg", *members])
    assert [receipts[k].credits for k in members] == [1.0, 0.0, 2.5]
    assert receipts["agg"].credits == 3.5
    assert {receipts[k].credits_source for k in ["agg", *members]} == {"provider"}
    [hit] = await store.claim([ClaimRequest("m3", "t")], owner="b", lease_id="L2", ttl_s=5)
    assert (hit.status, hit.credits) == (ClaimStatus.HIT, 2.5)


async def test_a_member_already_completed_keeps_its_credits_and_is_not_summed(
    store: ReceiptStore,
) -> None:
    members = ["m1", "m2", "m3"]
    await store.claim([ClaimRequest(k, "t") for k in members], owner="a", lease_id="L1", ttl_s=5)
    assert await store.open_batch(
        "agg", tool_id="t", member_keys=members, request={}, owner="a", lease_id="L1", ttl_s=5
    )
    assert await store.complete(
        "m1", lease_id="L1", result={"first": True}, credits=4, credits_source="provider"
    )
    assert await store.complete_batch(
        "agg",
        lease_id="L1",
        results={k: {"k": k} for k in members},
        member_credits={"m1": 9.0, "m2": 1.0, "m3": 2.0},
    )
    receipts = await store.get(["agg", *members])
    assert receipts["m1"].result == {"first": True}
    assert (receipts["m1"].credits, receipts["m1"].credits_source) == (4.0, "provider")
    assert [receipts[k].credits for k in ("m2", "m3")] == [1.0, 2.0]
    assert {receipts[k].credits_source for k in ("m2", "m3")} == {"rule"}
    assert receipts["agg"].credits == 3.0  # only what this settlement completed


async def test_journalled_bulk_lines_of_both_formats_replay(
    store: ReceiptStore, tmp_path: Path
) -> None:
    """A journal line written before members had their own credits (``credits`` per
    member) replays as it meant; a new line credits each member its own."""
    for agg, lease, members in (("old", "L1", ["o1", "o2"]), ("new", "L2", ["n1", "n2"])):
        await store.claim(
            [ClaimRequest(k, "t") for k in members], owner="a", lease_id=lease, ttl_s=5
        )
        assert await store.open_batch(
            agg, tool_id="t", member_keys=members, request={}, owner="a", lease_id=lease, ttl_s=5
        )
    journal = ResultJournal(tmp_path / "journal")
    journal.directory.mkdir()
    old_line = {"key": "old", "lease_id": "L1", "result": None, "credits": 1.5,
                "results": {"o1": {"v": 1}, "o2": {"v": 2}}}  # fmt: skip
    (journal.directory / "unsettled.jsonl").write_text(json.dumps(old_line) + "\n")
    await journal.keep(
        JournalEntry(
            "new",
            "L2",
            credits=3.0,
            results={"n1": {"v": 1}, "n2": {"v": 2}},
            credits_source="provider",
            member_credits={"n1": 1.0, "n2": 2.0},
        )
    )
    assert await journal.replay(store) == 2
    receipts = await store.get(["old", "o1", "o2", "new", "n1", "n2"])
    assert [receipts[k].credits for k in ("o1", "o2", "old")] == [1.5, 1.5, 3.0]
    assert receipts["o1"].credits_source == "rule"
    assert [receipts[k].credits for k in ("n1", "n2", "new")] == [1.0, 2.0, 3.0]
    assert receipts["n2"].credits_source == "provider"
    assert not journal.pending()


async def test_a_store_of_an_older_schema_gains_the_credits_source(tmp_path: Path) -> None:
    """Receipts recorded before the source was kept read back without one; the
    upgrade is applied once when a worker opens the store."""
    path = tmp_path / "receipts.db"
    insert = (
        "INSERT INTO receipts (key, tool_id, status, result, created_at, completed_at, "
        "credits) VALUES ('k', 't', 'completed', '1', 1, 1, 2)"
    )
    old_sqlite(path, up_to(RECEIPTS_SQLITE_VERSIONS, 3), 3, [(insert, [])])
    store = ReceiptLedger.in_file(path)
    try:
        receipt = (await store.get(["k"]))["k"]
        assert (receipt.credits, receipt.credits_source) == (2, None)
    finally:
        await store.close()


async def test_a_postgres_store_of_an_older_schema_gains_the_credits_source() -> None:
    psycopg = pytest.importorskip("psycopg")
    async with pg_schema() as url:
        # The receipts as the code before playline.db left them at its version 2.
        old_postgres(url, "stores", up_to(STORES_POSTGRES_VERSIONS, 2), 2, [])
        async with await open_stores(Settings(store_url=url), create=True) as stores:
            store = stores.receipts
            await store.claim([ClaimRequest("k", "t")], owner="a", lease_id="L", ttl_s=5)
            assert await store.complete(
                "k", lease_id="L", result=1, credits=1, credits_source="provider"
            )
            assert (await store.get(["k"]))["k"].credits_source == "provider"
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT component, version FROM playline_schema ORDER BY component"
            )
            versions = dict(await cur.fetchall())
        assert versions["stores"] == 2  # the old component is left as it was
        assert versions["receipts"] == ReceiptLedger.SCHEMA.latest
