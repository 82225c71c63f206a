"""``playline providers list|show`` as a user runs it: a real subprocess, a catalog file,
the real PostgreSQL fleet store for the limits in force.

The last balance read is checked where a run takes it, in ``tests/e2e/test_reconcile.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.pg import pg_schema

CATALOG = """
include = ["hunter", "findymail", "apollo"]

[providers.hunter]
base_url = "https://api.hunter.io"
auth = { env = "HUNTER_API_KEY", header = "X-API-KEY" }
idempotency = "none"
pacing = { rps = 15, burst = 5, per_minute = 500, max_concurrency = 8 }
credit_price = 0.034
balance = { path = "/v2/account", used = "data.requests.searches.used" }
"""


async def providers(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "playline",
        "providers",
        *args,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


async def test_list_and_show_say_plan_limits_price_contract_and_balance(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)
    home = tmp_path / "home"
    listed = await providers("list", "--json", "--catalog", str(path), home=home)
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    by_name = {p["name"]: p for p in document["providers"]}
    assert sorted(by_name) == ["apollo", "findymail", "hunter"]
    # Apollo's preset names its plans; the one in force sets the limits.
    apollo = by_name["apollo"]
    assert apollo["plan"] == "free"
    assert apollo["plans"] == ["basic", "free", "organization", "professional"]
    assert apollo["limits"][0]["limits"]["per_day"] == 600
    hunter = by_name["hunter"]
    assert hunter["limits"][0]["limits"] == {
        "rps": 15,
        "burst": 5,
        "per_minute": 500,
        "per_hour": None,
        "per_day": None,
        "max_concurrency": 8,
    }
    assert (hunter["credit_price"], hunter["currency"]) == (0.034, "USD")
    assert hunter["idempotency"] == "none"
    assert hunter["balance"] == {"method": "GET", "path": "/v2/account", "kind": "used"}
    assert hunter["last_balance"] is None  # no run read it yet
    [tool] = [t for t in hunter["tools"] if t["id"] == "hunter_email_finder"]
    assert tool["billing_rule"] == "per_hit"
    assert tool["billing"] == "1 per hit (email)" and tool["idempotency"] == "none"
    assert by_name["findymail"]["balance"] is None
    assert any("no fleet store" in note for note in document["notes"])
    shown = await providers("show", "hunter", "--catalog", str(path), home=home)
    assert shown.returncode == 0, shown.stderr
    assert "limits in force for hunter: 15 rps, burst 5, 500/minute, 8 in flight" in shown.stdout
    assert "price: 0.034 USD per credit" in shown.stdout
    assert "balance: GET /v2/account (used); never read" in shown.stdout
    assert "billing: 1 per hit (email) (per_hit)" in shown.stdout
    plan = await providers("show", "apollo", "--catalog", str(path), home=home)
    assert "  plan: free: Free: 50 requests/min, 200/h, 600/day (plans: basic, free," in plan.stdout


async def test_unknown_names_are_one_line_with_a_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)
    home = tmp_path / "home"
    typo = await providers("show", "huntr", "--catalog", str(path), home=home)
    assert typo.returncode == 1
    lines = (typo.stdout + typo.stderr).strip().splitlines()
    assert lines == [
        "error: unknown provider 'huntr'; did you mean 'hunter'? (the catalog declares: "
        "apollo, findymail, hunter)"
    ]
    tool = await providers("show", "hunter_email_finder", "--catalog", str(path), home=home)
    assert tool.returncode == 1
    assert "is a tool of provider 'hunter'" in tool.stdout + tool.stderr


async def test_the_limits_in_force_include_what_the_fleet_set(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)
    home = tmp_path / "home"
    async with pg_schema() as url:
        env = {"PLAYLINE_STORE_URL": url}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "playline", "limits", "set", "hunter", "--rps", "3",
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        shown = await providers(
            "show", "hunter", "--json", "--catalog", str(path), home=home, **env
        )
    assert shown.returncode == 0, shown.stderr
    [limits] = json.loads(shown.stdout)["limits"]
    assert limits["limits"]["rps"] == 3  # the fleet's, over the catalog's 15
    assert limits["limits"]["per_minute"] == 500  # the catalog's, not set fleet-wide
    assert limits["set_fleet_wide"] == {"rps": 3}
