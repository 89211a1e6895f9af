"""rabbitmq/definitions.json and rabbitmq/rabbitmq.conf agree with the code that relies on them.

Only the files are checked: the local broker is shared, so nothing is applied to it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from coldbrew.app import load_app
from coldbrew.model import routing_key
from coldbrew.settings import Settings
from coldbrew.topology import Topology

RABBITMQ_DIR = Path(__file__).resolve().parents[2] / "rabbitmq"
DEFINITIONS = RABBITMQ_DIR / "definitions.json"
CONF = RABBITMQ_DIR / "rabbitmq.conf"

TOPOLOGY = Topology("coldbrew")
VHOST = "/"
# The longest job timeout we document (DESIGN §1: the slow lane's transcode) and
# how late the broker may evaluate consumer_timeout (its channel tick, SEMANTICS §1).
LONGEST_JOB_TIMEOUT_SECONDS = 1800
CHANNEL_TICK_SECONDS = 60
# 3.10's schema accepts max_message_size up to 512 MiB.
MAX_MESSAGE_SIZE_LIMIT = 512 * 1024 * 1024

_LINE_RE = re.compile(r"^(?P<key>[a-z][a-z0-9_.\-]*)\s*=\s*(?P<value>\S(?:.*\S)?)$")


@pytest.fixture(scope="module")
def definitions() -> dict[str, Any]:
    return json.loads(DEFINITIONS.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def conf() -> dict[str, str]:
    return parse_conf(CONF.read_text(encoding="utf-8"))


def parse_conf(text: str) -> dict[str, str]:
    """Parse rabbitmq.conf's sysctl format strictly: comments, blank lines or `key = value`."""
    settings: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE_RE.match(line)
        if match is None:
            raise ValueError(f"rabbitmq.conf line {number} is not `key = value`: {raw!r}")
        key, value = match["key"], match["value"]
        if "#" in value:
            raise ValueError(f"rabbitmq.conf line {number}: no trailing comments: {raw!r}")
        if key in settings:
            raise ValueError(f"rabbitmq.conf line {number}: {key} is set twice")
        settings[key] = value
    return settings


def _expected_exchanges() -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        TOPOLOGY.jobs_exchange: ("topic", TOPOLOGY.jobs_exchange_arguments()),
        TOPOLOGY.unrouted_exchange: ("fanout", {}),
        TOPOLOGY.dead_exchange: ("fanout", {}),
    }


def _expected_queues() -> dict[str, dict[str, Any]]:
    return {
        TOPOLOGY.unrouted_queue: TOPOLOGY.unrouted_queue_arguments(),
        TOPOLOGY.dead_queue: TOPOLOGY.dead_queue_arguments(),
        TOPOLOGY.job_queue("default", "default"): TOPOLOGY.job_queue_arguments(),
    }


def _expected_bindings() -> set[tuple[str, str, str, str]]:
    return {
        (TOPOLOGY.unrouted_exchange, TOPOLOGY.unrouted_queue, "queue", "#"),
        (TOPOLOGY.dead_exchange, TOPOLOGY.dead_queue, "queue", "#"),
        (
            TOPOLOGY.jobs_exchange,
            TOPOLOGY.job_queue("default", "default"),
            "queue",
            routing_key("default", "default"),
        ),
    }


# --- definitions.json ---------------------------------------------------------------


def test_definitions_hold_only_topology(definitions: dict[str, Any]) -> None:
    """The file holds vhost, exchanges, queues and bindings only: no users or policies."""
    assert set(definitions) <= {"vhosts", "exchanges", "queues", "bindings"}
    assert definitions.get("vhosts", [{"name": VHOST}]) == [{"name": VHOST}]
    assert "password" not in DEFINITIONS.read_text(encoding="utf-8")


def test_exchanges_match_topology(definitions: dict[str, Any]) -> None:
    """Every exchange Topology names is there with its type and arguments, and nothing else."""
    found = {
        item["name"]: (item["type"], item.get("arguments", {})) for item in definitions["exchanges"]
    }
    assert len(found) == len(definitions["exchanges"]), "an exchange is listed twice"
    assert found == _expected_exchanges()


@pytest.mark.parametrize("section", ["exchanges", "queues"])
def test_entities_are_durable_in_the_default_vhost(
    definitions: dict[str, Any], section: str
) -> None:
    """Exchanges and queues are durable and plain in vhost `/`, as `declare.py` has them."""
    for item in definitions[section]:
        assert item["vhost"] == VHOST, item["name"]
        assert item["durable"] is True, item["name"]
        assert item["auto_delete"] is False, item["name"]
        assert item.get("internal", False) is False, item["name"]
        assert "exclusive" not in item, item["name"]


def test_queues_match_topology(definitions: dict[str, Any]) -> None:
    """Every queue has exactly the arguments Topology returns, so a redeclare is not refused."""
    found = {item["name"]: item["arguments"] for item in definitions["queues"]}
    assert len(found) == len(definitions["queues"]), "a queue is listed twice"
    assert found == _expected_queues()


def test_job_queue_argument_types_survive_json(definitions: dict[str, Any]) -> None:
    """x-max-priority is a JSON integer: a float or string would differ from the declare."""
    (job_queue,) = (
        item
        for item in definitions["queues"]
        if item["name"] == TOPOLOGY.job_queue("default", "default")
    )
    assert type(job_queue["arguments"]["x-max-priority"]) is int


def test_bindings_match_topology(definitions: dict[str, Any]) -> None:
    """The three bindings are there with their routing keys, in vhost `/`, and nothing else."""
    found = [
        (item["source"], item["destination"], item["destination_type"], item["routing_key"])
        for item in definitions["bindings"]
    ]
    assert len(set(found)) == len(found), "a binding is listed twice"
    assert set(found) == _expected_bindings()
    for item in definitions["bindings"]:
        assert item["vhost"] == VHOST
        assert item.get("arguments", {}) == {}


def test_bindings_only_name_declared_entities(definitions: dict[str, Any]) -> None:
    """Each binding's source is a declared exchange and its destination a declared queue."""
    exchanges = {item["name"] for item in definitions["exchanges"]}
    queues = {item["name"] for item in definitions["queues"]}
    for item in definitions["bindings"]:
        assert item["source"] in exchanges
        assert item["destination"] in queues


def test_alternate_exchange_is_declared(definitions: dict[str, Any]) -> None:
    """The jobs exchange's alternate exchange is declared too, so new tenants' jobs are kept."""
    exchanges = {item["name"]: item for item in definitions["exchanges"]}
    alternate = exchanges[TOPOLOGY.jobs_exchange]["arguments"]["alternate-exchange"]
    assert alternate in exchanges


# --- rabbitmq.conf ------------------------------------------------------------------


def test_conf_lines_all_parse() -> None:
    """Every line of rabbitmq.conf is a comment, blank, or a single `key = value`."""
    settings = parse_conf(CONF.read_text(encoding="utf-8"))
    assert settings


def test_parse_conf_rejects_malformed_lines() -> None:
    """The strict parser refuses a bare word, a trailing comment and a key set twice."""
    with pytest.raises(ValueError, match="not `key = value`"):
        parse_conf("consumer_timeout\n")
    with pytest.raises(ValueError, match="trailing comments"):
        parse_conf("consumer_timeout = 1 # ms\n")
    with pytest.raises(ValueError, match="set twice"):
        parse_conf("heartbeat = 60\nheartbeat = 30\n")


def test_consumer_timeout_outlasts_the_longest_job(conf: dict[str, str]) -> None:
    """consumer_timeout (ms) exceeds the longest documented job timeout plus the 60 s tick."""
    timeout_ms = int(conf["consumer_timeout"])
    assert timeout_ms > (LONGEST_JOB_TIMEOUT_SECONDS + CHANNEL_TICK_SECONDS) * 1000


def test_max_message_size_leaves_room_for_coldbrews_own_limit(conf: dict[str, str]) -> None:
    """The broker accepts bodies over COLDBREW_MAX_BODY_BYTES, so the worker dead-letters them."""
    size = int(conf["max_message_size"])
    default_limit = Settings.model_fields["max_body_bytes"].default
    assert default_limit < size <= MAX_MESSAGE_SIZE_LIMIT


def test_resource_alarm_values_are_well_formed(conf: dict[str, str]) -> None:
    """The memory watermark is a fraction of RAM and the disk limit a size with a unit."""
    assert 0.0 < float(conf["vm_memory_high_watermark.relative"]) < 1.0
    assert re.fullmatch(r"\d+(kB|MB|GB|KiB|MiB|GiB)?", conf["disk_free_limit.absolute"])


def test_conf_respects_the_deployment(conf: dict[str, str]) -> None:
    """No load_definitions (the node would skip its default user) and no loopback-only listener."""
    assert "load_definitions" not in conf
    assert "management.load_definitions" not in conf
    for key, value in conf.items():
        if key.startswith("listeners."):
            assert not value.startswith("127.0.0.1"), key


def test_quorum_leaders_are_balanced_by_the_node_not_by_a_queue_argument(
    conf: dict[str, str],
) -> None:
    """Leaders spread over the nodes (3.10's schema maps queue_leader_locator), never per queue:
    an x-queue-leader-locator argument would make re-declaring existing quorum queues fail."""
    assert conf["queue_leader_locator"] == "balanced"
    quorum = TOPOLOGY.other("quorum")
    for arguments in (
        quorum.job_queue_arguments(),
        quorum.unrouted_queue_arguments(),
        quorum.dead_queue_arguments(),
    ):
        assert "x-queue-leader-locator" not in arguments


def test_conf_names_the_definitions_file() -> None:
    """The comments show the load_definitions line an operator would use, left unset."""
    text = CONF.read_text(encoding="utf-8")
    assert "load_definitions = /etc/rabbitmq/definitions.json" in text


@pytest.mark.parametrize("ref", ["coldbrew.examples.demo:app", "tests.apps:app"])
def test_shipped_apps_stay_within_the_documented_job_timeout(ref: str) -> None:
    """No job we ship declares a timeout above the one consumer_timeout was sized for."""
    app = load_app(ref)
    for spec in app.jobs.values():
        if spec.timeout is not None:
            assert spec.timeout <= LONGEST_JOB_TIMEOUT_SECONDS, spec.name
