"""A run's receipts as its audit reads them (``ReceiptStore.run_receipts``), on SQLite
and PostgreSQL: what the run's rows paid (each answer's own charge, not a receipt's
total over generations), what it left ambiguous, what it sent again, and what its play
paid outside rows."""

from __future__ import annotations

from playline.stores.backends import Stores
from playline.stores.receipts import ClaimRequest, ClaimStatus
from tests.integration.conftest import Clock

RUN = "play-1/"
OWNER = "play-1/dataset/leads/chunk-0#1"


async def test_a_runs_receipts_count_its_own_payments_only(stores: Stores, clock: Clock) -> None:
    store = stores.receipts
    # An earlier run paid k1 (3 credits); this run re-pays it at a new generation (1).
    await store.claim([ClaimRequest(key="k1", tool_id="t")], owner="old/x#1", lease_id="A", ttl_s=5)
    await store.complete("k1", lease_id="A", result={"v": 0}, credits=3.0, paid_by="old/r#0")
    claim = ClaimRequest(key="k1", tool_id="t", force=True, force_token="play-1")
    [again] = await store.claim([claim], owner=OWNER, lease_id="B", ttl_s=5)
    assert again.status is ClaimStatus.CLAIMED and again.generation == 1
    await store.complete("k1", lease_id="B", result={"v": 1}, credits=1.0, paid_by="play-1/r/l#0")
    # A row's call that may have been charged without an answer: ambiguous.
    await store.claim([ClaimRequest(key="k2", tool_id="t")], owner=OWNER, lease_id="B", ttl_s=5)
    await store.mark_sent(["k2"], lease_id="B", ttl_s=5)
    await store.mark_ambiguous("k2", lease_id="B", reason="timed out")
    # A call sent, never answered, taken over after its lease lapsed and sent again (a
    # provider that de-duplicates): counted as re-sent.
    await store.claim([ClaimRequest(key="k3", tool_id="u")], owner="w#1", lease_id="C", ttl_s=5)
    await store.mark_sent(["k3"], lease_id="C", ttl_s=5)
    clock.now += 10
    [taken] = await store.claim(
        [ClaimRequest(key="k3", tool_id="u")], owner=OWNER, lease_id="D", ttl_s=5
    )
    assert taken.status is ClaimStatus.CLAIMED and taken.resent
    await store.complete("k3", lease_id="D", result={"v": 3}, credits=2.0, paid_by="play-1/r/l#1")
    # The play's own call (ctx.tool): paid outside rows.
    await store.claim([ClaimRequest(key="k4", tool_id="u")], owner=OWNER, lease_id="E", ttl_s=5)
    await store.complete("k4", lease_id="E", result={"v": 4}, credits=0.5, paid_by="play-1/7")
    # Another run's receipt is not this run's.
    await store.claim(
        [ClaimRequest(key="k5", tool_id="u")], owner="play-10/x", lease_id="F", ttl_s=5
    )
    await store.complete("k5", lease_id="F", result={}, credits=9.0, paid_by="play-10/r#0")

    found = {tool.tool_id: tool for tool in await store.run_receipts(RUN)}
    assert set(found) == {"t", "u"}
    t, u = found["t"], found["u"]
    assert (t.paid, t.credits, t.ambiguous, t.resent, t.outside_rows) == (1, 1.0, 1, 0, 0.0)
    assert (u.paid, u.credits, u.ambiguous, u.resent, u.outside_rows) == (2, 2.5, 0, 1, 0.5)
    assert await store.run_receipts("nobody/") == []


async def test_a_runs_calls_one_by_one_name_their_key_row_and_attempt(
    stores: Stores, clock: Clock
) -> None:
    """``run_calls``: what the reconciliation names, call by call, on both databases."""
    store = stores.receipts
    await store.claim([ClaimRequest(key="k1", tool_id="t")], owner=OWNER, lease_id="A", ttl_s=5)
    await store.complete(
        "k1",
        lease_id="A",
        result={"v": 1},
        credits=2.0,
        paid_by="play-1/r/l#0",
        credits_source="provider",
    )
    await store.claim([ClaimRequest(key="k2", tool_id="t")], owner=OWNER, lease_id="A", ttl_s=5)
    await store.mark_sent(["k2"], lease_id="A", ttl_s=5)
    await store.mark_ambiguous("k2", lease_id="A", reason="dropped")
    # An earlier run's answer this run only read: not its call.
    await store.claim([ClaimRequest(key="k3", tool_id="t")], owner="old/x#1", lease_id="B", ttl_s=5)
    await store.complete("k3", lease_id="B", result={}, credits=1.0, paid_by="old/r#0")

    calls = {call.key: call for call in await store.run_calls(RUN)}
    assert set(calls) == {"k1", "k2"}
    paid, lost = calls["k1"], calls["k2"]
    assert (paid.status, paid.credits, paid.credits_source) == ("completed", 2.0, "provider")
    assert (paid.paid_by, paid.tool_id) == ("play-1/r/l#0", "t")
    assert (lost.status, lost.credits, lost.paid_by, lost.owner) == ("ambiguous", 0.0, None, OWNER)
