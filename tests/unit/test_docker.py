"""docker/ holds together without a Docker engine: each service against what it runs.

There is no Docker engine here, so the compose file is read as data and every service
is checked against playline itself: the worker's and provider server's commands parse
with their own argument parsers, the worker's environment holds only variables
``Settings`` reads and yields a store, a Temporal address and a provider URL that name
services of this file, dependencies wait on health checks or finished one-shot jobs,
and the images are current and pinned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import playline
from playline.cli import build_parser
from playline.config import ENV_VARIABLES, Settings
from playline.provider_server.__main__ import build_parser as provider_parser
from tests.conftest import REPO

DOCKER = REPO / "docker"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    return document


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment with ``${VAR:-default}`` resolved to its default."""
    env = service.get("environment") or {}
    resolved = {}
    for key, value in env.items():
        text = str(value)
        if text.startswith("${") and ":-" in text:
            text = text.split(":-", 1)[1].rstrip("}")
        resolved[key] = text
    return resolved


def test_every_image_is_pinned_and_temporal_uses_current_images(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        image = service.get("image")
        assert image, f"{name} names no image"
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest", f"{name}: {image} is not pinned"
        assert "auto-setup" not in image, f"{name}: temporalio/auto-setup is deprecated"
    names = {s["image"].split(":")[0] for s in services(compose).values()}
    assert {"temporalio/server", "temporalio/admin-tools", "temporalio/ui"} <= names


def test_playline_images_are_this_version_and_built_from_this_repository(
    compose: dict[str, Any],
) -> None:
    ours = {n: s for n, s in services(compose).items() if s["image"].startswith("playline:")}
    assert set(ours) == {"provider-server", "worker"}
    assert {s["image"] for s in ours.values()} == {f"playline:{playline.__version__}"}
    builds = [s["build"] for s in ours.values() if "build" in s]
    assert builds and all(Path(DOCKER, b["context"], b["dockerfile"]).is_file() for b in builds)


def test_starts_wait_on_health_or_on_finished_setup_jobs(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    for name, service in all_services.items():
        for needed, rule in (service.get("depends_on") or {}).items():
            assert needed in all_services, f"{name} depends on unknown {needed}"
            condition = rule["condition"]
            target = all_services[needed]
            if condition == "service_healthy":
                assert "healthcheck" in target, f"{needed} has no health check"
            else:
                assert condition == "service_completed_successfully", (name, needed)
                assert str(target["restart"]).startswith("on-failure"), needed


def test_long_running_services_restart_and_report_health(compose: dict[str, Any]) -> None:
    one_shot = {"temporal-schema", "temporal-setup"}
    for name, service in services(compose).items():
        if name in one_shot:
            continue
        assert service.get("restart") == "unless-stopped", name
        assert "healthcheck" in service, name


def test_setup_scripts_and_init_files_are_mounted_from_this_directory(
    compose: dict[str, Any],
) -> None:
    for name, service in services(compose).items():
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).exists(), f"{name} mounts a missing {source}"
    init = (DOCKER / "postgres-init" / "01-playline.sql").read_text()
    assert "CREATE DATABASE playline" in init


def test_the_commands_parse_with_playline_and_the_provider_server(
    compose: dict[str, Any],
) -> None:
    all_services = services(compose)
    worker = build_parser().parse_args(all_services["worker"]["command"])
    assert worker.command == "worker"
    provider_cmd = all_services["provider-server"]["command"]
    assert provider_cmd[0] == "provider-server"
    provider = provider_parser().parse_args(provider_cmd[1:])
    assert provider.host == "0.0.0.0" and provider.port == 8787


def test_the_worker_environment_is_what_settings_read_and_names_compose_services(
    compose: dict[str, Any],
) -> None:
    all_services = services(compose)
    env = environment(all_services["worker"])
    ours = [k for k in env if k.startswith(("PLAYLINE_", "TEMPORAL_"))]
    unknown = [k for k in ours if k not in ENV_VARIABLES and k != "PLAYLINE_PROVIDER_URL"]
    assert not unknown, f"the worker is given variables playline never reads: {unknown}"
    settings = Settings.from_env(env)
    assert settings.store_is_postgres
    store_host = settings.store.split("@", 1)[1].split(":")[0]
    assert store_host in all_services
    temporal_host, _, port = settings.temporal_address.partition(":")
    assert temporal_host in all_services and port == "7233"
    assert settings.metrics_host == "0.0.0.0" and settings.metrics_port == 9464
    assert str(settings.metrics_port) in all_services["worker"]["healthcheck"]["test"][-1]
    assert settings.task_queue == "playline"
    provider_host = env["PLAYLINE_PROVIDER_URL"].split("//")[1].split(":")[0]
    assert provider_host in all_services
    # The catalog's base_url_env is the variable the compose file sets.
    assert "PLAYLINE_PROVIDER_URL" in (REPO / "playline" / "demo" / "catalog.toml").read_text()
    # The store's database and user are the ones the init script creates.
    assert "playline:playline@postgresql:5432/playline" in settings.store


def test_the_image_installs_the_package_normally_and_runs_playline() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert "pip install --no-cache-dir '.[postgres]'" in text  # not editable
    assert "-e " not in text
    assert 'ENTRYPOINT ["playline"]' in text
    assert "PLAYLINE_METRICS_HOST=0.0.0.0" in text
    for line in text.splitlines():
        if line.startswith("COPY "):
            source = line.split()[1]
            assert (REPO / source).exists(), f"the Dockerfile copies a missing {source}"
