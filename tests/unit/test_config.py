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
            "PLAYLINE_STORE_URL": "sqlite:////srv/pl",
            "PLAYLINE_FLEET_PREFIX": "fleet_",
            "PLAYLINE_PACING": "off",
            "PLAYLINE_UI_URL": "https://ui.example",
            "PLAYLINE_SHEETS_URL": "http://sheets.example:8234",
            "PLAYLINE_UI_TOKEN": "sheet-token",
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
    assert settings.sheets_url == "http://sheets.example:8234"
    assert settings.ui_token == "sheet-token"
    assert "sheet-token" not in repr(settings) and "sheet-token" in settings.secret_values()
    assert settings.environ["ACME_API_KEY"] == "k"
    assert settings.store_url == "sqlite:////srv/pl"
    assert settings.receipts_path == Path("/srv/pl/receipts.db")


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


def test_the_store_defaults_to_sqlite_under_home() -> None:
    settings = Settings.from_env({"PLAYLINE_HOME": "/var/lib/pl"})
    assert settings.store == "sqlite:////var/lib/pl"
    assert settings.sqlite_dir == Path("/var/lib/pl") and not settings.store_is_postgres
    relative = Settings.from_env({})
    assert relative.store == "sqlite:///.playline" and relative.sqlite_dir == Path(".playline")
    assert relative.fleet_dsn is None and relative.deprecations() == []


def test_a_sqlite_store_url_moves_the_files_away_from_home() -> None:
    settings = Settings.from_env(
        {"PLAYLINE_HOME": "/home/pl", "PLAYLINE_STORE_URL": "sqlite:////srv/stores"}
    )
    assert settings.receipts_path == Path("/srv/stores/receipts.db")
    assert settings.sheet_path == Path("/srv/stores/sheet.db")
    assert settings.fixture_index_dir == Path("/home/pl/fixtures")  # worker-local, stays home


def test_a_postgres_store_also_paces_the_fleet() -> None:
    url = "postgresql://pl@db/pl"
    settings = Settings.from_env({"PLAYLINE_STORE_URL": url})
    assert settings.store_is_postgres and settings.sqlite_dir is None
    assert settings.fleet_dsn == url and settings.deprecations() == []


def test_pg_dsn_is_a_deprecated_alias_that_says_what_to_set() -> None:
    alone = Settings.from_env({"PLAYLINE_PG_DSN": "postgresql://db/pacing"})
    assert alone.fleet_dsn == "postgresql://db/pacing"
    assert not alone.store_is_postgres  # the stores stay where they were
    [warning] = alone.deprecations()
    assert "PLAYLINE_PG_DSN is deprecated" in warning and "PLAYLINE_STORE_URL" in warning
    both = Settings.from_env(
        {"PLAYLINE_PG_DSN": "postgresql://db/pacing", "PLAYLINE_STORE_URL": "postgresql://db/pl"}
    )
    assert both.fleet_dsn == "postgresql://db/pl"
    [warning] = both.deprecations()
    assert "ignored" in warning and "unset PLAYLINE_PG_DSN" in warning


def test_every_variable_read_is_listed_and_documented() -> None:
    """``ENV_VARIABLES`` (what deployments are checked against) is what from_env reads."""
    import re

    import playline.config as config

    source = Path(config.__file__).read_text()
    read = set(re.findall(r'env\.get\("([A-Z_]+)"\)', source))
    assert read and read <= set(config.ENV_VARIABLES)
    for name in read:
        assert f"``{name}``" in (config.__doc__ or ""), f"{name} is not in the table"
