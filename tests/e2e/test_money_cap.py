"""``playline run --max-spend`` end to end: a run capped in money waits at its cap and
goes on when ``runs budget --add-spend`` raises it.

Real Temporal dev server, an in-process worker on the demo catalog (acme's credits
cost 0.012 USD), real SQLite stores and the real local provider server, whose ledger
is the judge: what the run's money cap spent is the provider's charge times the price,
and never more than the cap.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys

import pytest

from playline.calls.catalog import Catalog
from playline.package_data import DEMO_CATALOG
from tests.conftest import REPO
from tests.e2e.test_cli import playline
from tests.e2e.test_run_progress import until_waiting
from tests.plays import lead, write_csv

PRICE = Catalog.from_toml(DEMO_CATALOG).providers["acme"].credit_price  # t_tool_column's tool
CAP = 0.05  # four acme credits (0.048) fit, a fifth does not


def _money(text: str, what: str) -> tuple[float, float]:
    """``(spent, cap)`` of ``... X of Y USD spent`` in ``text``."""
    found = re.search(r"([\d.,]+) of ([\d.,]+) USD spent", text)
    assert found, f"{what}: {text}"
    return float(found[1].replace(",", "")), float(found[2].replace(",", ""))


async def test_a_run_capped_in_money_waits_at_the_cap_and_goes_on_when_raised(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    assert PRICE is not None
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(10)])
    play_id = f"money-{task_queue}"
    common = ["--address", temporal_address, "--task-queue", task_queue]
    async with worker():
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "playline",
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--max-spend",
            str(CAP),
            "--id",
            play_id,
            *common,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            state = await until_waiting(client, play_id)
            # Waiting at the cap: what it says is the provider's charge times the price.
            charged = provider.ledger()["credits_by_provider"]["acme"]
            assert state.budget_wait is not None
            assert f"`playline runs budget {play_id} --add-spend N` to go on" in state.budget_wait
            spent, cap = _money(state.budget_wait, "the wait")
            assert cap == CAP
            assert spent == pytest.approx(charged * PRICE, abs=1e-9)
            assert charged * PRICE <= CAP + 1e-9
            assert charged * PRICE + PRICE > CAP  # one more credit would not fit
            assert charged < 10  # it did wait: rows are held

            raised = await playline(
                "runs", "budget", play_id, "--add-spend", "1", *common, home=home
            )
            assert raised.returncode == 0, raised.stderr
            assert f"{play_id}: money cap 1.05," in raised.stdout, raised.stdout
            out, err = await asyncio.wait_for(proc.communicate(), 90)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    stdout, stderr = out.decode(), err.decode()
    assert proc.returncode == 0, stderr
    assert "rows: 10 ok, 0 failed" in stdout, stdout
    assert f"`playline runs budget {play_id} --add-spend N` to go on" in stderr, stderr
    charged = provider.ledger()["credits_by_provider"]["acme"]
    # The summary: credits with money beside them, and the money cap as the ledger holds it.
    assert f"credits spent: {charged:g} (≈ {charged * PRICE:,.2f} USD)" in stdout, stdout
    (cap_line,) = [line for line in stdout.splitlines() if "money cap:" in line]
    spent, cap = _money(cap_line, "the summary")
    assert cap == pytest.approx(CAP + 1)
    assert spent == pytest.approx(charged * PRICE, abs=1e-9)


async def test_max_spend_is_refused_in_one_line_when_a_provider_has_no_price(
    provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    """A worker whose catalog gives acme no price: nothing is run, one line, exit 2."""
    unpriced = tmp_path / "catalog.toml"
    unpriced.write_text(
        "\n".join(
            line
            for line in DEMO_CATALOG.read_text().splitlines()
            if not line.startswith("credit_price")
        )
    )
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(3)])
    common = ["--address", temporal_address, "--task-queue", task_queue]
    async with worker(catalog_path=str(unpriced)):
        refused = await playline(
            "run", "t_tool_column", "--csv", str(csv_path), "--max-spend", "5", *common, home=home
        )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = (refused.stdout + refused.stderr).splitlines()
    said = [line for line in lines if line.startswith("error:")]
    assert said == [
        "error: --max-spend 5: provider acme has no credit_price in the catalog, so its calls "
        "cannot be counted in money; state its price or cap the run with --max-credits"
    ], said
    assert provider.ledger()["received"] == 0
