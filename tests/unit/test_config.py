"""``Settings``: every variable read once, overrides that ignore ``None``, no process mutation."""

from __future__ import annotations

import os
from pathlib import Path

from playline.config import Settings


def test_from_env_reads_every_variable() -> None:
    settings = Settings.from_env(
        {
            "TEMPORAL_ADDRESS": "temporal.example:7233",
            "PLAYLINE_HOME": "/var/lib/pl",
            "PLAYLINE_CATALOG": "/etc/pl/catalog.toml",
            "PLAYLINE_PG_DSN": "postgresql://db/pl",
            "PLAYLINE_FLEET_PREFIX": "fleet_",
            "PLAYLINE_PACING": "off",
            "PLAYLINE_UI_URL": "https://ui.example",
            "ACME_API_KEY": "k",
        }
    )
    assert settings.temporal_address == "temporal.example:7233"
    assert settings.home == Path("/var/lib/pl")
    assert settings.catalog_path == "/etc/pl/catalog.toml"
    assert settings.pg_dsn == "postgresql://db/pl"
    assert settings.fleet_table_prefix == "fleet_"
    assert settings.pacing == "off"
    assert settings.ui_url == "https://ui.example"
    assert settings.environ["ACME_API_KEY"] == "k"
    assert settings.receipts_path == Path("/var/lib/pl/receipts.db")


def test_defaults_when_nothing_is_set() -> None:
    settings = Settings.from_env({})
    assert settings.temporal_address == "localhost:7233"
    assert settings.home == Path(".playline")
    assert settings.catalog_path is None and settings.pg_dsn is None
    assert settings.pacing == "governor"
    assert settings.fleet_table_prefix == "playline_"


def test_overrides_apply_unless_none() -> None:
    base = Settings.from_env({"PLAYLINE_HOME": "/a", "TEMPORAL_ADDRESS": "x:1"})
    assert Settings.from_env({"PLAYLINE_HOME": "/a"}, home=None).home == Path("/a")
    changed = base.with_overrides(home="/b", temporal_address=None)
    assert changed.home == Path("/b") and changed.temporal_address == "x:1"


def test_with_environ_extends_the_snapshot_not_the_process() -> None:
    settings = Settings.from_env({}).with_environ(PLAYLINE_TEST_ONLY_KEY="v")
    assert settings.environ["PLAYLINE_TEST_ONLY_KEY"] == "v"
    assert "PLAYLINE_TEST_ONLY_KEY" not in os.environ
