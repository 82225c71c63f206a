"""docker/ holds together without a Docker engine: each service against what it runs.

There is no Docker engine here, so the compose file is read as data and every service
is checked against playline itself: the worker's and provider server's commands parse
with their own argument parsers, the worker's environment holds only variables
``Settings`` reads and yields a store, a Temporal address and a provider URL that name
services of this file, dependencies wait on health checks or finished one-shot jobs,
the images are current and pinned, every published port is bound to the host's
loopback, and no password is written in the file: each comes from a required variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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
#: What the operator exports before ``docker compose up`` (docker/README.md).
OPERATOR_ENV = {"PLAYLINE_DB_PASSWORD": "pl-secret-from-env", "TEMPORAL_DB_PASSWORD": "t-secret"}
#: ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` as compose interpolates them.
VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?::(?P<op>[-?])(?P<arg>[^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    return document


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


class MissingVariable(Exception):
    pass


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """``text`` as compose reads it with ``env`` set: defaults for unset ``${VAR:-x}``,
    an error for an unset ``${VAR:?message}`` (compose refuses to start)."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if env.get(name):
            return env[name]
        if op == "?":
            raise MissingVariable(f"required variable {name} is missing a value: {arg}")
        return arg if op == "-" else ""

    return VARIABLE.sub(one, text)


def environment(service: dict[str, Any], env: Mapping[str, str] = OPERATOR_ENV) -> dict[str, str]:
    """A service's environment as compose gives it, the operator's variables set."""
    return {k: interpolate(str(v), env) for k, v in (service.get("environment") or {}).items()}


def published(service: dict[str, Any]) -> list[tuple[str, str]]:
    """Each published port as ``(host address, "host port:container port")``."""
    found = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):  # the long syntax
            found.append((str(port.get("host_ip", "")), f"{port['published']}:{port['target']}"))
            continue
        parts = str(port).rsplit(":", 2)
        found.append((parts[0] if len(parts) == 3 else "", ":".join(parts[-2:])))
    return found


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
    init = (DOCKER / "postgres-init" / "01-playline.sh").read_text()
    assert "CREATE DATABASE playline" in init
    assert "PASSWORD :'password'" in init and '-v password="$PLAYLINE_DB_PASSWORD"' in init
    assert (DOCKER / "postgres-init" / "01-playline.sh").stat().st_mode & 0o111, "not executable"


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
    # The store's database and user are the ones the init script creates, with the
    # password the operator exported.
    pw = OPERATOR_ENV["PLAYLINE_DB_PASSWORD"]
    assert f"playline:{pw}@postgresql:5432/playline" in settings.store
    assert environment(all_services["postgresql"])["PLAYLINE_DB_PASSWORD"] == pw


def test_every_published_port_is_bound_to_loopback_only(compose: dict[str, Any]) -> None:
    ports = {name: published(service) for name, service in services(compose).items()}
    assert {name for name, found in ports.items() if found} == {
        "postgresql",
        "temporal",
        "temporal-ui",
        "provider-server",  # its /_admin endpoints included
    }
    for name, found in ports.items():
        for host, mapping in found:
            assert host == "127.0.0.1", f"{name} publishes {mapping} on {host or 'every address'}"


def test_no_password_is_written_in_the_file_each_is_a_required_variable(
    compose: dict[str, Any],
) -> None:
    text = (DOCKER / "docker-compose.yml").read_text()
    for literal in ("playline:playline@", "temporal:temporal", "PASSWORD: temporal"):
        assert literal not in text
    passwords = {
        (name, key): str(value)
        for name, service in services(compose).items()
        for key, value in (service.get("environment") or {}).items()
        if "PASSWORD" in key or key.endswith("PWD")
    }
    assert len(passwords) == 4, passwords  # postgres (x2), schema job, server
    for where, value in passwords.items():
        match = VARIABLE.fullmatch(value)
        assert match and match["op"] == "?", f"{where} is not a required variable: {value}"
    url = services(compose)["worker"]["environment"]["PLAYLINE_STORE_URL"]
    assert "${PLAYLINE_DB_PASSWORD:?" in url
    # Without either variable compose refuses to start, naming the one to set.
    for variable in OPERATOR_ENV:
        partial = {k: v for k, v in OPERATOR_ENV.items() if k != variable}
        users = [s for s in services(compose).values() if variable in str(s.get("environment"))]
        assert users, variable
        for service in users:
            with pytest.raises(MissingVariable, match=f"missing a value: set {variable}"):
                environment(service, partial)
    docs = (DOCKER / "README.md").read_text() + (
        DOCKER / "postgres-init" / "01-playline.sh"
    ).read_text()
    assert "playline:playline" not in docs and "PASSWORD 'playline'" not in docs


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
