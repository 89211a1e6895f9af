"""The `coldbrew` command as a user runs it: a subprocess, its exit code, stdout and stderr."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.helpers import free_port, make_settings, new_namespace, wait_until, worker_env

ROOT = Path(__file__).resolve().parents[2]
STATUS_KEYS = {
    "id",
    "type",
    "queue",
    "tenant",
    "status",
    "priority",
    "attempt",
    "max_attempts",
    "progress",
    "progress_message",
    "result",
    "error",
    "created_at",
    "started_at",
    "finished_at",
    "run_at",
    "cancel_requested",
    "snoozes",
    "batch_id",
    "parent_id",  # flow (issue #16)
    "chain_id",
    "chain_step",
    "children",
}


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    """A subprocess environment for ``settings`` in which ``tests.apps`` imports."""
    env = worker_env(settings, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_cli_sync(
    env: dict[str, str], *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coldbrew", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def run_cli(
    env: dict[str, str], *args: str, limit: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m coldbrew ARGS`` to completion (in a thread, so the loop stays free)."""
    return await asyncio.to_thread(run_cli_sync, env, *args, timeout=limit)


def http_get(port: int, path: str) -> tuple[int, str] | None:
    """(status, body) of a GET on the worker's metrics port, or None if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


async def get(port: int, path: str) -> tuple[int, str] | None:
    return await asyncio.to_thread(http_get, port, path)


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def spawn_worker(settings: Settings, log: Path, **extra: str) -> WorkerProcess:
    """Start `coldbrew worker tests.apps:app` on a free metrics port, output to ``log``."""
    port = free_port()
    env = cli_env(settings, COLDBREW_METRICS_PORT=str(port), **extra)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "coldbrew", "worker", "tests.apps:app"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return WorkerProcess(proc, port, log)


async def start_worker_process(
    settings: Settings, log: Path, *, within: float = 30.0, **extra: str
) -> WorkerProcess:
    """Start a worker subprocess and wait until its /readyz answers 200."""
    worker = spawn_worker(settings, log, **extra)
    proc, port = worker.proc, worker.port
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        answer = await get(port, "/readyz")
        if answer is not None and answer[0] == 200:
            return worker
        if proc.poll() is not None:
            raise AssertionError(f"worker exited with {proc.returncode}: {worker.output()}")
        if loop.time() > deadline:
            stop_process(proc)
            raise AssertionError(f"worker not ready within {within} s: {worker.output()}")
        await asyncio.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Kill a leftover subprocess and reap it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


async def terminate(worker: WorkerProcess, within: float = 30.0) -> int:
    """SIGTERM the worker and return its exit code."""
    worker.proc.send_signal(signal.SIGTERM)
    return await asyncio.to_thread(worker.proc.wait, within)


@pytest.fixture
async def worker(settings: Settings, tmp_path: Path) -> AsyncIterator[WorkerProcess]:
    running = await start_worker_process(settings, tmp_path / "worker.log")
    try:
        yield running
        code = await terminate(running)
        assert code == 0, running.output()
    finally:
        stop_process(running.proc)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# --- without a worker -------------------------------------------------------------------


async def test_help_exits_zero() -> None:
    """`python -m coldbrew --help` prints usage and exits 0."""
    done = await run_cli(dict(os.environ), "--help", limit=30)
    assert done.returncode == 0, done.stderr
    assert "usage: coldbrew" in done.stdout


async def test_migrate_twice(namespace: str) -> None:
    """`coldbrew migrate` on a fresh namespace applies the schema, and a second run is a no-op."""
    env = cli_env(make_settings(namespace))
    first = await run_cli(env, "migrate")
    assert first.returncode == 0, first.stderr
    assert "applied" in first.stdout
    second = await run_cli(env, "migrate")
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("COLDBREW_CONCURRENCY", "-1"),
        ("COLDBREW_LEASE_SECONDS", "abc"),
        ("COLDBREW_NAMESPACE", "Bad-NS"),
    ],
)
async def test_invalid_environment_is_a_usage_error(variable: str, value: str) -> None:
    """An invalid setting exits 2 with one stderr line that names the variable."""
    env = cli_env(make_settings(new_namespace()), **{variable: value})
    done = await run_cli(env, "status", "x")
    assert done.returncode == 2, done.stderr
    assert variable in one_line(done.stderr)


async def test_unreachable_broker_exits_3_with_masked_url(settings: Settings) -> None:
    """A broker that cannot be reached exits 3 and names its URL with the password masked."""
    env = cli_env(settings, COLDBREW_AMQP_URL="amqp://guest:s3cret@127.0.0.1:1/")
    done = await run_cli(env, "submit", "echo", "--args", '{"value": 1}')
    assert done.returncode == 3, done.stderr
    assert "s3cret" not in done.stderr + done.stdout
    line = one_line(done.stderr)
    assert "amqp://guest:***@127.0.0.1:1/" in line


async def test_unreachable_database_exits_3_with_masked_url(settings: Settings) -> None:
    """A database that cannot be reached exits 3 and names its URL with the password masked."""
    env = cli_env(settings, COLDBREW_DATABASE_URL="postgresql://root:s3cret@127.0.0.1:1/x")
    done = await run_cli(env, "status", "x")
    assert done.returncode == 3, done.stderr
    assert "s3cret" not in done.stderr + done.stdout
    assert "postgresql://root:***@127.0.0.1:1/x" in one_line(done.stderr)


async def test_submit_prints_status_json(settings: Settings) -> None:
    """`submit` prints the job's status JSON with exactly the contract's keys, status queued."""
    env = cli_env(settings)
    done = await run_cli(env, "submit", "echo", "--args", '{"value": 1}', "--tenant", "acme")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert set(status) == STATUS_KEYS
    assert status["status"] == "queued"
    assert (status["type"], status["tenant"], status["queue"]) == ("echo", "acme", "default")
    assert status["attempt"] == 0


@pytest.mark.parametrize(
    "flags",
    [
        ["--args", "not json"],
        ["--args", "[1]"],
        ["--args", "{}", "--priority", "12"],
    ],
    ids=["not-json", "not-object", "priority-12"],
)
async def test_submit_rejects_bad_input(settings: Settings, flags: list[str]) -> None:
    """`submit` with args that are not a JSON object, or a priority out of range, exits 2."""
    done = await run_cli(cli_env(settings), "submit", "echo", *flags)
    assert done.returncode == 2, done.stderr
    one_line(done.stderr)
    assert done.stdout == ""


async def test_worker_with_unknown_module_exits_2(settings: Settings) -> None:
    """`coldbrew worker` with an app that cannot be imported exits 2 with one line."""
    done = await run_cli(cli_env(settings), "worker", "nosuch.module:app", limit=30)
    assert done.returncode == 2, done.stderr
    assert "nosuch.module" in one_line(done.stderr)


async def test_worker_on_unmigrated_namespace_exits_2(namespace: str) -> None:
    """`coldbrew worker` on a namespace without the schema exits 2 and says to run migrate."""
    env = cli_env(make_settings(namespace))
    done = await run_cli(env, "worker", "tests.apps:app", limit=30)
    assert done.returncode == 2, done.stderr
    assert "coldbrew migrate" in done.stderr
    assert "Traceback" not in done.stderr


# --- with a worker ----------------------------------------------------------------------


async def test_submit_wait_status_and_metrics(settings: Settings, worker: WorkerProcess) -> None:
    """`submit --wait` exits 0 or 1 by outcome, `status` prints JSON, the worker serves metrics."""
    env = cli_env(settings)
    ok, failed, missing = await asyncio.gather(
        run_cli(env, "submit", "echo", "--args", '{"value":1}', "--wait", "--timeout", "30"),
        run_cli(env, "submit", "permanent", "--wait", "--timeout", "30"),
        run_cli(env, "status", "nope"),
    )
    assert ok.returncode == 0, ok.stderr
    succeeded = json.loads(ok.stdout)
    assert succeeded["status"] == "succeeded"
    assert succeeded["result"] == {"value": 1, "attempt": 1, "tenant": "default"}

    assert failed.returncode == 1, failed.stderr
    assert json.loads(failed.stdout)["status"] == "failed"

    assert missing.returncode == 1, missing.stderr
    assert "no job" in one_line(missing.stderr)

    shown = await run_cli(env, "status", succeeded["id"])
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert set(status) == STATUS_KEYS
    assert (status["id"], status["status"]) == (succeeded["id"], "succeeded")

    metrics = await get(worker.port, "/metrics")
    assert metrics is not None
    assert metrics[0] == 200
    assert "coldbrew_jobs_started_total" in metrics[1]
    health = await get(worker.port, "/healthz")
    assert health is not None
    assert health[0] == 200


async def test_cancel(settings: Settings, worker: WorkerProcess) -> None:
    """`cancel` stops a running job (exit 0, ends cancelled) and exits 1 for a finished one."""
    env = cli_env(settings)
    long = await run_cli(env, "submit", "sleep_for", "--args", '{"seconds": 30}')
    short = await run_cli(env, "submit", "echo", "--args", "{}", "--wait", "--timeout", "30")
    assert long.returncode == 0, long.stderr
    assert short.returncode == 0, short.stderr
    long_id, short_id = json.loads(long.stdout)["id"], json.loads(short.stdout)["id"]

    async with Client.connect(settings, broker=False) as client:

        async def status_is(job_id: str, wanted: str) -> bool:
            return (await client.get(job_id)).status.value == wanted

        await wait_until(lambda: status_is(long_id, "running"), timeout=20)
        cancelled = await run_cli(env, "cancel", long_id, "--reason", "test")
        assert cancelled.returncode == 0, cancelled.stderr
        assert json.loads(cancelled.stdout)["cancel_requested"] is True
        await wait_until(lambda: status_is(long_id, "cancelled"), timeout=15)

    again = await run_cli(env, "cancel", short_id)
    assert again.returncode == 1, again.stderr
    assert again.stdout == ""
    assert one_line(again.stderr) == (
        f"coldbrew: job {short_id} is already succeeded; nothing to cancel"
    )


async def test_stats(settings: Settings, worker: WorkerProcess) -> None:
    """`stats` prints a table with a row per lane and tenant (what waits beside what finished
    in the window), and `stats --json` a JSON list."""
    env = cli_env(settings)
    failed = await run_cli(env, "submit", "permanent", "--tenant", "acme", "--wait")
    assert failed.returncode == 1, failed.stderr

    table, as_json = await asyncio.gather(run_cli(env, "stats"), run_cli(env, "stats", "--json"))
    assert table.returncode == 0, table.stderr
    title, header, *rows = table.stdout.strip().splitlines()
    assert "finished in the last 1h" in title
    assert header.split()[:3] == ["queue", "tenant", "queued"]
    assert header.split()[-4:] == ["run", "p50", "run", "p95"]
    assert any(row.split()[:2] == ["default", "acme"] for row in rows), table.stdout

    assert as_json.returncode == 0, as_json.stderr
    parsed = json.loads(as_json.stdout)
    assert isinstance(parsed, list)
    acme = [row for row in parsed if (row["queue"], row["tenant"]) == ("default", "acme")]
    assert len(acme) == 1, parsed
    assert acme[0]["failed"] == 1, parsed
    assert acme[0]["finished"] == 1 and acme[0]["depth"] == 0, parsed
    assert acme[0]["drain_rate_per_second"] == 0.0 and acme[0]["estimated_wait_seconds"] == 0.0
    assert acme[0]["window"]["failed"] == 1 and acme[0]["window"]["succeeded"] == 0, parsed


def test_tenants_commands(settings: Settings) -> None:
    """`tenants set/pause/resume/list` record settings; bad names and weights exit 2."""
    env = cli_env(settings)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return run_cli_sync(env, "tenants", *argv)

    assert run("set", "acme", "--weight", "3").returncode == 0
    assert run("pause", "acme").returncode == 0
    listed = run("list", "--json")
    assert listed.returncode == 0
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["weight"], r["paused"]) for r in rows] == [("acme", 3.0, True)]
    assert run("resume", "acme").returncode == 0
    assert "active" in run("list").stdout
    bad_name = run("set", "Not OK!")
    assert bad_name.returncode == 2 and "tenant name" in bad_name.stderr
    bad_weight = run("set", "acme", "--weight", "0")
    assert bad_weight.returncode == 2 and "--weight" in bad_weight.stderr
    # caps: set, shown, removed; an unknown tenant is created; bad caps exit 2
    assert run("set", "newcomer", "--max-running", "3").returncode == 0
    rows = json.loads(run("list", "--json").stdout)
    assert {r["name"]: r["max_running"] for r in rows} == {"acme": None, "newcomer": 3}
    assert "max running 3" in run("list").stdout
    assert run("set", "newcomer", "--max-running", "none").returncode == 0
    rows = json.loads(run("list", "--json").stdout)
    assert {r["name"]: r["max_running"] for r in rows}["newcomer"] is None
    for bad in ("-1", "three", "2.5"):
        refused = run("set", "acme", "--max-running", bad)
        assert refused.returncode == 2 and "--max-running" in refused.stderr, bad


def test_types_commands(settings: Settings) -> None:
    """`types set TYPE --max-running N|none` and `types list`; bad values exit 2."""
    env = cli_env(settings)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return run_cli_sync(env, "types", *argv)

    assert "no job type has a cap" in run("list").stdout  # nor any registered by a worker
    assert run("set", "transcode", "--max-running", "4").returncode == 0
    rows = json.loads(run("list", "--json").stdout)
    assert [(r["name"], r["max_running"]) for r in rows] == [("transcode", 4)]
    assert run("set", "transcode", "--max-running", "none").returncode == 0
    assert "no cap" in run("list").stdout
    refused = run("set", "transcode", "--max-running", "-5")
    assert refused.returncode == 2 and "--max-running" in refused.stderr
    bad_name = run("set", "no spaces", "--max-running", "1")
    assert bad_name.returncode == 2 and "job type" in bad_name.stderr
