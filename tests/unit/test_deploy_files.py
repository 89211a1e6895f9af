"""deploy/compose.yaml agrees with the settings and with what scripts/image-test builds.

A cheap consistency check: scripts/image-test runs the compose file for real
(podman-compose, local images), but it is slow and needs podman; this test
catches the drift in seconds (a renamed setting, an image the script no longer
builds, a port that would collide with the machine's services).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from coldbrew.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
SCRIPT = ROOT / "scripts" / "image-test"

# ${NAME:-default}, the only interpolation the file uses.
_VAR_RE = re.compile(r"\$\{(?P<name>[A-Z_][A-Z0-9_]*):-(?P<default>[^}]*)\}")
_PORT_RE = re.compile(
    r"127\.0\.0\.1:\$\{(?P<name>[A-Z_][A-Z0-9_]*):-(?P<default>\d+)\}:(?P<target>\d+)"
)
# The images each variable must name by default: the official ones.
OFFICIAL_DEFAULTS = {
    "CB_IMAGE": "coldbrew:dev",
    "CB_RABBITMQ_IMAGE": "rabbitmq:3.13-management",
    "CB_POSTGRES_IMAGE": "postgres:16",
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def script() -> str:
    return SCRIPT.read_text(encoding="utf-8")


def _image_var(service: dict[str, Any]) -> tuple[str, str]:
    match = _VAR_RE.fullmatch(str(service["image"]))
    assert match, f"image {service['image']!r} is not ${{VAR:-default}}"
    return match["name"], match["default"]


def test_every_image_is_an_official_default_the_script_replaces(
    compose: dict[str, Any], script: str
) -> None:
    services = compose["services"]
    assert set(services) == {"rabbitmq", "rabbitmq-definitions", "postgres", "migrate", "worker"}
    for name, service in services.items():
        var, default = _image_var(service)
        assert OFFICIAL_DEFAULTS[var] == default, name
        assert f"{var}=$" in script, f"scripts/image-test does not set {var} ({name})"
    # What the script points each variable at, it builds.
    assert re.search(r"CB_IMAGE=\$APP_IMAGE\b", script)
    assert re.search(r'-f deploy/Dockerfile -t "\$APP_IMAGE"', script)
    for var, image, recipe in (
        ("CB_RABBITMQ_IMAGE", "RABBITMQ_IMAGE", "rabbitmq"),
        ("CB_POSTGRES_IMAGE", "POSTGRES_IMAGE", "postgres"),
    ):
        assert re.search(rf"{var}=\${image}\b", script)
        containerfile = f"deploy/local/{recipe}.Containerfile"
        assert f'local_image "${image}" {containerfile}' in script
        assert (ROOT / containerfile).is_file()


def test_the_app_image_is_built_from_the_dockerfile(compose: dict[str, Any]) -> None:
    for name in ("migrate", "worker"):
        build = compose["services"][name]["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == (
            DEPLOY / "Dockerfile"
        )


def test_published_ports_are_loopback_and_overridable(compose: dict[str, Any], script: str) -> None:
    seen = set()
    for service in compose["services"].values():
        for port in service.get("ports", []):
            match = _PORT_RE.fullmatch(str(port))
            assert match, f"{port!r} is not 127.0.0.1:${{VAR:-port}}:port"
            assert match["default"] == match["target"], port
            seen.add(match["name"])
            # The script gives each one a free port, so nothing meets the machine's services.
            assert re.search(rf"\b{match['name']}=\$\(free_port\)", script), port
    assert seen == {"CB_AMQP_PORT", "CB_MANAGEMENT_PORT", "CB_POSTGRES_PORT"}


def test_environment_is_made_of_real_settings(compose: dict[str, Any]) -> None:
    env = compose["x-coldbrew-env"]
    fields = set(Settings.model_fields)
    for key, value in env.items():
        assert key.startswith("COLDBREW_"), key
        assert key.removeprefix("COLDBREW_").lower() in fields, f"{key} is not a setting"
        assert isinstance(value, str), f"{key}: compose needs strings, got {value!r}"
    for name in ("migrate", "worker"):
        assert compose["services"][name]["environment"] == env


def test_workers_outlast_their_drain(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    grace = float(compose["x-coldbrew-env"]["COLDBREW_SHUTDOWN_GRACE_SECONDS"])
    assert worker["stop_signal"] == "SIGTERM"
    assert float(worker["stop_grace_period"].removesuffix("s")) > grace
    # podman-compose honours replicas only with the mode written out.
    assert worker["deploy"]["mode"] == "replicated"
    assert worker["deploy"]["replicas"] >= 2


def test_mounted_files_exist(compose: dict[str, Any]) -> None:
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).is_file(), volume


def test_the_local_python_base_stands_in_for_the_dockerfiles(script: str) -> None:
    """The Dockerfile keeps the official base; the script makes that very name locally."""
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    froms = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert froms == ["python:3.11-slim"]
    assert "PYTHON_BASE=docker.io/library/python:3.11-slim\n" in script
    assert 'local_image "$PYTHON_BASE" deploy/local/python.Containerfile' in script
    for recipe in ("python", "rabbitmq", "postgres"):
        text = (DEPLOY / "local" / f"{recipe}.Containerfile").read_text(encoding="utf-8")
        assert "FROM localhost/coldbrew-debian:bookworm\n" in text, recipe
    assert "DEBIAN_BASE=localhost/coldbrew-debian:bookworm\n" in script


CLUSTER_COMPOSE = DEPLOY / "cluster" / "compose.yaml"
CLUSTER_CONF = DEPLOY / "cluster" / "rabbitmq-cluster.conf"


def test_cluster_compose_nodes_and_urls_agree() -> None:
    """deploy/cluster: the peer-discovery list names exactly the three nodes' hostnames, the
    workers list every node, and their settings are real ones (quorum mode included)."""
    compose = yaml.safe_load(CLUSTER_COMPOSE.read_text(encoding="utf-8"))
    services = compose["services"]
    nodes = {name: svc for name, svc in services.items() if name.startswith("rabbitmq")}
    hostnames = sorted(svc["hostname"] for svc in nodes.values())
    assert hostnames == ["rabbitmq1", "rabbitmq2", "rabbitmq3"]
    listed = sorted(
        line.split("=", 1)[1].strip().removeprefix("rabbit@")
        for line in CLUSTER_CONF.read_text(encoding="utf-8").splitlines()
        if line.startswith("cluster_formation.classic_config.nodes.")
    )
    assert listed == hostnames
    cookies = {svc["environment"]["RABBITMQ_ERLANG_COOKIE"] for svc in nodes.values()}
    assert len(cookies) == 1, "the nodes of one cluster must share one cookie"
    env = services["worker"]["environment"]
    urls = env["COLDBREW_AMQP_URL"].split(",")
    assert sorted(url.split("@", 1)[1].split(":", 1)[0] for url in urls) == hostnames
    assert env["COLDBREW_QUEUE_TYPE"] == "quorum"
    fields = {f"COLDBREW_{name.upper()}" for name in Settings.model_fields}
    unknown = sorted(set(env) - fields)
    assert not unknown, f"not settings: {unknown}"
    for svc in nodes.values():
        for volume in svc["volumes"]:
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (CLUSTER_COMPOSE.parent / source).resolve().exists(), source
    assert services["worker"]["deploy"]["replicas"] == 3
